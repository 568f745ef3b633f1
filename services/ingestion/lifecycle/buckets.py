"""The lifecycle's two JetStream key-value buckets and the primitives on them: opening them
(``open_buckets``), reading an entry with its revision (``read``), a compare-and-set (``cas``)
and ``update_status``, the one write of the status bucket: read, decide (``Write`` a
transition or ``Keep`` the entry), check the transition against the state machine, then
compare-and-set, again on conflict under the retry policy.

Both buckets are keyed by ``meshkit.domain.ids.doc_key(collection, doc_id)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from services.ingestion.lifecycle.entries import DocStatus, Versioned
from services.ingestion.lifecycle.machine import NEW, Event, check_transition
from services.ingestion.lifecycle.retry import Conflict, RetryPolicy

STATUS_BUCKET = "ragmesh_doc_status"
RECORDS_BUCKET = "ragmesh_doc_records"


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


async def read(kv: KeyValue, key: str) -> tuple[bytes | None, int]:
    """The entry's bytes (None: absent or deleted) and its revision (0: never written)."""
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:
        return None, 0
    if entry.value is None or entry.operation in ("DEL", "PURGE"):
        return None, int(entry.revision or 0)
    return entry.value, int(entry.revision or 0)


async def read_status(kv: KeyValue, key: str) -> Versioned:
    data, revision = await read(kv, key)
    return Versioned(DocStatus.from_bytes(data) if data else None, revision)


async def cas(kv: KeyValue, key: str, data: bytes | None, revision: int) -> int:
    """Write (or delete, ``data`` None) ``key`` if it is still at ``revision``."""
    try:
        if data is None:
            await kv.delete(key, last=revision)
            return 0
        if revision == 0:
            return int(await kv.create(key, data))
        return int(await kv.update(key, data, last=revision))
    except nats.js.errors.KeyWrongLastSequenceError as exc:
        raise Conflict(key) from exc
    except nats.js.errors.APIError as exc:
        # create() on a key that exists, or a stale ``last``, reports a wrong-sequence error.
        if exc.err_code in (10071, 10164):
            raise Conflict(key) from exc
        raise


# --- decisions of a compare-and-set ----------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """Write ``status``, which ``event`` brought to its state; answer ``result``."""

    status: DocStatus
    result: Any
    event: Event


@dataclass(frozen=True)
class Keep:
    """Leave the entry as it is; answer ``result``."""

    result: Any


Decision = Write | Keep
# (current status or None, its revision, now) -> what to do.
Decide = Callable[[DocStatus | None, int, float], Decision]


async def update_status(
    kv: KeyValue, key: str, decide: Decide, *, policy: RetryPolicy, clock: Callable[[], float]
) -> tuple[Any, int, DocStatus | None]:
    """Read, decide, check the transition, compare-and-set; again on conflict, under the one
    retry policy. Returns the decision's result with the revision and status it left. A
    decision the state machine does not allow raises IllegalTransition and writes nothing."""

    async def attempt() -> tuple[Any, int, DocStatus | None]:
        current = await read_status(kv, key)
        decision = decide(current.value, current.revision, clock())
        if isinstance(decision, Keep):
            return decision.result, current.revision, current.value
        source = current.value.state if current.value else NEW
        check_transition(source, decision.event, decision.status.state)
        revision = await cas(kv, key, decision.status.to_bytes(), current.revision)
        return decision.result, revision, decision.status

    return await policy.run(attempt)
