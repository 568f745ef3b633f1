"""Real text for the degenerate-generation check (services/narrator/degenerate.py): the SciFact
abstracts and the grpc-docs Markdown pages of the shared corpora, split as the narrator splits
an answer (lines, then sentences: so code lines, table rows and list items come as written) and,
for the Markdown, also as evidence sentences. None of it loops; the check must pass all of it.

``python -m services.narrator.tests.corpus_sentences`` counts the check's false positives over
every sentence and every whole document (the whole-answer check); SCIFACT and GRPC_DOCS override
where the corpora are."""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from meshkit.text.evidence import evidence_sentences
from services.narrator.degenerate import find_repeat, repeats, words
from services.narrator.verify import answer_sentences

_SHARED = Path(__file__).resolve().parents[4] / "shared"
SCIFACT_DIR = Path(os.environ.get("SCIFACT", _SHARED / "bench" / "scifact"))
GRPC_DOCS_DIR = Path(os.environ.get("GRPC_DOCS", _SHARED / "corpora" / "grpc-docs"))


@dataclass(frozen=True)
class Document:
    corpus: str
    name: str
    text: str


def scifact_documents() -> Iterator[Document]:
    """Each abstract as its title, a blank line and its text (empty when the corpus is absent)."""
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        path = SCIFACT_DIR / name
        if path.is_file():
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8") as lines:
                for line in lines:
                    record = json.loads(line)
                    yield Document("scifact", record["_id"], f"{record['title']}\n\n{record['text']}")
            return


def grpc_documents() -> Iterator[Document]:
    """Each Markdown page as written (empty when the corpus is absent)."""
    if GRPC_DOCS_DIR.is_dir():
        for path in sorted(GRPC_DOCS_DIR.rglob("*.md")):
            yield Document("grpc-docs", str(path.relative_to(GRPC_DOCS_DIR)), path.read_text("utf-8"))


def documents() -> Iterator[Document]:
    yield from scifact_documents()
    yield from grpc_documents()


def sentences(document: Document) -> list[str]:
    """The document's sentences as an answer's would be split, and (Markdown) its evidence
    sentences: the lines of prose, lists, tables and code, and the prose made of them."""
    found = answer_sentences(document.text)
    if document.corpus == "grpc-docs":
        found += evidence_sentences(document.text)
    return found


def main() -> None:
    checked: dict[str, int] = {}
    fired: dict[str, list[str]] = {}
    whole: dict[str, list[str]] = {}
    for document in documents():
        for sentence in sentences(document):
            checked[document.corpus] = checked.get(document.corpus, 0) + 1
            hit = find_repeat(sentence)
            if hit is not None:
                fired.setdefault(document.corpus, []).append(f"{hit.describe()}: {sentence[:160]}")
        for hit in repeats(words(document.text)):
            whole.setdefault(document.corpus, []).append(f"{document.name}: {hit.describe()}")
    if not checked:
        sys.exit(f"no corpus found under {SCIFACT_DIR} or {GRPC_DOCS_DIR}")
    for corpus, count in checked.items():
        hits, wholes = fired.get(corpus, []), whole.get(corpus, [])
        print(f"{corpus}: {count} sentences, {len(hits)} fired; whole documents: {len(wholes)} fired")
        for line in hits + wholes:
            print(f"  {line}")


if __name__ == "__main__":
    main()
