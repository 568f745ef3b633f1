"""bench/answer_tune.py's fact figures: recall of rationale sentences among the facts, the share
of facts that are one, and facts per question."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from bench import answer_tune


@dataclass
class Chosen:
    passage: int
    text: str


@dataclass
class Choice:
    answered: bool
    answer: list[Chosen]
    facts: list[Chosen]


READ = [{"doc_id": "gold"}, {"doc_id": "other"}]
RATIONALE = "Vitamin D supplementation lowered hip fracture rates in older women."
QUESTIONS: list[dict[str, Any]] = [
    {
        "answerable": True,
        "gold": ["gold"],
        "rationales": [["gold", RATIONALE], ["gold", "Calcium intake did not change bone density."]],
        "facts": [Chosen(0, RATIONALE), Chosen(1, RATIONALE), Chosen(0, "The trial ran for five years.")],
    },
    {
        "answerable": True,
        "gold": ["gold"],
        "rationales": [],
        "facts": [Chosen(0, "Unrelated sentence here.")],
    },
]


def test_fact_figures_count_rationale_sentences_of_the_right_document(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def replay(item: dict[str, Any], *_: object) -> tuple[list[dict[str, Any]], Choice]:
        return READ, Choice(True, [Chosen(0, RATIONALE)], item["facts"])

    monkeypatch.setattr(answer_tune, "replay", replay)
    figures = answer_tune.evaluate([QUESTIONS], rules=None, floor=0.0, passages=5, max_pairs=10)  # type: ignore[arg-type]
    # One of the two rationale sentences is among the facts; the same text from another
    # document is not a rationale fact.
    assert figures["rationale_recall"] == pytest.approx(0.5)
    # Facts of the questions with rationales only: 1 of 3 is a rationale sentence of its document.
    assert figures["fact_precision"] == pytest.approx(1 / 3)
    assert figures["facts_per_question"] == pytest.approx(3)
    assert "fact prec 0.333" in answer_tune._fact_figures(figures)
    assert answer_tune._fact_figures({**figures, "rationale_recall": float("nan")}) == ""
