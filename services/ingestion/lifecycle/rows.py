"""A status entry as the ingestion API's status index holds it (``Row``): what listings,
counts and a reindex's comparisons need of a ``DocStatus``, nothing else (a status entry is
about 3 KB, its row about 300 bytes).

Rows are made from a decoded ``DocStatus`` (the API's own writes, applied at once) or straight
from an entry's JSON (the watch of the status bucket, where decoding a million entries into
dataclasses would cost more than the rest of the work together); both give the same row
(``services/ingestion/tests/test_status_index.py`` keeps them equal).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.ingestion.events import IngestEvent
from services.ingestion.lifecycle.entries import DocStatus

# How far a source digest is kept: enough to tell two descriptions of one document apart.
DIGEST_CHARS = 32


@dataclass(frozen=True, slots=True)
class Row:
    collection: str
    doc_id: str
    # The status bucket's key (meshkit.domain.ids.doc_key) and the entry's revision.
    key: str
    revision: int
    state: str
    chunks: int
    # The latest request's source_uri and op ("" when the entry records no request).
    source_uri: str
    op: str
    target_sha256: str
    indexed_sha256: str
    indexed_version: int
    # sha256 of the latest request's title, source_uri and metadata ("" without a request): two
    # rows with one digest describe their document alike (requests._same_source).
    source_digest: str

    @property
    def content_sha256(self) -> str:
        """What ListDocuments reports: the bytes indexed, else those pending."""
        return self.indexed_sha256 or self.target_sha256

    def values(self) -> tuple[Any, ...]:
        """The row in the index's column order (``COLUMNS``)."""
        return (
            self.collection,
            self.doc_id,
            self.key,
            self.revision,
            self.state,
            self.chunks,
            self.source_uri,
            self.op,
            self.target_sha256,
            self.indexed_sha256,
            self.indexed_version,
            self.source_digest,
        )


COLUMNS = (
    "collection",
    "doc_id",
    "key",
    "revision",
    "state",
    "chunks",
    "source_uri",
    "op",
    "target_sha256",
    "indexed_sha256",
    "indexed_version",
    "source_digest",
)


def source_digest(title: str, source_uri: str, metadata: Mapping[str, str]) -> str:
    described = json.dumps([title, source_uri, sorted(metadata.items())], separators=(",", ":"))
    return hashlib.sha256(described.encode()).hexdigest()[:DIGEST_CHARS]


def _request_digest(request: IngestEvent | None) -> str:
    if request is None:
        return ""
    return source_digest(request.title, request.source_uri, request.metadata)


def row_of(key: str, revision: int, status: DocStatus) -> Row:
    """The row of a decoded status."""
    request = status.request
    return Row(
        collection=status.collection,
        doc_id=status.doc_id,
        key=key,
        revision=revision,
        state=status.state,
        chunks=status.chunks,
        source_uri=request.source_uri if request else "",
        op=request.op if request else "",
        target_sha256=status.target_sha256,
        indexed_sha256=status.indexed_sha256,
        indexed_version=status.indexed_version,
        source_digest=_request_digest(request),
    )


def _text(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name, "")
    return value if isinstance(value, str) else ""


def _raw_digest(request: Any) -> tuple[str, str, str]:
    """(source_uri, op, digest) of a request as its JSON holds it."""
    if not isinstance(request, dict):
        return "", "", ""
    metadata = request.get("metadata") or {}
    if not isinstance(metadata, dict):
        metadata = {}
    source = _text(request, "source_uri")
    return source, _text(request, "op"), source_digest(_text(request, "title"), source, metadata)


def row_from_entry(key: str, revision: int, data: bytes) -> Row:
    """The row of a status entry's JSON, without building the ``DocStatus`` (the same row as
    ``row_of(key, revision, DocStatus.from_bytes(data))``). Raises ValueError when the entry is
    no status."""
    raw = json.loads(data)
    if not isinstance(raw, dict):
        raise ValueError("a status entry is a JSON object")
    collection, doc_id, state = _text(raw, "collection"), _text(raw, "doc_id"), _text(raw, "state")
    if not (collection and doc_id and state):
        raise ValueError("a status entry names its collection, document and state")
    source, op, digest = _raw_digest(raw.get("request"))
    return Row(
        collection=collection,
        doc_id=doc_id,
        key=key,
        revision=revision,
        state=state,
        chunks=int(raw.get("chunks", 0)),
        source_uri=source,
        op=op,
        target_sha256=_text(raw, "target_sha256"),
        indexed_sha256=_text(raw, "indexed_sha256"),
        indexed_version=int(raw.get("indexed_version", 1)),
        source_digest=digest,
    )
