"""BEIR-style datasets (``corpus.jsonl[.gz]``, ``queries.jsonl[.gz]``, ``qrels/<split>.tsv``): the
judged queries of a split and their relevance judgements, as ``ragmesh eval``, the answer eval, the
load test, the reranker build and the benchmarks read them.

Doc ids in qrels go through the same sanitising as ``ragmesh ingest`` (documents.sanitize_doc_id),
so they match what the gateway returns.
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ragmesh_cli import metrics
from ragmesh_cli.documents import CORPUS_SUFFIXES, InputError, WalkStats, iter_documents, sanitize_doc_id


@dataclass
class BeirDataset:
    name: str
    root: Path
    split: str
    corpus_path: Path
    # query id -> text, for the judged queries of the split, in qrels order
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    # judged queries of the split that queries.jsonl has no text for (they cannot be run)
    missing_queries: list[str] = field(default_factory=list)


def find_corpus(root: Path) -> Path:
    for suffix in CORPUS_SUFFIXES:
        if (root / suffix).is_file():
            return root / suffix
    raise InputError(f"{root}: no corpus.jsonl or corpus.jsonl.gz")


def _open_text(path: Path) -> TextIO:
    return (
        gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else path.open(encoding="utf-8")
    )


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """``query-id corpus-id score`` TSV with a header line; doc ids sanitised like ingest does."""
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["query-id", "corpus-id", "score"]:
            raise InputError(f"{path}: expected a header line 'query-id<TAB>corpus-id<TAB>score'")
        for lineno, row in enumerate(reader, start=2):
            if not row or not "".join(row).strip():
                continue
            if len(row) < 3:
                raise InputError(f"{path}:{lineno}: expected 3 tab-separated columns")
            try:
                grade = int(float(row[2]))
            except ValueError:
                raise InputError(f"{path}:{lineno}: score {row[2]!r} is not a number") from None
            qrels.setdefault(row[0].strip(), {})[sanitize_doc_id(row[1].strip())] = grade
    return qrels


def read_queries(path: Path, wanted: set[str]) -> dict[str, str]:
    queries: dict[str, str] = {}
    with _open_text(path) as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict) or "_id" not in record:
                raise InputError(f"{path}:{lineno}: expected an object with an '_id'")
            qid = str(record["_id"])
            if qid in wanted:
                queries[qid] = str(record.get("text") or "")
    return queries


def load_dataset(root: Path, split: str, limit: int | None = None) -> BeirDataset:
    """The judged queries of ``split`` (those with at least one relevant document), in qrels order,
    optionally only the first ``limit``; qrels are restricted to those queries."""
    if not root.is_dir():
        raise InputError(f"{root}: not a directory")
    qrels_path = root / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        raise InputError(f"{qrels_path}: no qrels for split {split!r}")
    queries_path = next(
        (root / n for n in ("queries.jsonl", "queries.jsonl.gz") if (root / n).is_file()), None
    )
    if queries_path is None:
        raise InputError(f"{root}: no queries.jsonl")
    all_qrels = read_qrels(qrels_path)
    judged = metrics.judged_queries(all_qrels)
    texts = read_queries(queries_path, set(judged))
    runnable = [q for q in judged if texts.get(q, "").strip()]
    if limit is not None:
        runnable = runnable[:limit]
    return BeirDataset(
        name=root.absolute().name,
        root=root,
        split=split,
        corpus_path=find_corpus(root),
        queries={q: texts[q] for q in runnable},
        qrels={q: all_qrels[q] for q in runnable},
        missing_queries=[q for q in judged if not texts.get(q, "").strip()],
    )


def never_a_file(name: str, content: bytes) -> None:
    """Only a corpus file is ingested here, and corpus records never go through format detection."""
    return None


def corpus_size(corpus_path: Path) -> int:
    """Documents ``ragmesh ingest`` would send for the corpus (empty texts and duplicate ids skipped)."""
    return sum(1 for _ in iter_documents([corpus_path], never_a_file, WalkStats(), lambda _msg: None))
