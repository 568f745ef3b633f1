"""The ingest event: what the API publishes on the work-queue stream for each request (a
submitted version or a delete of one document), and what the document's status records as
its current request."""

from __future__ import annotations

import json
import uuid
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Literal

from meshkit.core.errors import ServiceError
from meshkit.domain.ids import doc_id_problem, doc_key, validate_collection

Op = Literal["upsert", "delete"]
SUBJECT_PREFIX = "ragmesh.ingest"
DLQ_SUBJECT_PREFIX = "ragmesh.dlq"
# target_sha256 of a document whose latest request is a delete.
DELETE_TARGET = "-"


class MalformedEvent(ValueError):
    """An event that is no ingest event; its message, in our words, becomes the dead letter's
    reason (a parser's own text is its ``__cause__``, for the log)."""


@dataclass(frozen=True)
class IngestEvent:
    op: Op
    collection: str
    doc_id: str
    # sha256 of the raw bytes of the version to index ("" for deletes).
    content_sha256: str = ""
    # Object store key of that version, unique to the submission that stored the bytes (see
    # object_key_for): cleanup deletes exact keys it knows are superseded, so it can never
    # remove the bytes of a version submitted meanwhile.
    object_key: str = ""
    format: int = 0
    title: str = ""
    source_uri: str = ""
    # The caller's metadata, stored with every chunk in both stores (filterable).
    metadata: dict[str, str] = field(default_factory=dict)
    submitted_at: float = 0.0
    # Identifies this request (a submission, a delete, a replay of a dead letter). The status
    # records the current request: an event whose request is not the current one is superseded.
    # "" for events published before requests had ids.
    request_id: str = ""

    @property
    def key(self) -> str:
        return doc_key(self.collection, self.doc_id)

    @property
    def target(self) -> str:
        """The version this request asks for: the content hash, or DELETE_TARGET."""
        return DELETE_TARGET if self.op == "delete" else self.content_sha256

    @property
    def subject(self) -> str:
        return subject_for(self.key)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, raw: Any) -> IngestEvent:
        if not isinstance(raw, dict):
            raise MalformedEvent("an ingest event is a JSON object")
        known = {f.name for f in fields(cls)}
        try:
            event = cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as exc:
            raise MalformedEvent(f"undecodable ingest event: {_missing_fields(raw)}") from exc
        if event.op not in ("upsert", "delete"):
            raise MalformedEvent(f"unknown op {str(event.op)[:40]!r}")
        problem = doc_id_problem(event.doc_id) if isinstance(event.doc_id, str) else "doc_id is not a string"
        if problem:
            raise MalformedEvent(problem)
        if not isinstance(event.collection, str):
            raise MalformedEvent("collection is not a string")
        try:
            validate_collection(event.collection)
        except ServiceError as exc:
            raise MalformedEvent(exc.message) from exc
        if not isinstance(event.metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in event.metadata.items()
        ):
            raise MalformedEvent("metadata is not an object of strings")
        if event.op == "upsert" and not (event.content_sha256 and event.object_key):
            raise MalformedEvent("upsert event without content hash or object key")
        return event

    @classmethod
    def from_bytes(cls, data: bytes) -> IngestEvent:
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise MalformedEvent("undecodable ingest event: not JSON") from exc
        return cls.from_dict(raw)


def _missing_fields(raw: dict[str, Any]) -> str:
    """Which required fields an event lacks (the dataclass's TypeError says so in Python's words)."""
    required = [f.name for f in fields(IngestEvent) if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if name not in raw]
    return f"{', '.join(missing)} missing" if missing else "fields of the wrong kind"


def new_request_id() -> str:
    return uuid.uuid4().hex


def subject_for(doc_key: str) -> str:
    """One subject per document (``ragmesh.ingest.<collection>.<doc hash>``), so whether a
    document has an event pending is one last-message lookup on the stream."""
    return f"{SUBJECT_PREFIX}.{doc_key}"


def object_key_for(collection: str, doc_key: str, content_sha256: str, request_id: str) -> str:
    """``<collection>/<doc hash>/<sha256>-<request id>``: unique per submission."""
    return f"{collection}/{doc_key.split('.', 1)[1]}/{content_sha256}-{request_id}"
