from __future__ import annotations

from ragmesh.extractor.v1.extractor_pb2 import FactOrigin
from services.extractor import facts as F
from services.extractor.facts import Fact, Source, resolve_scores
from services.extractor.mapreduce import group_by_chars, read_entries
from services.extractor.selection import dedup, drop_to_fit, gate_keep


def fact(i: int, text: str, *, doc: str = "", score: float | None = None, origin: FactOrigin = F.LLM) -> Fact:
    source = Source(i, f"p{i}", doc or f"d{i}", "", text, float(-i) if score is None else score)
    return Fact(text, source, origin, source.score)


def facts(n: int) -> list[Fact]:
    return [fact(i, f"fact number {i}") for i in range(n)]


def test_missing_scores_follow_the_rank() -> None:
    assert resolve_scores([None, None, None, None]) == [1.0, 0.75, 0.5, 0.25]
    mixed = resolve_scores([3.0, None, 1.0, None])
    assert mixed[0] == 3.0 and mixed[2] == 1.0
    assert mixed[1] < 1.0 and mixed[3] < mixed[1]


def test_gate_keeps_all_when_none_passes() -> None:
    assert gate_keep(facts(5), set()) == facts(5)


def test_gate_keeps_the_best_four_when_one_of_more_than_three_passes() -> None:
    kept = gate_keep(facts(6), {5})
    assert [f.source.index for f in kept] == [0, 1, 2, 5]
    assert [f.source.index for f in gate_keep(facts(6), {1})] == [0, 1, 2, 3]


def test_gate_keeps_what_passes_otherwise() -> None:
    assert [f.source.index for f in gate_keep(facts(3), {2})] == [2]
    assert [f.source.index for f in gate_keep(facts(6), {1, 4})] == [1, 4]


def test_dedup_per_document_and_near_duplicates() -> None:
    items = [
        fact(0, "The tower is 330 metres tall.", doc="a", score=1.0),
        fact(1, "The tower was built in 1889.", doc="a", score=2.0),
        fact(2, "the tower is 330 metres tall!", doc="b", score=0.5),
        fact(3, "The tower is not 330 metres tall.", doc="c", score=0.1),
    ]
    kept = dedup(items, per_source=1, sentences_per_passage=2)
    assert [f.source.index for f in kept] == [1, 2, 3]
    assert len(dedup(items, per_source=2, sentences_per_passage=2)) == 3


def test_dedup_counts_extractive_sentences_per_passage() -> None:
    items = [fact(i, f"sentence {i}", doc="a", score=-i, origin=F.EXTRACTIVE) for i in range(5)]
    assert len(dedup(items, per_source=1, sentences_per_passage=2)) == 2
    assert len(dedup(items, per_source=2, sentences_per_passage=2)) == 4


def test_drop_to_fit_keeps_the_best_and_cuts_a_lone_giant() -> None:
    items = [fact(i, "x" * 40, score=-i) for i in range(5)]  # 10 tokens each
    assert [f.source.index for f in drop_to_fit(items, 25)] == [0, 1]
    (only,) = drop_to_fit([fact(0, "y" * 400)], 10)
    assert len(only.text) == 40


def test_group_by_chars() -> None:
    assert group_by_chars([10, 10, 10, 50, 10], 30, 10) == [[0, 1, 2], [3], [4]]
    assert group_by_chars([1] * 5, 100, 2) == [[0, 1], [2, 3], [4]]


def test_read_entries_bounds_a_runaway_list() -> None:
    raw = [{"passage": 1, "fact": "a"}] + [{"passage": 2, "fact": None}] * 50
    entries = read_entries(raw, numbers=2, batch=3)
    assert entries.facts == {1: "a"}
    assert entries.malformed == {2}
    assert len(entries.issues) == 4 and all(i.batch == 3 for i in entries.issues)
