"""Where the gold documents sit in cached searches (bench/answer_tune.py collect): for each k, the
share of questions with a gold document among their k best documents, and the share of those
k documents that are gold. An answer citing its k best documents can cite a gold one no more
often than the first, at about the second's precision: the bound on "gold cited" that the
ranking sets (docs/BENCHMARKS.md, "What the signals cannot reach").

    .venv/bin/python -m bench.gold_ranks scifact-test-s23
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from bench.answer_tune import _load

DEPTHS = (1, 2, 3, 6, 10)


def ranked_documents(item: dict[str, Any]) -> list[str]:
    """The question's result documents, best first, each once (chunks collapse to their doc)."""
    return list(dict.fromkeys(r["doc_id"] for r in item["results"]))


def gold_ranks(questions: Sequence[dict[str, Any]], depths: Sequence[int] = DEPTHS) -> list[dict[str, float]]:
    """Per depth k: ``hit`` (share of answerable questions with a gold document in the first k)
    and ``precision`` (share of all those first-k documents that are gold)."""
    answerable = [q for q in questions if q["answerable"] and q["gold"]]
    if not answerable:
        return []
    rows = []
    for k in depths:
        firsts = [(ranked_documents(q)[:k], set(q["gold"])) for q in answerable]
        shown = sum(len(docs) for docs, _ in firsts)
        found = sum(len(gold.intersection(docs)) for docs, gold in firsts)
        hit = sum(bool(gold.intersection(docs)) for docs, gold in firsts) / len(firsts)
        rows.append({"k": k, "hit": hit, "precision": found / shown if shown else 0.0})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache", help="a cached set's name under .cache/answer_tune (no .json)")
    args = parser.parse_args()
    for row in gold_ranks(_load(args.cache)):
        print(f"k {row['k']:>2}: a gold document among the first k {row['hit']:.3f}, ", end="")
        print(f"share of them gold {row['precision']:.3f}")


if __name__ == "__main__":
    main()
