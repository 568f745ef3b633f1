"""bench/exact_bench.py: the planner's keywords per claim, and the tiebreak comparison's report."""

from __future__ import annotations

from pathlib import Path

from bench.exact_bench import planned_keywords, tiebreak_rows
from services.sparse.collection import Collection
from services.sparse.exact import normalise_keywords
from services.sparse.records import ChunkRecord, DocumentUpdate


def test_only_claims_with_hard_keywords_are_planned() -> None:
    planned = planned_keywords(["IL-6 drives inflammation in TP53 mutant cells.", "sleep is good"])
    assert len(planned) == 1
    keywords, pool = planned[0]
    assert "il-6" in [k.needle for k in keywords] and pool > 0


def test_a_keyword_tying_more_chunks_than_the_bound_is_counted_both_ways(tmp_path: Path) -> None:
    collection = Collection(tmp_path, "bench", 16 * 1024 * 1024, 1.5)
    try:
        records = [
            ChunkRecord(f"{i:032x}", f"doc-{i}", "", "dna " * (1 + i // 50) + "and the rest")
            for i in range(300)
        ]
        collection.replace_documents([DocumentUpdate(r.doc_id, [r], []) for r in records])
        report = tiebreak_rows(collection, [(normalise_keywords(["dna"]), 10)])
    finally:
        collection.close()
    assert report["claims"] == 1 and report["tiebreak_chunks"] == 100
    # Unbounded, every chunk is counted and the last ones written (most occurrences) win;
    # bounded, only the first 100 in index order compete: the two pages differ.
    assert report["identical_pool"] == 0
    bounded = report["bounded_ms"]
    assert isinstance(bounded, dict) and set(bounded) == {"p50", "p90", "max", "mean"}
