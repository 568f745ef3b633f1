"""One home for a document's lifecycle: its states, the transitions between them and every
compare-and-set on the two JetStream key-value buckets that hold them. The API, the workers,
the pipeline and the reconciler call this module; none of them writes a bucket directly.

Both buckets are keyed by ``meshkit.ids.doc_key(collection, doc_id)``:

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

The state machine is ``TRANSITIONS`` below (rendered in docs/ARCHITECTURE.md); every write
checks that it follows it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Final, Literal, TypeVar

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from meshkit.settings import IngestionSettings
from services.ingestion.events import DELETE_TARGET, IngestEvent, MalformedEvent

log = logging.getLogger(__name__)

STATUS_BUCKET = "ragmesh_doc_status"
RECORDS_BUCKET = "ragmesh_doc_records"

NEW = "new"  # no status entry yet (only as the source of a transition)
QUEUED = "queued"
PROCESSING = "processing"
INDEXED = "indexed"
FAILED = "failed"
DELETING = "deleting"
DELETED = "deleted"
STATES = (QUEUED, PROCESSING, INDEXED, FAILED, DELETING, DELETED)
FINAL_STATES = frozenset({INDEXED, FAILED, DELETED})
# States in which the document's current request still has to be processed: an event for it
# must be on the stream (the reconciler sees to it).
PENDING_STATES = frozenset({QUEUED, PROCESSING, DELETING})

T = TypeVar("T")


# --- the state machine ------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    sources: tuple[str, ...]
    event: str
    guard: str
    target: str
    who: str


_WAITING = (QUEUED, DELETING)
_ANY_REQUESTABLE = (NEW, QUEUED, DELETING, INDEXED, FAILED, DELETED)
_HOLDS = "holds the claim (owner and fence)"
TRANSITIONS: tuple[Transition, ...] = (
    Transition(
        _ANY_REQUESTABLE, "submit", "the bytes differ from the indexed and the pending version", QUEUED, "API"
    ),
    Transition((QUEUED, INDEXED, FAILED), "delete", "not deleted, no delete pending", DELETING, "API"),
    Transition(
        (PROCESSING,),
        "submit / delete",
        "a worker holds the claim: kept, only the request changes",
        PROCESSING,
        "API",
    ),
    Transition(
        (*_WAITING, PROCESSING),
        "claim",
        "event is the current request; lease expired or own claim; charged < max",
        PROCESSING,
        "worker",
    ),
    Transition(
        (*_WAITING, PROCESSING), "give up", "event is the current request; charged >= max", FAILED, "worker"
    ),
    Transition((PROCESSING,), "renew", _HOLDS, PROCESSING, "worker (heartbeat)"),
    Transition((PROCESSING,), "succeed", f"{_HOLDS}; request still current", INDEXED, "worker"),
    Transition((PROCESSING,), "succeed (delete)", f"{_HOLDS}; request still current", DELETED, "worker"),
    Transition(
        (PROCESSING,), "finish (superseded)", f"{_HOLDS}; a newer request was recorded", QUEUED, "worker"
    ),
    Transition(
        (PROCESSING,),
        "finish (superseded by a delete)",
        f"{_HOLDS}; a newer delete was recorded",
        DELETING,
        "worker",
    ),
    Transition(
        (PROCESSING,), "fail permanently", f"{_HOLDS}; the document cannot be processed", FAILED, "worker"
    ),
    Transition(
        (PROCESSING,),
        "fail transiently",
        f"{_HOLDS}; within the retry window; charge given back",
        QUEUED,
        "worker",
    ),
    Transition(
        (PROCESSING,), "fail transiently (delete)", f"{_HOLDS}; as above, for a delete", DELETING, "worker"
    ),
    Transition(
        (PROCESSING,),
        "fail transiently past the window",
        f"{_HOLDS}; failing longer than the window",
        FAILED,
        "worker",
    ),
    Transition((PROCESSING,), "fail (counted)", f"{_HOLDS}; charged < max", QUEUED, "worker"),
    Transition((PROCESSING,), "fail (counted, delete)", f"{_HOLDS}; charged < max", DELETING, "worker"),
    Transition((PROCESSING,), "fail (counted, last)", f"{_HOLDS}; charged >= max", FAILED, "worker"),
    Transition((FAILED,), "replay", "the dead letter's request is the current one", QUEUED, "API (operator)"),
    Transition(
        (FAILED,),
        "replay (delete)",
        "the dead letter's request is the current one",
        DELETING,
        "API (operator)",
    ),
)
# Not a transition: the reconciler republishes the current request's event of a document in
# a pending state that has no event on the stream (whatever crashed between a status write and
# its publish); the status is left as it is.


class IllegalTransition(AssertionError):
    """A write that does not follow TRANSITIONS: a bug, never a runtime condition."""


def check_transition(source: str, event: str, target: str) -> None:
    for t in TRANSITIONS:
        if t.event == event and source in t.sources and t.target == target:
            return
    raise IllegalTransition(f"{source} --{event}--> {target} is not in the lifecycle's transition table")


def transition_table() -> str:
    """TRANSITIONS as the Markdown table docs/ARCHITECTURE.md carries (a test keeps them equal)."""
    rows = ["| From | Event | Guard | To | Who |", "|---|---|---|---|---|"]
    for t in TRANSITIONS:
        rows.append(f"| {', '.join(t.sources)} | {t.event} | {t.guard} | {t.target} | {t.who} |")
    return "\n".join(rows)


# --- entries ----------------------------------------------------------------------------------


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


def is_current(status: DocStatus, event: IngestEvent) -> bool:
    """Whether ``event`` is the document's current request."""
    if event.request_id:
        return status.request_id == event.request_id
    # An event published before requests had ids: current if nothing newer replaced it.
    return not status.request_id and status.target_sha256 == event.target


def waiting_state(request: IngestEvent | None) -> str:
    """The state of a document whose request waits for a worker."""
    return DELETING if request is not None and request.op == "delete" else QUEUED


# --- outcomes ---------------------------------------------------------------------------------


class Conflict(Exception):
    """Another writer changed the entry since it was read."""


class Contended(Exception):
    """Compare-and-set kept conflicting for the whole retry policy: try again later."""


class ClaimLost(Exception):
    """The claim was taken over (its lease expired and another worker claimed the document):
    nothing may be written under it any more."""


# Infrastructure failures of the state store: the caller retries later, it costs no attempt.
STATE_STORE_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, Contended)

PERMANENT: Final = "permanent"
TRANSIENT: Final = "transient"
COUNTED: Final = "counted"
FailureKind = Literal["permanent", "transient", "counted"]


@dataclass(frozen=True)
class Failure:
    """Why processing failed. permanent: retrying cannot help (dead-letter now); transient:
    infrastructure, retried for a window without counting; counted: anything else."""

    reason: str
    kind: FailureKind


@dataclass(frozen=True)
class Success:
    indexed_sha256: str
    chunks: int
    deleted: bool


@dataclass
class Claim:
    """A worker's hold on a document's current request."""

    event: IngestEvent
    owner: str
    fence: int
    status: DocStatus
    lost: bool = False

    @property
    def key(self) -> str:
        return self.event.key


@dataclass(frozen=True)
class Skip:
    """Nothing to do for this event (superseded, already done): ack it. ``superseded``: its
    request was replaced, so its bytes may be dropped."""

    why: str
    superseded: bool = False


@dataclass(frozen=True)
class Busy:
    """Another live worker holds the document: look again after ``delay_s`` (costs nothing)."""

    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    """The document is FAILED: dead-letter the event with this reason and terminate it."""

    reason: str
    attempts: int


@dataclass(frozen=True)
class Retry:
    delay_s: float


@dataclass(frozen=True)
class Done:
    pass


@dataclass(frozen=True)
class Superseded:
    """A newer request was recorded while the claim ran; it waits for its own event."""


@dataclass(frozen=True)
class Lost:
    pass


ClaimResult = Claim | Skip | Busy | GiveUp
FinishResult = Done | Superseded | Retry | GiveUp | Lost

UNCHANGED: Final = "unchanged"
# What a document's bytes become (normalisation, chunking) has this version. Bump it with any
# change that alters chunk text: a document indexed by an older version is then re-indexed when
# it is submitted again instead of being UNCHANGED (2: Markdown front matter and shortcodes
# stripped; 3: front matter and tags as metadata, wikilinks resolved, heading-only pages).
PREPARATION_VERSION: Final = 3
PENDING: Final = "pending"
REQUESTED: Final = "requested"
ABSENT: Final = "absent"
RequestOutcome = Literal["unchanged", "pending", "requested", "absent"]


def unneeded(current: DocStatus | None, event: IngestEvent) -> RequestOutcome | None:
    """Why ``event`` needs no new request, given the document's status: its version is indexed
    (unchanged) or already waiting (pending), or it deletes nothing (absent). None: it does."""
    if event.op == "delete":
        if current is None or current.state == DELETED:
            return ABSENT
        if current.state in PENDING_STATES and current.target_sha256 == DELETE_TARGET:
            return PENDING
        return None
    if current is None or current.target_sha256 != event.content_sha256:
        return None
    if not _same_source(current.request, event):
        # Same bytes, new title, source URI or metadata: both stores must be told.
        return None
    if (
        current.state == INDEXED
        and current.indexed_sha256 == event.content_sha256
        and current.indexed_version == PREPARATION_VERSION
    ):
        return UNCHANGED
    if current.state in (QUEUED, PROCESSING):
        return PENDING
    return None


def _same_source(request: IngestEvent | None, event: IngestEvent) -> bool:
    """Whether ``event`` describes its document as ``request`` did (a status written before
    requests were recorded has nothing to compare: only the bytes count, as they did then)."""
    if request is None:
        return True
    return (request.title, request.source_uri, request.metadata) == (
        event.title,
        event.source_uri,
        event.metadata,
    )


@dataclass(frozen=True)
class Requested:
    """What recording a request did: requested (written), unchanged (that version is indexed),
    pending (that version is already waiting), absent (a delete of nothing)."""

    outcome: RequestOutcome
    revision: int
    status: DocStatus | None


REQUEUED: Final = "requeued"


@dataclass(frozen=True)
class Replayed:
    """requeued: ``event`` is the new current request, publish it; superseded: forget the letter."""

    outcome: Literal["requeued", "superseded"]
    event: IngestEvent | None = None
    revision: int = 0
    status: DocStatus | None = None


@dataclass(frozen=True)
class _Write:
    status: DocStatus
    result: Any
    event: str


@dataclass(frozen=True)
class _Keep:
    result: Any


Decision = _Write | _Keep


# --- the retry policy -------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """The one policy of every compare-and-set: conflicts are retried with jittered
    exponential backoff for up to ``deadline_s``, then Contended (a transient failure: the
    caller leaves its event unacknowledged, so nothing is lost)."""

    deadline_s: float = 10.0
    first_backoff_s: float = 0.005
    max_backoff_s: float = 0.25

    async def run(self, attempt: Callable[[], Awaitable[T]]) -> T:
        deadline = time.monotonic() + self.deadline_s
        delay = self.first_backoff_s
        while True:
            try:
                return await attempt()
            except Conflict as exc:
                if time.monotonic() >= deadline:
                    raise Contended(str(exc)) from exc
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(self.max_backoff_s, delay * 2)


CAS_POLICY = RetryPolicy()


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
