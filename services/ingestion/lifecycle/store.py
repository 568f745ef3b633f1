"""The ``Lifecycle``: the one writer of a document's two key-value buckets. The API (requests,
replays), the workers (claims, renewals, records, outcomes), the pipeline and the reconciler
call it; none of them writes a bucket directly.

Each status write is a decision of ``requests`` (the API's side) or ``claims`` (the workers'
side) that names its transition, checked against the state machine (``machine``) and
compare-and-set by ``buckets.update_status``; the record is written under the claim
(``commit_record``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from meshkit.settings import IngestionSettings
from services.ingestion.events import IngestEvent
from services.ingestion.lifecycle import claims, requests
from services.ingestion.lifecycle.buckets import Decide, cas, open_buckets, read, read_status, update_status
from services.ingestion.lifecycle.entries import DocRecord, DocStatus, Versioned
from services.ingestion.lifecycle.outcomes import (
    Claim,
    ClaimLost,
    ClaimResult,
    Failure,
    FinishResult,
    Lost,
    Success,
)
from services.ingestion.lifecycle.requests import Replayed, Requested
from services.ingestion.lifecycle.retry import CAS_POLICY, Conflict, RetryPolicy, transient_delay


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

    async def status(self, key: str) -> Versioned:
        return await read_status(self.status_kv, key)

    async def record(self, key: str) -> Versioned:
        data, revision = await read(self.records_kv, key)
        return Versioned(DocRecord.from_bytes(data) if data else None, revision)

    # --- writes -----------------------------------------------------------------------------

    # Write (or delete, ``data`` None) ``key`` of a bucket if it is still at ``revision``.
    _cas = staticmethod(cas)

    async def _update_status(self, key: str, decide: Decide) -> tuple[Any, int, DocStatus | None]:
        return await update_status(self.status_kv, key, decide, policy=self.policy, clock=self.clock)

    # --- the API: requests ------------------------------------------------------------------

    async def request(self, event: IngestEvent) -> Requested:
        """Record ``event`` as the document's current request: the commit point of a
        submission or delete. Its event is published after; if that publish never happens
        the reconciler publishes it."""
        outcome, revision, status = await self._update_status(event.key, requests.request_decision(event))
        return Requested(outcome, revision, status)

    async def replay(self, letter: IngestEvent, request_id: str) -> Replayed:
        """Requeue a dead letter as a new request ``request_id`` if it is still the
        document's current request and the document is FAILED; else it is superseded."""
        requeued = replace(letter, request_id=request_id, submitted_at=self.clock())
        decide = requests.replay_decision(letter, requeued)
        result, revision, status = await self._update_status(letter.key, decide)
        return replace(result, revision=revision, status=status)

    # --- the workers: claims and outcomes ---------------------------------------------------

    async def claim(self, event: IngestEvent, owner: str) -> ClaimResult:
        """Take the document for ``event``, or say why not. ``owner`` may take over a claim
        of its own (one whose outcome it could not record): the caller guarantees that none of
        its jobs is still working on the document."""
        decide = claims.claim_decision(event, owner, self.settings)
        result, _revision, _status = await self._update_status(event.key, decide)
        return result

    holds = staticmethod(claims.holds)

    async def verify(self, claim: Claim) -> bool:
        """Whether the claim still stands; marks it lost when not."""
        if not claim.lost and not self.holds((await self.status(claim.key)).value, claim):
            claim.lost = True
        return not claim.lost

    async def renew(self, claim: Claim) -> bool:
        """Extend the claim's lease; False (and the claim marked lost) if it was taken over."""
        decide = claims.renew_decision(claim, self.settings)
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

    def transient_delay(self, retries: int) -> float:
        """Capped exponential backoff with jitter for infrastructure failures."""
        return transient_delay(self.settings, retries)

    async def finish(self, claim: Claim, outcome: Success | Failure) -> FinishResult:
        """Record the claim's outcome and release it."""
        decide = claims.finish_decision(claim, outcome, self.settings)
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
