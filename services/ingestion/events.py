"""The ingest event: what the API publishes on the work-queue stream for each document."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

from meshkit.ids import doc_id_problem, validate_collection

Op = Literal["upsert", "delete"]
SUBJECT_PREFIX = "ragmesh.ingest"
DLQ_SUBJECT_PREFIX = "ragmesh.dlq"


class MalformedEvent(ValueError):
    pass


@dataclass(frozen=True)
class IngestEvent:
    op: Op
    collection: str
    doc_id: str
    # sha256 of the raw bytes of the version to index ("" for deletes).
    content_sha256: str = ""
    # Object store key of that version: one object per version, so an older event can never
    # read newer bytes and the indexed version stays readable until its successor is indexed.
    object_key: str = ""
    format: int = 0
    title: str = ""
    source_uri: str = ""
    submitted_at: float = 0.0

    @property
    def subject(self) -> str:
        return f"{SUBJECT_PREFIX}.{self.collection}"

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> IngestEvent:
        try:
            raw = json.loads(data)
            event = cls(**raw)
        except (ValueError, TypeError) as exc:
            raise MalformedEvent(f"undecodable ingest event: {exc}") from exc
        if event.op not in ("upsert", "delete"):
            raise MalformedEvent(f"unknown op {event.op!r}")
        problem = doc_id_problem(event.doc_id)
        if problem:
            raise MalformedEvent(problem)
        try:
            validate_collection(event.collection)
        except Exception as exc:
            raise MalformedEvent(str(exc)) from exc
        if event.op == "upsert" and not (event.content_sha256 and event.object_key):
            raise MalformedEvent("upsert event without content hash or object key")
        return event


def object_key_for(collection: str, doc_key: str, content_sha256: str) -> str:
    return f"{collection}/{doc_key.split('.', 1)[1]}/{content_sha256}"
