from __future__ import annotations

from meshkit.text.extractive import best_facts
from services.narrator.extractive import extractive_answer
from services.narrator.model import Fact, Mode
from services.narrator.tests.fakes import FACTS


def test_best_facts_prefers_distinct_sources_then_score() -> None:
    assert best_facts(FACTS, 3) == [FACTS[0], FACTS[2], FACTS[3]]
    assert best_facts(FACTS, 4) == [FACTS[0], FACTS[1], FACTS[2], FACTS[3]]
    assert best_facts(FACTS, 1) == [FACTS[0]]


def test_best_facts_fills_from_repeated_sources_and_skips_repeated_text() -> None:
    facts = [Fact("A is b.", 1, 0.9), Fact("a is  B.", 2, 0.8), Fact("C is d.", 1, 0.7)]
    assert best_facts(facts, 3) == [facts[0], facts[2]]


def test_extractive_answer_cites_every_sentence() -> None:
    answer = extractive_answer(FACTS, 2)
    assert answer.text == (
        "The Eiffel Tower is 330 metres tall [1]. The Eiffel Tower stands in Paris on the Champ de Mars [2]."
    )
    assert [s.sources for s in answer.sentences] == [(1,), (2,)]
    assert answer.cited == [1, 2]
    assert answer.answered and answer.mode is Mode.EXTRACTIVE and answer.degraded_reason == ""


def test_markers_inside_facts_are_replaced_by_the_fact_source() -> None:
    answer = extractive_answer([Fact("Height is 330 m, see [12]", 2, 1.0)], 3)
    assert answer.text == "Height is 330 m, see [2]."
    assert answer.sentences[0].sources == (2,)
