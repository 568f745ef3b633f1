"""bench/gold_ranks.py: where the gold documents sit in a cached search."""

from __future__ import annotations

import pytest

from bench.gold_ranks import gold_ranks, ranked_documents


def question(docs: list[str], gold: list[str], answerable: bool = True) -> dict[str, object]:
    return {"answerable": answerable, "gold": gold, "results": [{"doc_id": d} for d in docs]}


def test_chunks_collapse_to_their_documents_in_rank_order() -> None:
    assert ranked_documents(question(["a", "a", "b", "a", "c"], [])) == ["a", "b", "c"]


def test_hit_and_precision_per_depth() -> None:
    questions = [
        question(["g1", "x"], ["g1"]),  # gold first, only 2 documents
        question(["x", "x", "g2", "y"], ["g2"]),  # gold second once chunks collapse
        question(["x", "y", "z"], ["g3"]),  # gold not found
        question(["g4"], [], answerable=False),  # unanswerable: not counted
    ]
    rows = {r["k"]: r for r in gold_ranks(questions, depths=(1, 2, 3))}
    assert rows[1]["hit"] == pytest.approx(1 / 3) and rows[1]["precision"] == pytest.approx(1 / 3)
    assert rows[2]["hit"] == pytest.approx(2 / 3) and rows[2]["precision"] == pytest.approx(2 / 6)
    # The first question has only 2 documents: 8 shown at depth 3, 2 of them gold.
    assert rows[3]["hit"] == pytest.approx(2 / 3) and rows[3]["precision"] == pytest.approx(2 / 8)


def test_a_set_without_gold_documents_has_no_rows() -> None:
    assert gold_ranks([question(["a"], [], answerable=False)]) == []
