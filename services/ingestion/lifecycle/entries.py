"""The entries of the lifecycle's two key-value buckets: ``DocStatus`` (status bucket: state,
current request, claim, attempt counters) and ``DocRecord`` (records bucket: what the stores
hold), their JSON form, and what a status says about a request (``is_current``,
``waiting_state``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from services.ingestion.events import IngestEvent, MalformedEvent
from services.ingestion.lifecycle.machine import DELETING, QUEUED, State

# The lifecycle's logger (the package's name): its log lines kept their name through the moves.
log = logging.getLogger("services.ingestion.lifecycle")


def _known_fields(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """Entries written by older or newer code: unknown fields are dropped, missing ones take
    their defaults."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in raw.items() if k in names}


@dataclass(frozen=True)
class DocStatus:
    collection: str
    doc_id: str
    state: str
    # The current request (its event). None only for entries written before requests existed.
    request: IngestEvent | None = None
    target_sha256: str = ""
    indexed_sha256: str = ""
    # PREPARATION_VERSION of the code that indexed indexed_sha256 (1: before versions were kept).
    indexed_version: int = 1
    reason: str = ""
    # Claims of the current request, and those of them that count against the limit.
    attempts: int = 0
    charged: int = 0
    chunks: int = 0
    # The claim: who holds it, its fence (the revision it compare-and-set), until when.
    owner: str = ""
    fence: int = 0
    lease_until: float = 0.0
    # When the current run of transient failures began (0: none), and how many there were.
    transient_since: float = 0.0
    retries: int = 0
    updated_at: float = field(default_factory=time.time)

    @property
    def request_id(self) -> str:
        return self.request.request_id if self.request else ""

    def with_changes(self, **changes: Any) -> DocStatus:
        return replace(self, updated_at=time.time(), **changes)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DocStatus:
        raw = _known_fields(cls, json.loads(data))
        request = raw.pop("request", None)
        status = cls(**raw)
        if isinstance(request, dict):
            try:
                status = replace(status, request=IngestEvent.from_dict(request))
            except MalformedEvent:
                log.error("status entry with an undecodable request", extra={"doc_id": status.doc_id})
        return status


@dataclass(frozen=True)
class DocRecord:
    collection: str
    doc_id: str
    content_sha256: str
    object_key: str
    title: str
    # Content-addressed chunk ids, in document order.
    chunk_ids: list[str]
    # Fence of the claim that wrote it (the stores were given the same one).
    fence: int = 0
    indexed_at: float = field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DocRecord:
        return cls(**_known_fields(cls, json.loads(data)))


@dataclass(frozen=True)
class Versioned:
    """A value with the KV revision it was read at (0: the key does not exist)."""

    value: Any
    revision: int


# How DocStatus.to_bytes begins, and where its state sits: collection and doc id come first
# and, being JSON strings, cannot hold these unescaped quotes.
_ENTRY_HEAD = b'{"collection":'
_STATE_FIELD = b',"state":"'
_REQUEST_FIELD = b'"request":'


def entry_state(data: bytes) -> str:
    """The state a status entry's JSON records, read without decoding the entry when it was
    written by ``DocStatus.to_bytes`` (the state precedes the request and its metadata); any
    other JSON is decoded. Raises ValueError when the entry is no status."""
    if data.startswith(_ENTRY_HEAD):
        at = data.find(_STATE_FIELD)
        request = data.find(_REQUEST_FIELD)
        if at > 0 and (request == -1 or at < request):
            start = at + len(_STATE_FIELD)
            end = data.find(b'"', start)
            if end > start:
                return data[start:end].decode()
    raw = json.loads(data)
    state = raw.get("state") if isinstance(raw, dict) else None
    if not isinstance(state, str):
        raise ValueError("a status entry records its state")
    return state


def is_current(status: DocStatus, event: IngestEvent) -> bool:
    """Whether ``event`` is the document's current request."""
    if event.request_id:
        return status.request_id == event.request_id
    # An event published before requests had ids: current if nothing newer replaced it.
    return not status.request_id and status.target_sha256 == event.target


def waiting_state(request: IngestEvent | None) -> State:
    """The state of a document whose request waits for a worker."""
    return DELETING if request is not None and request.op == "delete" else QUEUED
