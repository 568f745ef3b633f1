"""One home for a document's lifecycle: its states, the transitions between them and every
compare-and-set on the two JetStream key-value buckets that hold them. The API, the workers,
the pipeline and the reconciler call this module; none of them writes a bucket directly.

Both buckets are keyed by ``meshkit.domain.ids.doc_key(collection, doc_id)``:

- **status**: the document's state, its *current request* (the ingest event of the latest
  submission, delete or replay: the status write is the commit point of a request, and its
  event is published after), the claim of the worker processing it (owner, fence, lease) and
  the attempt counters.
- **records** (the record manager): what the stores hold for the document: content hash,
  chunk ids, object key, and the fence of the claim that wrote it.

**Fencing.** A claim is a compare-and-set of the status at revision R; R is the claim's fence
and is written into the claimed entry. A later claim of the same document must compare-and-set
a revision at least as new as the one our claim wrote, so fences of one document strictly
increase. Every later write of the claim holder (lease renewal, record, outcome) succeeds only
while the entry still names this owner *and* this fence, so a worker whose lease expired and
whose document was claimed again has every write refused. The stores get the fence too
(``DocumentReplacement.fence``) and refuse a replacement older than one they applied.

**Attempts.** JetStream redelivers without limit (the consumer's max_deliver is -1); the
lifecycle counts processing attempts itself. ``attempts`` counts every claim of the current
request; ``charged`` counts those that count against ``ingest_max_deliver``: a claim charges
one up front (a worker that dies mid-document leaves it charged) and a transient
infrastructure failure gives it back. Transient failures are bounded by time instead
(``ingest_transient_retry_window_s``); a document held by another live worker is "busy" and
costs nothing. A claim that finds the charge at the limit dead-letters the document itself:
no advisory subscription, no other process involved.

The state machine is ``TRANSITIONS`` (services/ingestion/lifecycle_states.py, rendered in
docs/ARCHITECTURE.md); every write checks that it follows it. This module holds the
``Lifecycle`` itself (reads and compare-and-set writes of both buckets); beside it:
``lifecycle_entries`` (the bucket entries), ``lifecycle_requests`` (the API's side: whether a
request is needed and what recording it did), ``lifecycle_outcomes`` (the workers' side:
claims and outcomes) and ``lifecycle_retry`` (compare-and-set conflicts and their retry
policy).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from meshkit.settings import IngestionSettings
from services.ingestion.events import IngestEvent
from services.ingestion.lifecycle_entries import DocRecord, DocStatus, Versioned, is_current, waiting_state
from services.ingestion.lifecycle_outcomes import (
    PERMANENT,
    TRANSIENT,
    Busy,
    Claim,
    ClaimLost,
    ClaimResult,
    Done,
    Failure,
    FinishResult,
    GiveUp,
    Lost,
    Retry,
    Skip,
    Success,
    Superseded,
)
from services.ingestion.lifecycle_requests import (
    PREPARATION_VERSION,
    REQUESTED,
    REQUEUED,
    Replayed,
    Requested,
    unneeded,
)
from services.ingestion.lifecycle_retry import CAS_POLICY, Conflict, RetryPolicy
from services.ingestion.lifecycle_states import (
    DELETED,
    DELETING,
    FAILED,
    INDEXED,
    NEW,
    PROCESSING,
    check_transition,
)

STATUS_BUCKET = "ragmesh_doc_status"
RECORDS_BUCKET = "ragmesh_doc_records"


# --- decisions of a compare-and-set ----------------------------------------------------------


@dataclass(frozen=True)
class _Write:
    status: DocStatus
    result: Any
    event: str


@dataclass(frozen=True)
class _Keep:
    result: Any


Decision = _Write | _Keep


# --- the lifecycle ----------------------------------------------------------------------------


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


class Lifecycle:
    def __init__(
        self,
        status: KeyValue,
        records: KeyValue,
        settings: IngestionSettings,
        *,
        policy: RetryPolicy = CAS_POLICY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.status_kv = status
        self.records_kv = records
        self.settings = settings
        self.policy = policy
        self.clock = clock

    @classmethod
    async def open(cls, js: JetStreamContext, settings: IngestionSettings) -> Lifecycle:
        status, records = await open_buckets(js, settings.nats_stream_replicas)
        return cls(status, records, settings)

    # --- reads ----------------------------------------------------------------------------

    @staticmethod
    async def _get(kv: KeyValue, key: str) -> tuple[bytes | None, int]:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None, 0
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return None, int(entry.revision or 0)
        return entry.value, int(entry.revision or 0)

    async def status(self, key: str) -> Versioned:
        data, revision = await self._get(self.status_kv, key)
        return Versioned(DocStatus.from_bytes(data) if data else None, revision)

    async def record(self, key: str) -> Versioned:
        data, revision = await self._get(self.records_kv, key)
        return Versioned(DocRecord.from_bytes(data) if data else None, revision)

    # --- compare-and-set --------------------------------------------------------------------

    @staticmethod
    async def _cas(kv: KeyValue, key: str, data: bytes | None, revision: int) -> int:
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

    async def _update_status(
        self, key: str, decide: Callable[[DocStatus | None, int, float], Decision]
    ) -> tuple[Any, int, DocStatus | None]:
        """Read, decide, compare-and-set; again on conflict, under the one retry policy.
        Returns the decision's result with the revision and status it left."""

        async def attempt() -> tuple[Any, int, DocStatus | None]:
            current = await self.status(key)
            decision = decide(current.value, current.revision, self.clock())
            if isinstance(decision, _Keep):
                return decision.result, current.revision, current.value
            source = current.value.state if current.value else NEW
            check_transition(source, decision.event, decision.status.state)
            revision = await self._cas(self.status_kv, key, decision.status.to_bytes(), current.revision)
            return decision.result, revision, decision.status

        return await self.policy.run(attempt)

    # --- the API: requests ------------------------------------------------------------------

    async def request(self, event: IngestEvent) -> Requested:
        """Record ``event`` as the document's current request: the commit point of a
        submission or delete. Its event is published after; if that publish never happens
        the reconciler publishes it."""

        def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
            needless = unneeded(current, event)
            if needless is not None:
                return _Keep(needless)
            base = current or DocStatus(event.collection, event.doc_id, waiting_state(event))
            claimed = base.state == PROCESSING
            updated = base.with_changes(
                state=PROCESSING if claimed else waiting_state(event),
                request=event,
                target_sha256=event.target,
                reason="",
                attempts=0,
                charged=0,
                transient_since=0.0,
                retries=0,
            )
            name = "submit / delete" if claimed else ("delete" if event.op == "delete" else "submit")
            return _Write(updated, REQUESTED, name)

        outcome, revision, status = await self._update_status(event.key, decide)
        return Requested(outcome, revision, status)

    async def replay(self, letter: IngestEvent, request_id: str) -> Replayed:
        """Requeue a dead letter as a new request ``request_id`` if it is still the
        document's current request and the document is FAILED; else it is superseded."""
        requeued = replace(letter, request_id=request_id, submitted_at=self.clock())

        def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
            if current is None or current.state != FAILED or not is_current(current, letter):
                return _Keep(Replayed("superseded"))
            updated = current.with_changes(
                state=waiting_state(requeued),
                request=requeued,
                target_sha256=requeued.target,
                reason="",
                attempts=0,
                charged=0,
                transient_since=0.0,
                retries=0,
            )
            name = "replay (delete)" if requeued.op == "delete" else "replay"
            return _Write(updated, Replayed(REQUEUED, requeued), name)

        result, revision, status = await self._update_status(letter.key, decide)
        return replace(result, revision=revision, status=status)

    # --- the workers: claims and outcomes ---------------------------------------------------

    def _busy_delay(self, lease_left_s: float) -> float:
        return max(0.5, min(self.settings.ingest_busy_delay_s, lease_left_s + 0.5))

    async def claim(self, event: IngestEvent, owner: str) -> ClaimResult:
        """Take the document for ``event``, or say why not. ``owner`` may take over a claim
        of its own (one whose outcome it could not record): the caller guarantees that none of
        its jobs is still working on the document."""
        limit = self.settings.ingest_max_deliver

        def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
            if current is None:
                return _Keep(Skip("the document has no status (its submission never committed)"))
            if not is_current(current, event):
                return _Keep(Skip("superseded by a newer request", superseded=True))
            if current.state in (INDEXED, DELETED):
                return _Keep(Skip(f"already {current.state}"))
            if current.state == FAILED:
                return _Keep(GiveUp(current.reason, current.attempts))
            if current.state == PROCESSING and current.lease_until > now and current.owner != owner:
                return _Keep(Busy(self._busy_delay(current.lease_until - now)))
            if current.charged >= limit:
                last = (
                    "a worker stopped mid-document (its lease expired)"
                    if current.state == PROCESSING
                    else current.reason or "unknown"
                )
                reason = f"gave up after {current.charged} attempts; last error: {last}"
                failed = current.with_changes(state=FAILED, owner="", lease_until=0.0, reason=reason)
                return _Write(failed, GiveUp(reason, current.attempts), "give up")
            claimed = current.with_changes(
                state=PROCESSING,
                request=current.request or event,
                owner=owner,
                fence=revision,
                lease_until=now + self.settings.ingest_lease_s,
                attempts=current.attempts + 1,
                charged=current.charged + 1,
            )
            return _Write(claimed, Claim(event, owner, revision, claimed), "claim")

        result, _revision, _status = await self._update_status(event.key, decide)
        return result

    @staticmethod
    def holds(status: DocStatus | None, claim: Claim) -> bool:
        return (
            status is not None
            and status.state == PROCESSING
            and status.owner == claim.owner
            and status.fence == claim.fence
        )

    async def verify(self, claim: Claim) -> bool:
        """Whether the claim still stands; marks it lost when not."""
        if not claim.lost and not self.holds((await self.status(claim.key)).value, claim):
            claim.lost = True
        return not claim.lost

    async def renew(self, claim: Claim) -> bool:
        """Extend the claim's lease; False (and the claim marked lost) if it was taken over."""

        def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
            if not self.holds(current, claim):
                return _Keep(False)
            assert current is not None
            renewed = current.with_changes(lease_until=now + self.settings.ingest_lease_s)
            return _Write(renewed, True, "renew")

        held, _revision, status = await self._update_status(claim.key, decide)
        if held and status is not None:
            claim.status = status
        else:
            claim.lost = True
        return bool(held)

    async def commit_record(self, claim: Claim, record: DocRecord | None, base_revision: int) -> None:
        """Write the record (None: remove it) under the claim. The write compares against the
        revision the claim read before indexing; when another writer got in between, the claim
        is checked again and, still held, wins. Raises ClaimLost when it no longer holds."""
        revision = base_revision
        data = record.to_bytes() if record is not None else None

        async def attempt() -> None:
            nonlocal revision
            if not await self.verify(claim):
                raise ClaimLost(claim.key)
            if data is None and revision == 0:
                return
            try:
                await self._cas(self.records_kv, claim.key, data, revision)
            except Conflict:
                revision = (await self.record(claim.key)).revision
                raise

        await self.policy.run(attempt)

    def _retry_delay(self, charged: int) -> float:
        delays = self.settings.retry_backoffs() or [1.0]
        return delays[min(max(1, charged), len(delays)) - 1]

    def transient_delay(self, retries: int) -> float:
        """Capped exponential backoff with jitter for infrastructure failures."""
        first = (self.settings.retry_backoffs() or [1.0])[0]
        delay = min(self.settings.ingest_transient_backoff_max_s, first * 2 ** max(0, retries - 1))
        return float(delay * random.uniform(0.8, 1.2))

    async def finish(self, claim: Claim, outcome: Success | Failure) -> FinishResult:
        """Record the claim's outcome and release it."""
        limit = self.settings.ingest_max_deliver
        window = self.settings.ingest_transient_retry_window_s

        def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
            if not self.holds(current, claim):
                return _Keep(Lost())
            assert current is not None
            released = current.with_changes(owner="", lease_until=0.0)
            if not is_current(current, claim.event):
                if isinstance(outcome, Success):
                    released = replace(
                        released,
                        indexed_sha256=outcome.indexed_sha256,
                        indexed_version=PREPARATION_VERSION,
                        chunks=outcome.chunks,
                    )
                state = waiting_state(current.request)
                name = "finish (superseded by a delete)" if state == DELETING else "finish (superseded)"
                return _Write(replace(released, state=state), Superseded(), name)
            if isinstance(outcome, Success):
                done = replace(
                    released,
                    state=DELETED if outcome.deleted else INDEXED,
                    reason="",
                    indexed_sha256=outcome.indexed_sha256,
                    indexed_version=PREPARATION_VERSION,
                    chunks=outcome.chunks,
                    transient_since=0.0,
                    retries=0,
                )
                return _Write(done, Done(), "succeed (delete)" if outcome.deleted else "succeed")
            waiting = waiting_state(current.request)
            delete = waiting == DELETING
            if outcome.kind == PERMANENT:
                failed = replace(released, state=FAILED, reason=outcome.reason)
                return _Write(failed, GiveUp(outcome.reason, current.attempts), "fail permanently")
            if outcome.kind == TRANSIENT:
                since = current.transient_since or now
                if now - since >= window:
                    reason = f"{outcome.reason} for more than {window:g} s"
                    failed = replace(released, state=FAILED, reason=reason)
                    return _Write(
                        failed, GiveUp(reason, current.attempts), "fail transiently past the window"
                    )
                retries = current.retries + 1
                waits = replace(
                    released,
                    state=waiting,
                    reason=f"waiting: {outcome.reason}",
                    charged=max(0, current.charged - 1),
                    transient_since=since,
                    retries=retries,
                )
                name = "fail transiently (delete)" if delete else "fail transiently"
                return _Write(waits, Retry(self.transient_delay(retries)), name)
            if current.charged >= limit:
                reason = f"gave up after {current.charged} attempts; last error: {outcome.reason}"
                failed = replace(released, state=FAILED, reason=reason)
                return _Write(failed, GiveUp(reason, current.attempts), "fail (counted, last)")
            again = replace(
                released, state=waiting, reason=f"retrying: {outcome.reason}", transient_since=0.0, retries=0
            )
            name = "fail (counted, delete)" if delete else "fail (counted)"
            return _Write(again, Retry(self._retry_delay(current.charged)), name)

        result, _revision, _status = await self._update_status(claim.key, decide)
        if isinstance(result, Lost):
            claim.lost = True
        return result

    # --- object keys ------------------------------------------------------------------------

    async def object_in_use(self, key: str, object_key: str) -> bool:
        """Whether the current request or the current record still needs ``object_key``. A
        request, once replaced, never becomes current again (a replay requeues only the
        current one), so a key that is in neither is garbage for good."""
        status = (await self.status(key)).value
        if status is not None and status.request is not None and status.request.object_key == object_key:
            return True
        record = (await self.record(key)).value
        return record is not None and record.object_key == object_key
