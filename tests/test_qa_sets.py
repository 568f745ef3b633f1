"""The committed question sets (bench/qa) are well formed, big enough, and match the corpus:
every gold page exists and carries the doc id that ``ragmesh ingest`` gives it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench import qa
from bench.qa import QAItem, QASetError
from ragmesh_cli import documents
from services.ingestion.normalize import detect_format

CORPUS = qa.DEFAULT_GRPC_DOCS_ROOT
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason="the grpc-docs corpus is not checked out")


def counts(items: list[QAItem]) -> Counter[tuple[str, bool]]:
    return Counter((item.split, item.answerable) for item in items)


def test_grpc_docs_set_sizes() -> None:
    found = counts(qa.load_grpc_docs(corpus_root=None))
    assert found[("test", True)] >= 40 and found[("test", False)] >= 15
    assert found[("tune", True)] >= 15 and found[("tune", False)] >= 10


def test_scifact_unanswerable_sizes() -> None:
    found = counts(qa.load_scifact_unanswerable())
    assert found == Counter(
        {("test", False): found[("test", False)], ("tune", False): found[("tune", False)]}
    )
    assert found[("test", False)] >= 40 and found[("tune", False)] >= 20


def test_ids_are_unique_across_both_files() -> None:
    items = qa.load_grpc_docs(corpus_root=None) + qa.load_scifact_unanswerable()
    assert len({item.id for item in items}) == len(items)


@needs_corpus
def test_gold_pages_exist_and_carry_the_ids_ingest_assigns() -> None:
    items = qa.load_grpc_docs(corpus_root=CORPUS)
    # The ids the CLI's own walk gives the corpus folder, as `ragmesh ingest <root>/docs` sends them.
    stats = documents.WalkStats()
    ingested = {
        doc.doc_id for doc in documents.iter_documents([CORPUS / "docs"], detect_format, stats, print)
    }
    assert len(ingested) == 110
    gold = {doc_id for item in items for doc_id in item.gold_doc_ids}
    assert gold <= ingested
    # Questions are spread over many pages, not a few.
    assert len({item.gold_path for item in items if item.answerable and item.split == "test"}) >= 25


@needs_corpus
def test_unanswerable_near_misses_name_nothing_the_corpus_has() -> None:
    """Spot checks that the near-miss questions ask for what no page mentions."""
    text = "\n".join(p.read_text(encoding="utf-8").lower() for p in (CORPUS / "docs").rglob("*.md"))
    for absent in ("istio", "grpc-gateway", "ghz", "jest", "spring boot", "websocket", "elixir", "http/3"):
        assert absent not in text, absent


def write(tmp_path: Path, records: list[dict[str, object]]) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


GOOD = {
    "id": "x1",
    "split": "test",
    "question": "What is the default keepalive time?",
    "answerable": True,
    "gold_doc_ids": ["guides/keepalive.md"],
    "gold_path": "docs/guides/keepalive.md",
    "answer": "2 hours on the server.",
}
UNANSWERABLE = {**GOOD, "id": "x2", "question": "How do I bake bread?", "answerable": False}
UNANSWERABLE.update(gold_doc_ids=[], gold_path="", answer="")


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([GOOD, {**GOOD, "question": "Another?"}], "unique"),
        ([GOOD, {**GOOD, "id": "x3"}], "questions must be"),
        ([{**GOOD, "gold_doc_ids": ["keepalive.md"]}], "first gold id"),
        ([{**GOOD, "gold_path": "guides/keepalive.md"}], "under docs/"),
        ([{**GOOD, "answer": " "}], "needs gold ids"),
        ([{**UNANSWERABLE, "answer": "yes"}], "unanswerable"),
        ([{**GOOD, "split": "train"}], "split must be"),
        ([{**GOOD, "extra": 1}], "exactly the fields"),
        ([{**GOOD, "answerable": "yes"}], "boolean"),
    ],
)
def test_malformed_sets_are_refused(tmp_path: Path, records: list[dict[str, object]], message: str) -> None:
    with pytest.raises(QASetError, match=message):
        qa.load(write(tmp_path, records))


@needs_corpus
def test_gold_page_missing_from_the_corpus_is_refused(tmp_path: Path) -> None:
    missing = {**GOOD, "gold_doc_ids": ["guides/nope.md"], "gold_path": "docs/guides/nope.md"}
    with pytest.raises(QASetError, match="not a page"):
        qa.load(write(tmp_path, [missing]), CORPUS)
    assert qa.load(write(tmp_path, [GOOD, UNANSWERABLE]), CORPUS, split="test")[0].id == "x1"
