"""What ``ragmesh ingest`` sends: files and folders walked into Documents, BEIR corpus.jsonl
files split into one Document per line, and the Documents grouped into request-sized batches.

Pure and synchronous so it is unit-testable; the format detector is passed in (the one the
ingestion service uses: ``meshkit.text.formats.detect_format``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ragmesh.ingestion.v1 import ingestion_pb2

# (file name, raw bytes) -> a DocumentFormat value, or None when the format is not supported.
DetectFormat = Callable[[str, bytes], Any]
Warn = Callable[[str], None]

MAX_DOC_ID_CHARS = 256
DEFAULT_BATCH_DOCS = 256
DEFAULT_BATCH_BYTES = 16 * 1024 * 1024
CORPUS_SUFFIXES = ("corpus.jsonl", "corpus.jsonl.gz")

_DOC_ID_BAD_CHARS = re.compile(r"[^A-Za-z0-9._:=@+\-/]")


class InputError(ValueError):
    """A path or file the user gave cannot be ingested (missing, unknown format, malformed)."""


# The ingestion service's default document size limit (RAGMESH_INGEST_MAX_DOCUMENT_BYTES).
DEFAULT_MAX_FILE_BYTES = 20 * 1024 * 1024
_TEXT_FORMATS = frozenset(
    {
        ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN,
        ingestion_pb2.DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN,
        ingestion_pb2.DOCUMENT_FORMAT_TEXT,
        ingestion_pb2.DOCUMENT_FORMAT_HTML,
    }
)
UNSUPPORTED = "unsupported format"
VAULT_MARKER = ".obsidian"


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass
class WalkStats:
    files: int = 0
    corpus_documents: int = 0
    # Files found in folders that cannot be ingested, with the reason (nothing is sent for them).
    skipped: list[Skipped] = field(default_factory=list)
    skipped_empty: int = 0
    duplicates: list[str] = field(default_factory=list)
    # Doc ids of every file walked (sent or skipped): a sync never deletes these.
    walked_ids: set[str] = field(default_factory=set)

    @property
    def skipped_unknown(self) -> list[str]:
        return [s.path for s in self.skipped if s.reason == UNSUPPORTED]


def sanitize_doc_id(raw: str) -> str:
    """A valid doc id for ``raw``: characters outside [A-Za-z0-9._:=@+-/] become '_', empty
    segments are dropped and '.'/'..' segments neutralised (ids must not look like path escapes);
    over-long ids keep their head plus a hash of the whole so they stay unique."""
    cleaned = _DOC_ID_BAD_CHARS.sub("_", raw)
    segments = []
    for segment in cleaned.split("/"):
        if segment == "":
            continue
        segments.append("_" * len(segment) if segment in (".", "..") else segment)
    doc_id = "/".join(segments) or "_"
    if len(doc_id) > MAX_DOC_ID_CHARS:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
        doc_id = doc_id[: MAX_DOC_ID_CHARS - len(digest) - 1].rstrip("/") + "-" + digest
    return doc_id


def is_hidden(name: str) -> bool:
    return name.startswith(".")


def is_corpus_file(path: Path) -> bool:
    """BEIR corpus files: ``corpus.jsonl`` or ``corpus.jsonl.gz`` (any prefix)."""
    return path.name.endswith(CORPUS_SUFFIXES)


@dataclass(frozen=True)
class FileEntry:
    path: Path
    doc_id: str
    # Named on the command line (unknown format is an error) rather than found in a folder.
    explicit: bool
    # Inside an Obsidian vault: its Markdown is sent as OBSIDIAN_MARKDOWN.
    vault: bool = False


def is_vault(folder: Path) -> bool:
    """Whether ``folder`` is the root of an Obsidian vault (it holds the app's ``.obsidian/``)."""
    return (folder / VAULT_MARKER).is_dir()


def _within_vault(folder: Path) -> bool:
    return any(is_vault(p) for p in (folder.absolute(), *folder.absolute().parents))


def walk_paths(paths: Iterable[Path]) -> Iterator[FileEntry]:
    """Files named directly, then everything under folders (recursively, sorted, hidden files
    and folders skipped: ``.obsidian/``, ``.git/``...). A folder's files get ids relative to
    that folder."""
    for path in paths:
        if path.is_dir():
            yield from _walk_folder(path)
        elif path.is_file():
            yield FileEntry(path, sanitize_doc_id(path.name), explicit=True, vault=_within_vault(path.parent))
        else:
            raise InputError(f"{path}: no such file or directory")


def _walk_folder(root: Path) -> Iterator[FileEntry]:
    vaults = {str(root)} if _within_vault(root) else set()
    for dirpath, dirnames, filenames in os.walk(root):
        in_vault = dirpath in vaults or VAULT_MARKER in dirnames
        dirnames[:] = sorted(d for d in dirnames if not is_hidden(d))
        if in_vault:
            vaults.update(os.path.join(dirpath, d) for d in dirnames)
        for name in sorted(filenames):
            if is_hidden(name):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                doc_id = sanitize_doc_id(path.relative_to(root).as_posix())
                yield FileEntry(path, doc_id, explicit=False, vault=in_vault)


def parse_corpus_lines(
    lines: Iterable[str], source: str, stats: WalkStats
) -> Iterator[ingestion_pb2.Document]:
    """BEIR corpus lines ``{"_id", "title", "text"}`` -> one TEXT Document each."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{source}:{lineno}: not JSON ({exc.msg})") from None
        except RecursionError:
            # json's parser gives up past the interpreter's depth: a malformed corpus line.
            raise InputError(f"{source}:{lineno}: JSON nested too deeply") from None
        if not isinstance(record, dict) or not isinstance(record.get("_id"), str | int):
            raise InputError(f"{source}:{lineno}: expected an object with an '_id'")
        text = record.get("text") or ""
        title = record.get("title") or ""
        if not isinstance(text, str) or not isinstance(title, str):
            raise InputError(f"{source}:{lineno}: 'title' and 'text' must be strings")
        if not text.strip():
            # Nothing to index; the service would refuse an empty document anyway.
            stats.skipped_empty += 1
            continue
        raw_id = str(record["_id"])
        yield ingestion_pb2.Document(
            doc_id=sanitize_doc_id(raw_id),
            title=title,
            format=ingestion_pb2.DOCUMENT_FORMAT_TEXT,
            content=text.encode("utf-8"),
            source_uri=f"{source}#{raw_id}",
        )


def _open_corpus(path: Path) -> TextIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def read_corpus(path: Path, stats: WalkStats) -> Iterator[ingestion_pb2.Document]:
    with _open_corpus(path) as handle:
        for doc in parse_corpus_lines(handle, str(path), stats):
            stats.corpus_documents += 1
            yield doc


def check_explicit_files(paths: Iterable[Path], detect: DetectFormat) -> None:
    """Fail before sending anything when a file named on the command line cannot be ingested."""
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if path.is_file() and not is_corpus_file(path) and not detect(path.name, path.read_bytes()):
            raise InputError(f"{path}: unsupported format")


def iter_documents(
    paths: Iterable[Path],
    detect: DetectFormat,
    stats: WalkStats,
    warn: Warn,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Iterator[ingestion_pb2.Document]:
    """Every Document to send, lazily (files are read as the batches need them). Files that
    cannot be ingested (unknown format inside a folder, empty, too large, not UTF-8 text,
    unreadable) are skipped with a warning and listed in ``stats.skipped``; duplicate ids keep
    the first."""
    seen: set[str] = set()
    for entry in walk_paths(paths):
        if is_corpus_file(entry.path):
            docs: Iterable[ingestion_pb2.Document] = read_corpus(entry.path, stats)
        else:
            stats.walked_ids.add(entry.doc_id)
            doc = _file_document(entry, detect, max_file_bytes)
            if isinstance(doc, str):
                stats.skipped.append(Skipped(str(entry.path), doc))
                warn(f"skipping {entry.path}: {doc}")
                continue
            stats.files += 1
            docs = [doc]
        for doc in docs:
            if doc.doc_id in seen:
                stats.duplicates.append(doc.doc_id)
                warn(f"skipping duplicate doc id {doc.doc_id!r} ({doc.source_uri})")
                continue
            seen.add(doc.doc_id)
            yield doc


def _file_document(
    entry: FileEntry, detect: DetectFormat, max_file_bytes: int
) -> ingestion_pb2.Document | str:
    """The file's Document, or why it is skipped."""
    try:
        size = entry.path.stat().st_size
        # Not read at all when too large: the size alone decides.
        content = b"" if size > max_file_bytes else entry.path.read_bytes()
    except OSError as exc:
        return f"unreadable ({exc.strerror or type(exc).__name__})"
    if size > max_file_bytes:
        return f"too large ({size} bytes, the limit is {max_file_bytes})"
    fmt = detect(entry.path.name, content)
    if not fmt:
        if entry.explicit:
            raise InputError(f"{entry.path}: {UNSUPPORTED}")
        return UNSUPPORTED
    problem = content_problem(content, fmt)
    if problem:
        return problem
    if entry.vault and fmt == ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN:
        fmt = ingestion_pb2.DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN
    return ingestion_pb2.Document(
        # A file:// URI of the absolute path: a caller opens a citation's source with it.
        doc_id=entry.doc_id,
        format=fmt,
        content=content,
        source_uri=entry.path.absolute().as_uri(),
    )


def content_problem(content: bytes, fmt: Any) -> str | None:
    """Why the ingestion service would refuse a file's bytes, checked here so that the file is
    listed with its reason instead of being sent: empty, not UTF-8 text, not a PDF."""
    if not content.strip():
        return "empty"
    if fmt == ingestion_pb2.DOCUMENT_FORMAT_PDF:
        return None if content.lstrip()[:5] == b"%PDF-" else "not a PDF (no %PDF- header)"
    if fmt in _TEXT_FORMATS:
        if b"\x00" in content:
            return "binary data, not text (NUL byte)"
        try:
            content.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"not UTF-8 text (byte 0x{content[exc.start]:02x} at offset {exc.start})"
    return None


def batches(
    docs: Iterable[ingestion_pb2.Document],
    max_docs: int = DEFAULT_BATCH_DOCS,
    max_bytes: int = DEFAULT_BATCH_BYTES,
) -> Iterator[list[ingestion_pb2.Document]]:
    """Group documents into requests of at most ``max_docs`` documents and ``max_bytes`` bytes
    (a single document larger than ``max_bytes`` goes alone)."""
    batch: list[ingestion_pb2.Document] = []
    size = 0
    for doc in docs:
        # Field tag + length prefix of the repeated field add a few bytes per document.
        doc_bytes = doc.ByteSize() + 8
        if batch and (len(batch) >= max_docs or size + doc_bytes > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(doc)
        size += doc_bytes
    if batch:
        yield batch
