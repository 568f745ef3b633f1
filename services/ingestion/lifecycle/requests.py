"""The API's side of the lifecycle: whether a submission or delete needs a new request at all
(``unneeded``: unchanged, pending, absent; ``PREPARATION_VERSION`` decides when indexed bytes
must be prepared again), the decisions that record a request or replay a dead letter
(``request_decision``, ``replay_decision``: which transition, with what entry) and what they
did (``Requested``, ``Replayed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from services.ingestion.events import DELETE_TARGET, IngestEvent
from services.ingestion.lifecycle.buckets import Decide, Decision, Keep, Write
from services.ingestion.lifecycle.entries import DocStatus, is_current, waiting_state
from services.ingestion.lifecycle.machine import (
    DELETED,
    FAILED,
    INDEXED,
    PENDING_STATES,
    PROCESSING,
    QUEUED,
    Event,
)

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


def request_decision(event: IngestEvent) -> Decide:
    """Record ``event`` as the document's current request, unless ``unneeded`` says why not.
    A document a worker holds keeps its claim: only the request changes."""

    def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
        needless = unneeded(current, event)
        if needless is not None:
            return Keep(needless)
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
        if claimed:
            return Write(updated, REQUESTED, Event.REQUEST_WHILE_CLAIMED)
        return Write(updated, REQUESTED, Event.DELETE if event.op == "delete" else Event.SUBMIT)

    return decide


def replay_decision(letter: IngestEvent, requeued: IngestEvent) -> Decide:
    """Requeue the dead letter ``letter`` as the new request ``requeued`` if it is still the
    document's current request and the document is FAILED; else it is superseded."""

    def decide(current: DocStatus | None, revision: int, now: float) -> Decision:
        if current is None or current.state != FAILED or not is_current(current, letter):
            return Keep(Replayed("superseded"))
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
        event = Event.REPLAY_DELETE if requeued.op == "delete" else Event.REPLAY
        return Write(updated, Replayed(REQUEUED, requeued), event)

    return decide
