"""Shared ingestion state in JetStream key-value buckets, visible to every worker replica.

Two buckets, both keyed by ``meshkit.ids.doc_key(collection, doc_id)``:

- **status**: the document's lifecycle (queued, processing, indexed, failed...), the version
  callers asked for last (``target_sha256``) and the worker that owns it right now (a lease).
  Every change is a compare-and-set on the entry's revision, so two workers never both own
  a document, and an older event can never overwrite a newer request.
- **records** (the record manager): what is indexed for the document: its content hash and
  chunk ids (content-addressed, so an unchanged chunk keeps its id and is never re-embedded).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

STATUS_BUCKET = "ragmesh_doc_status"
RECORDS_BUCKET = "ragmesh_doc_records"

QUEUED = "queued"
PROCESSING = "processing"
INDEXED = "indexed"
FAILED = "failed"
DELETING = "deleting"
DELETED = "deleted"
STATES = (QUEUED, PROCESSING, INDEXED, FAILED, DELETING, DELETED)
# target_sha256 of a document whose latest request is a delete.
DELETE_TARGET = "-"


class Conflict(Exception):
    """Another writer changed the entry since it was read."""


@dataclass(frozen=True)
class DocStatus:
    collection: str
    doc_id: str
    state: str
    target_sha256: str = ""
    indexed_sha256: str = ""
    reason: str = ""
    attempts: int = 0
    chunks: int = 0
    owner: str = ""
    lease_until: float = 0.0
    updated_at: float = field(default_factory=time.time)

    def with_changes(self, **changes: Any) -> DocStatus:
        return replace(self, updated_at=time.time(), **changes)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DocStatus:
        return cls(**json.loads(data))


@dataclass(frozen=True)
class DocRecord:
    collection: str
    doc_id: str
    content_sha256: str
    object_key: str
    title: str
    # Content-addressed chunk ids, in document order.
    chunk_ids: list[str]
    indexed_at: float = field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DocRecord:
        return cls(**json.loads(data))


@dataclass(frozen=True)
class Versioned:
    """A value with the KV revision it was read at (0: the key does not exist)."""

    value: Any
    revision: int


async def open_buckets(js: JetStreamContext, replicas: int = 1) -> tuple[KeyValue, KeyValue]:
    from nats.js.api import KeyValueConfig, StorageType

    buckets = []
    for name in (STATUS_BUCKET, RECORDS_BUCKET):
        try:
            kv = await js.key_value(name)
        except nats.js.errors.BucketNotFoundError:
            kv = await js.create_key_value(
                KeyValueConfig(bucket=name, history=1, storage=StorageType.FILE, replicas=replicas)
            )
        buckets.append(kv)
    return buckets[0], buckets[1]


class StateStore:
    def __init__(self, status: KeyValue, records: KeyValue) -> None:
        self.status = status
        self.records = records

    async def _get(self, kv: KeyValue, key: str) -> tuple[bytes | None, int]:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None, 0
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return None, int(entry.revision or 0)
        return entry.value, int(entry.revision or 0)

    async def get_status(self, key: str) -> Versioned:
        data, revision = await self._get(self.status, key)
        return Versioned(DocStatus.from_bytes(data) if data else None, revision)

    async def get_record(self, key: str) -> Versioned:
        data, revision = await self._get(self.records, key)
        return Versioned(DocRecord.from_bytes(data) if data else None, revision)

    async def _cas(self, kv: KeyValue, key: str, data: bytes, revision: int) -> int:
        try:
            if revision == 0:
                return int(await kv.create(key, data))
            return int(await kv.update(key, data, last=revision))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise Conflict(key) from exc
        except nats.js.errors.APIError as exc:
            # create() on a key whose last op was a delete reports a wrong-sequence API error.
            if exc.err_code in (10071, 10164):
                raise Conflict(key) from exc
            raise

    async def put_status(self, key: str, status: DocStatus, revision: int) -> int:
        """Compare-and-set: fails with Conflict if the entry changed since ``revision``."""
        return await self._cas(self.status, key, status.to_bytes(), revision)

    async def put_record(self, key: str, record: DocRecord, revision: int) -> int:
        return await self._cas(self.records, key, record.to_bytes(), revision)

    async def delete_record(self, key: str) -> None:
        await self.records.purge(key)
