"""Collection records: which embedder built a collection, and which generation of it serves.

A collection's vectors are only comparable when one model made them all, so every collection
records the embedder that built it (model id, vector dimension, sha256 of the model file) on
its first indexed document, and writers (ingestion workers) and readers (the gateway) refuse an
embedder that is not that one (FAILED_PRECONDITION, naming both models and the fix).

**Where**: one JSON entry per logical collection in the JetStream KV bucket
``ragmesh_collections`` (key: the collection name), beside the document status and records
buckets. It is replicated like them (``nats_stream_replicas``), survives restarts of any
service, and every replica of a writer or reader reads the same entry; changes are
compare-and-set on its revision, so two workers recording the first embedder of a collection
agree on one.

**Generations**: a collection is served from one physical store collection, its *generation*.
Generation 1 is stored under the collection's own name (collections indexed before generations
existed need no migration); generation n > 1 under ``<collection>__g<n>``. ``ragmesh reindex``
builds generation n + 1 (``pending_generation``) while readers keep resolving the collection to
generation n, then switches ``generation`` in one compare-and-set: the alias. Names that end
like a generation are reserved (``reserved_name_problem``) so callers never address one directly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from meshkit.core.errors import ServiceError, failed_precondition
from meshkit.domain.calibration import Calibration

log = logging.getLogger(__name__)

COLLECTIONS_BUCKET = "ragmesh_collections"
_GENERATION_RE = re.compile(r"^(.+)__g([0-9]{1,6})$")
_CAS_ATTEMPTS = 20


@dataclass(frozen=True)
class EmbedderIdentity:
    """What makes two vectors comparable: the same model file, under the same name and size."""

    model: str
    dimension: int
    sha256: str

    def describe(self) -> str:
        return f"{self.model!r} (dimension {self.dimension}, sha256 {self.sha256[:16] or 'unknown'})"

    @classmethod
    def of_reply(cls, model: str, sha256: str, vectors: Any) -> EmbedderIdentity | None:
        """The identity of an Embed reply's vectors (None: no vectors to judge)."""
        if not vectors:
            return None
        return cls(model=model, dimension=len(vectors[0].values), sha256=sha256)

    @classmethod
    def from_dict(cls, raw: Any) -> EmbedderIdentity | None:
        if not isinstance(raw, dict):
            return None
        return cls(model=str(raw["model"]), dimension=int(raw["dimension"]), sha256=str(raw["sha256"]))


def physical_name(collection: str, generation: int) -> str:
    """The store collection that holds ``generation`` of ``collection``."""
    return collection if generation <= 1 else f"{collection}__g{generation}"


def split_physical(name: str) -> tuple[str, int]:
    """(logical collection, generation) of a store collection name."""
    match = _GENERATION_RE.fullmatch(name)
    if match is None:
        return name, 1
    return match.group(1), int(match.group(2))


def reserved_name_problem(collection: str) -> str | None:
    """Why a caller may not name ``collection`` (it is a generation's store name), or None."""
    if _GENERATION_RE.fullmatch(collection):
        return (
            f"collection {collection[:80]!r} is invalid: names ending in '__g<number>' are reserved "
            "for the generations ragmesh reindex builds"
        )
    return None


@dataclass(frozen=True)
class CollectionRecord:
    collection: str
    # The generation readers use (the alias target).
    generation: int = 1
    # The embedder that built ``generation`` (None until its first document is indexed).
    embedder: EmbedderIdentity | None = None
    # A reindex in progress: the generation it builds (0: none) and that generation's embedder.
    pending_generation: int = 0
    pending_embedder: EmbedderIdentity | None = None
    # The generation readers left at the last switch, while its documents are deleted (0: none),
    # and when the switch happened (its deletion waits until no reader can still use it).
    retired_generation: int = 0
    switched_at: float = 0.0
    updated_at: float = field(default_factory=time.time)
    # The search choices measured for the collection (ragmesh calibrate); None: server defaults.
    calibration: Calibration | None = None

    @property
    def physical(self) -> str:
        return physical_name(self.collection, self.generation)

    def calibration_in_force(self) -> Calibration | None:
        """The calibration, while the serving generation's embedder is the one it was measured on."""
        calibration, embedder = self.calibration, self.embedder
        if calibration is None or embedder is None or not calibration.applies_to(embedder.sha256):
            return None
        return calibration

    def embedder_of(self, generation: int) -> EmbedderIdentity | None:
        return self.pending_embedder if generation == self.pending_generation else self.embedder

    def with_embedder(self, generation: int, identity: EmbedderIdentity) -> CollectionRecord:
        if generation == self.pending_generation:
            return replace(self, pending_embedder=identity, updated_at=time.time())
        return replace(self, embedder=identity, updated_at=time.time())

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CollectionRecord:
        raw = json.loads(data)
        return cls(
            collection=str(raw["collection"]),
            generation=int(raw.get("generation", 1)),
            embedder=EmbedderIdentity.from_dict(raw.get("embedder")),
            pending_generation=int(raw.get("pending_generation", 0)),
            pending_embedder=EmbedderIdentity.from_dict(raw.get("pending_embedder")),
            retired_generation=int(raw.get("retired_generation", 0)),
            switched_at=float(raw.get("switched_at", 0.0)),
            updated_at=float(raw.get("updated_at", 0.0)),
            calibration=Calibration.from_dict(raw.get("calibration")),
        )


def mismatch_message(collection: str, recorded: EmbedderIdentity, actual: EmbedderIdentity) -> str:
    return (
        f"collection {collection!r} was built with embedder {recorded.describe()}, but the embedder "
        f"now serves {actual.describe()}; vectors of different models cannot be mixed. Serve the "
        f"collection with the embedder that built it, or re-embed it with "
        f"`ragmesh reindex --collection {collection}`"
    )


def check_embedder(record: CollectionRecord | None, generation: int, actual: EmbedderIdentity) -> None:
    """FAILED_PRECONDITION when ``generation`` of the collection was built by another embedder."""
    if record is None:
        return
    recorded = record.embedder_of(generation)
    if recorded is not None and recorded != actual:
        raise failed_precondition(mismatch_message(record.collection, recorded, actual))


def retired_generation(collection: str, generation: int, record: CollectionRecord) -> ServiceError:
    return failed_precondition(
        f"generation {generation} of collection {collection!r} is no longer served "
        f"(generation {record.generation} is); the write was for a replaced generation"
    )


class RecordConflict(Exception):
    """The record kept changing under a compare-and-set."""


async def open_collections_bucket(js: JetStreamContext, replicas: int = 1) -> KeyValue:
    from nats.js.api import KeyValueConfig, StorageType

    try:
        return await js.key_value(COLLECTIONS_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return await js.create_key_value(
            KeyValueConfig(bucket=COLLECTIONS_BUCKET, history=1, storage=StorageType.FILE, replicas=replicas)
        )


class CollectionRegistry:
    """Reads and compare-and-sets the collection records of one KV bucket."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def get(self, collection: str) -> tuple[CollectionRecord | None, int]:
        try:
            entry = await self.kv.get(collection)
        except nats.js.errors.KeyNotFoundError:
            return None, 0
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return None, int(entry.revision or 0)
        return CollectionRecord.from_bytes(entry.value), int(entry.revision or 0)

    async def _put(self, record: CollectionRecord, revision: int) -> bool:
        """Write ``record`` if its entry is still at ``revision``; False when it moved on."""
        try:
            if revision == 0:
                await self.kv.create(record.collection, record.to_bytes())
            else:
                await self.kv.update(record.collection, record.to_bytes(), last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except nats.js.errors.APIError as exc:
            if exc.err_code in (10071, 10164):
                return False
            raise
        return True

    async def admit(self, physical: str, identity: EmbedderIdentity) -> CollectionRecord:
        """A writer's check before vectors made by ``identity`` go into store collection
        ``physical``: the generation's first write records the embedder, any later one must
        be made by the same (FAILED_PRECONDITION otherwise, also for a retired generation)."""
        collection, generation = split_physical(physical)
        for _ in range(_CAS_ATTEMPTS):
            record, revision = await self.get(collection)
            if record is None:
                record = CollectionRecord(collection=collection, generation=generation)
            elif generation not in (record.generation, record.pending_generation):
                raise retired_generation(collection, generation, record)
            check_embedder(record, generation, identity)
            if record.embedder_of(generation) == identity:
                return record
            if await self._put(record.with_embedder(generation, identity), revision):
                log.info(
                    "collection embedder recorded",
                    extra={"collection": collection, "generation": generation, "model": identity.model},
                )
                return record.with_embedder(generation, identity)
        raise RecordConflict(collection)

    async def update(
        self, collection: str, change: Callable[[CollectionRecord | None], CollectionRecord]
    ) -> CollectionRecord:
        """Apply ``change(record or None) -> CollectionRecord`` by compare-and-set."""
        for _ in range(_CAS_ATTEMPTS):
            record, revision = await self.get(collection)
            updated = change(record)
            if updated == record or await self._put(updated, revision):
                return updated
        raise RecordConflict(collection)


class CachedRecords:
    """Collection records as a reader sees them: each kept ``ttl_s`` seconds, so a search costs
    no KV round trip; a switch reaches every reader within ``ttl_s`` (ragmesh reindex waits
    longer than that before it drops the old generation). When NATS cannot answer, the last
    record read is used, and a collection never read is served as generation 1, unchecked."""

    def __init__(self, registry: CollectionRegistry, ttl_s: float) -> None:
        self.registry = registry
        self.ttl_s = ttl_s
        self._known: dict[str, tuple[float, CollectionRecord | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, collection: str) -> CollectionRecord | None:
        cached = self._known.get(collection)
        if cached is not None and time.monotonic() - cached[0] < self.ttl_s:
            return cached[1]
        lock = self._locks.setdefault(collection, asyncio.Lock())
        async with lock:
            cached = self._known.get(collection)
            if cached is not None and time.monotonic() - cached[0] < self.ttl_s:
                return cached[1]
            try:
                record, _ = await asyncio.wait_for(self.registry.get(collection), timeout=2.0)
            except (TimeoutError, nats.errors.Error) as exc:
                log.warning(
                    "collection record unreadable", extra={"collection": collection, "error": repr(exc)}
                )
                return cached[1] if cached is not None else None
            self._known[collection] = (time.monotonic(), record)
            return record
