"""Question sets for answer quality: questions over the grpc-docs corpus (answerable, each with
the page that answers it, and unanswerable) and questions the SciFact corpus cannot answer.

Files (one JSON object per line; the format is shared with the answer evaluation):

    grpc_docs.jsonl             {"id", "split": "test"|"tune", "question", "answerable",
                                 "gold_doc_ids", "gold_path", "answer"}
    scifact_unanswerable.jsonl  the same fields, every record unanswerable

``gold_path`` is the answering page relative to the corpus root (``docs/guides/retry.md``);
``gold_doc_ids`` are the doc ids ``ragmesh ingest <corpus root>/docs`` gives that page (and any
other page that answers the question too), computed with the CLI's own id rule. Unanswerable
records have no gold ids, no gold path and an empty answer. Choose thresholds on the ``tune``
split only; report on ``test``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal, cast

from ragmesh_cli.documents import sanitize_doc_id

Split = Literal["test", "tune"]
SPLITS: tuple[Split, ...] = ("test", "tune")

HERE = Path(__file__).resolve().parent
GRPC_DOCS_FILE = HERE / "grpc_docs.jsonl"
SCIFACT_UNANSWERABLE_FILE = HERE / "scifact_unanswerable.jsonl"
# The corpus lies next to the repository (../shared/corpora/grpc-docs from its root).
DEFAULT_GRPC_DOCS_ROOT = HERE.parents[2] / "shared" / "corpora" / "grpc-docs"
# The folder of the corpus that is ingested; doc ids are relative to it.
INGESTED_FOLDER = "docs"

_FIELDS = frozenset({"id", "split", "question", "answerable", "gold_doc_ids", "gold_path", "answer"})


class QASetError(ValueError):
    """A question file is malformed or does not match its corpus."""


@dataclass(frozen=True)
class QAItem:
    id: str
    split: Split
    question: str
    answerable: bool
    gold_doc_ids: tuple[str, ...]
    gold_path: str
    answer: str


def doc_id_for(gold_path: str) -> str:
    """The doc id ``ragmesh ingest <root>/docs`` gives the page at ``gold_path`` (``docs/...``)."""
    relative = PurePosixPath(gold_path).relative_to(INGESTED_FOLDER)
    return sanitize_doc_id(relative.as_posix())


def parse_line(line: str, where: str) -> QAItem:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise QASetError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict) or set(record) != _FIELDS:
        raise QASetError(f"{where}: expected exactly the fields {sorted(_FIELDS)}")
    strings = ("id", "split", "question", "gold_path", "answer")
    if not all(isinstance(record[name], str) for name in strings):
        raise QASetError(f"{where}: {', '.join(strings)} must be strings")
    ids = record["gold_doc_ids"]
    if not isinstance(record["answerable"], bool) or not (
        isinstance(ids, list) and all(isinstance(i, str) for i in ids)
    ):
        raise QASetError(f"{where}: answerable must be a boolean and gold_doc_ids a list of strings")
    if record["split"] not in SPLITS:
        raise QASetError(f"{where}: split must be one of {SPLITS}, got {record['split']!r}")
    return QAItem(
        id=record["id"],
        split=cast(Split, record["split"]),
        question=record["question"],
        answerable=record["answerable"],
        gold_doc_ids=tuple(ids),
        gold_path=record["gold_path"],
        answer=record["answer"],
    )


def read(path: Path) -> list[QAItem]:
    items = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if line.strip():
                items.append(parse_line(line, f"{path.name}:{lineno}"))
    return items


def validate(items: Iterable[QAItem], corpus_root: Path | None) -> None:
    """Ids and questions unique; each record consistent with ``answerable``; with a corpus
    root, every gold path exists there and every gold doc id is a page that ingest would
    give that id (the first one the gold path's)."""
    seen_ids: set[str] = set()
    seen_questions: set[str] = set()
    for item in items:
        where = f"record {item.id!r}"
        if not item.id or item.id in seen_ids:
            raise QASetError(f"{where}: ids must be non-empty and unique")
        question = " ".join(item.question.lower().split())
        if not question or question in seen_questions:
            raise QASetError(f"{where}: questions must be non-empty and unique")
        seen_ids.add(item.id)
        seen_questions.add(question)
        if item.answerable:
            _check_answerable(item, where, corpus_root)
        elif item.gold_doc_ids or item.gold_path or item.answer:
            raise QASetError(f"{where}: an unanswerable question has no gold ids, gold path or answer")


def _check_answerable(item: QAItem, where: str, corpus_root: Path | None) -> None:
    if not (item.gold_doc_ids and item.gold_path and item.answer.strip()):
        raise QASetError(f"{where}: an answerable question needs gold ids, a gold path and an answer")
    if not item.gold_path.startswith(f"{INGESTED_FOLDER}/"):
        raise QASetError(f"{where}: gold_path must lie under {INGESTED_FOLDER}/")
    if item.gold_doc_ids[0] != doc_id_for(item.gold_path):
        raise QASetError(
            f"{where}: the first gold id must be the gold path's ({doc_id_for(item.gold_path)!r})"
        )
    if len(set(item.gold_doc_ids)) != len(item.gold_doc_ids):
        raise QASetError(f"{where}: gold ids repeat")
    if corpus_root is None:
        return
    for doc_id in item.gold_doc_ids:
        page = corpus_root / INGESTED_FOLDER / doc_id
        if not page.is_file() or doc_id_for(f"{INGESTED_FOLDER}/{doc_id}") != doc_id:
            raise QASetError(f"{where}: gold id {doc_id!r} is not a page of {corpus_root}")


def load(path: Path, corpus_root: Path | None = None, split: Split | None = None) -> list[QAItem]:
    """The validated records of ``path`` (of one split when given)."""
    items = read(path)
    validate(items, corpus_root)
    return [item for item in items if split is None or item.split == split]


def load_grpc_docs(
    split: Split | None = None, corpus_root: Path | None = DEFAULT_GRPC_DOCS_ROOT
) -> list[QAItem]:
    """The grpc-docs questions, checked against the corpus when it is there."""
    root = corpus_root if corpus_root is not None and corpus_root.is_dir() else None
    return load(GRPC_DOCS_FILE, root, split)


def load_scifact_unanswerable(split: Split | None = None) -> list[QAItem]:
    items = load(SCIFACT_UNANSWERABLE_FILE, None, split)
    if any(item.answerable for item in items):
        raise QASetError(f"{SCIFACT_UNANSWERABLE_FILE.name}: every record must be unanswerable")
    return items
