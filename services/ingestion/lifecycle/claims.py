"""The workers' side of the lifecycle: the decisions that claim a document for an event
(``claim_decision``), renew the claim's lease (``renew_decision``) and record its outcome
(``finish_decision``), each naming its transition, and ``holds``, whether a status still names
a claim (its owner and fence).

A claim counts one attempt and charges one up front; a transient failure gives the charge
back and is bounded by time instead; a claim or a counted failure that finds the charge at
``ingest_max_deliver`` gives up (dead-letters) itself.
"""

from __future__ import annotations

from dataclasses import replace

from meshkit.settings import IngestionSettings
from services.ingestion.events import IngestEvent
from services.ingestion.lifecycle.buckets import Decide, Decision, Keep, Write
from services.ingestion.lifecycle.entries import DocStatus, is_current, waiting_state
from services.ingestion.lifecycle.machine import DELETED, DELETING, FAILED, INDEXED, PROCESSING, Event
from services.ingestion.lifecycle.outcomes import (
    PERMANENT,
    TRANSIENT,
    Busy,
    Claim,
    Done,
    Failure,
    GiveUp,
    Lost,
    Retry,
    Skip,
    Success,
    Superseded,
)
from services.ingestion.lifecycle.requests import PREPARATION_VERSION
from services.ingestion.lifecycle.retry import busy_delay, counted_delay, transient_delay


def holds(status: DocStatus | None, claim: Claim) -> bool:
    """Whether ``status`` is still ``claim``'s: processing, under its owner and fence."""
    return (
        status is not None
        and status.state == PROCESSING
        and status.owner == claim.owner
        and status.fence == claim.fence
    )


def claim_decision(event: IngestEvent, owner: str, settings: IngestionSettings) -> Decide:
    """Take the document for ``event``, or say why not (``Skip``, ``Busy``, ``GiveUp``)."""
    limit = settings.ingest_max_deliver

    def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
        if current is None:
            return Keep(Skip("the document has no status (its submission never committed)"))
        if not is_current(current, event):
            return Keep(Skip("superseded by a newer request", superseded=True))
        if current.state in (INDEXED, DELETED):
            return Keep(Skip(f"already {current.state}"))
        if current.state == FAILED:
            return Keep(GiveUp(current.reason, current.attempts))
        if current.state == PROCESSING and current.lease_until > now and current.owner != owner:
            return Keep(Busy(busy_delay(settings, current.lease_until - now)))
        if current.charged >= limit:
            last = (
                "a worker stopped mid-document (its lease expired)"
                if current.state == PROCESSING
                else current.reason or "unknown"
            )
            reason = f"gave up after {current.charged} attempts; last error: {last}"
            failed = current.with_changes(state=FAILED, owner="", lease_until=0.0, reason=reason)
            return Write(failed, GiveUp(reason, current.attempts), Event.GIVE_UP)
        claimed = current.with_changes(
            state=PROCESSING,
            request=current.request or event,
            owner=owner,
            fence=revision,
            lease_until=now + settings.ingest_lease_s,
            attempts=current.attempts + 1,
            charged=current.charged + 1,
        )
        return Write(claimed, Claim(event, owner, revision, claimed), Event.CLAIM)

    return decide


def renew_decision(claim: Claim, settings: IngestionSettings) -> Decide:
    """Extend the claim's lease (answers True), or answer False: it was taken over."""

    def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
        if not holds(current, claim):
            return Keep(False)
        assert current is not None
        renewed = current.with_changes(lease_until=now + settings.ingest_lease_s)
        return Write(renewed, True, Event.RENEW)

    return decide


def finish_decision(claim: Claim, outcome: Success | Failure, settings: IngestionSettings) -> Decide:
    """Record the claim's outcome and release it (``Lost``: the claim was taken over)."""
    limit = settings.ingest_max_deliver
    window = settings.ingest_transient_retry_window_s

    def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
        if not holds(current, claim):
            return Keep(Lost())
        assert current is not None
        released = current.with_changes(owner="", lease_until=0.0)
        if not is_current(current, claim.event):
            return _superseded(released, current, outcome)
        if isinstance(outcome, Success):
            return _succeeded(released, outcome)
        waiting = waiting_state(current.request)
        delete = waiting == DELETING
        if outcome.kind == PERMANENT:
            failed = replace(released, state=FAILED, reason=outcome.reason)
            return Write(failed, GiveUp(outcome.reason, current.attempts), Event.FAIL_PERMANENTLY)
        if outcome.kind == TRANSIENT:
            since = current.transient_since or now
            if now - since >= window:
                reason = f"{outcome.reason} for more than {window:g} s"
                failed = replace(released, state=FAILED, reason=reason)
                return Write(failed, GiveUp(reason, current.attempts), Event.FAIL_TRANSIENTLY_PAST_WINDOW)
            retries = current.retries + 1
            waits = replace(
                released,
                state=waiting,
                reason=f"waiting: {outcome.reason}",
                charged=max(0, current.charged - 1),
                transient_since=since,
                retries=retries,
            )
            event = Event.FAIL_TRANSIENTLY_DELETE if delete else Event.FAIL_TRANSIENTLY
            return Write(waits, Retry(transient_delay(settings, retries)), event)
        if current.charged >= limit:
            reason = f"gave up after {current.charged} attempts; last error: {outcome.reason}"
            failed = replace(released, state=FAILED, reason=reason)
            return Write(failed, GiveUp(reason, current.attempts), Event.FAIL_COUNTED_LAST)
        again = replace(
            released, state=waiting, reason=f"retrying: {outcome.reason}", transient_since=0.0, retries=0
        )
        event = Event.FAIL_COUNTED_DELETE if delete else Event.FAIL_COUNTED
        return Write(again, Retry(counted_delay(settings, current.charged)), event)

    return decide


def _superseded(released: DocStatus, current: DocStatus, outcome: Success | Failure) -> Write:
    """A newer request was recorded while the claim ran: the document waits for its event
    (what was indexed meanwhile is noted)."""
    if isinstance(outcome, Success):
        released = replace(
            released,
            indexed_sha256=outcome.indexed_sha256,
            indexed_version=PREPARATION_VERSION,
            chunks=outcome.chunks,
        )
    state = waiting_state(current.request)
    event = Event.FINISH_SUPERSEDED_BY_DELETE if state == DELETING else Event.FINISH_SUPERSEDED
    return Write(replace(released, state=state), Superseded(), event)


def _succeeded(released: DocStatus, outcome: Success) -> Write:
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
    return Write(done, Done(), Event.SUCCEED_DELETE if outcome.deleted else Event.SUCCEED)
