"""How often a question holds a word that no document of its corpus contains: the signal sparse
returns as ``unknown_terms`` and the evidence gate weighs (docs/BENCHMARKS.md, "Words no document
holds, in the evidence gate"). Offline, over the corpus files, with sparse's own analysis.

    .venv/bin/python -m bench.unknown_words

A word counts as unknown as in ``services.sparse.collection.Collection.unknown_words``: one of
its stems is in no document (numbers aside). The grpc-docs pages are read raw, front matter
included, so a word only there counts as known (the index keeps it in the title or drops it).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from bench import qa
from meshkit.text.answering import content_word_list
from ragmesh_cli.datasets import load_dataset
from ragmesh_cli.documents import WalkStats, read_corpus
from services.sparse.schema import query_terms

SCIFACT = Path("../shared/bench/scifact")
THRESHOLDS = (0.01, 0.2)


def vocabulary(texts: Iterable[str]) -> set[str]:
    terms: set[str] = set()
    for text in texts:
        terms.update(query_terms(text))
    return terms


def unknown_share(question: str, known: set[str]) -> float:
    words = content_word_list(question)
    unknown = [
        w for w in words if not w.isdigit() and any(t not in known for t in query_terms(w) if not t.isdigit())
    ]
    return len(unknown) / len(words) if words else 0.0


def row(name: str, questions: list[str], known: set[str]) -> dict[str, object]:
    shares = [unknown_share(q, known) for q in questions]
    return {
        "set": name,
        "questions": len(shares),
        **{f"share_unknown_ge_{t}": round(sum(s >= t for s in shares) / len(shares), 3) for t in THRESHOLDS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scifact", type=Path, default=SCIFACT)
    parser.add_argument("--grpc-docs", type=Path, default=qa.DEFAULT_GRPC_DOCS_ROOT)
    args = parser.parse_args()
    corpus = read_corpus(args.scifact / "corpus.jsonl.gz", WalkStats())
    scifact = vocabulary(f"{d.title} {d.content.decode('utf-8')}" for d in corpus)
    grpc = vocabulary(p.read_text() for p in (args.grpc_docs / qa.INGESTED_FOLDER).rglob("*.md"))
    rows = [
        row(f"scifact {split} claims", list(load_dataset(args.scifact, split).queries.values()), scifact)
        for split in ("train", "test")
    ]
    for split in qa.SPLITS:
        unanswerable = qa.load_scifact_unanswerable(split)
        rows.append(row(f"scifact unanswerable {split}", [i.question for i in unanswerable], scifact))
        items = qa.load_grpc_docs(split=split)
        for answerable in (True, False):
            chosen = [i.question for i in items if i.answerable == answerable]
            label = "answerable" if answerable else "unanswerable"
            rows.append(row(f"grpc-docs {label} {split}", chosen, grpc))
    for item in rows:
        print(json.dumps(item))


if __name__ == "__main__":
    main()
