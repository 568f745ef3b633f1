"""The reconciler: no document is left waiting with no event to process it.

A request is committed when the API (or a replay) writes the status; its event is published
right after. Whatever crashes between the two (the API process, its connection to NATS, a
cancelled call), the document would wait forever. Every worker runs a reconciler: it follows
the status bucket, and for a document in a pending state (queued, processing, deleting) whose
status has not changed for ``ingest_reconcile_grace_s`` it looks up the last event on the
document's subject (one ``get_last_msg``: subjects are per document); if that is not the
current request, it publishes the request's event again. Several reconcilers may do it at
once: the publish carries a message id made of the request id and the status revision, so the
server keeps one, and a duplicate event anyway only finds its work done.

It holds only the documents in a pending state, each as a small ``Waiting`` record (revision,
last change, request id: about 200 bytes), never their statuses: the entries of documents in a
final state are recognised by their state alone (``entries.entry_state``, without decoding
them) and dropped, so a worker's memory follows its backlog, not the collection. The request to
republish is read from the bucket when it is needed (it is read anyway, to act only on the
status as it is now).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import NamedTuple

import nats.js.errors
from nats.js import JetStreamContext
from prometheus_client import Counter

from meshkit.settings import IngestionSettings
from services.ingestion.events import IngestEvent, MalformedEvent, subject_for
from services.ingestion.lifecycle.entries import DocStatus, entry_state
from services.ingestion.lifecycle.machine import PENDING_STATES
from services.ingestion.lifecycle.store import Lifecycle
from services.ingestion.lifecycle.view import follow_statuses
from services.ingestion.topology import publish_event

log = logging.getLogger(__name__)

REPUBLISHED = Counter(
    "ragmesh_ingest_reconciled_total", "Events republished for documents that had none pending."
)
# A document found with its event pending is looked at again only after this many grace
# periods (or when its status changes): events leave the stream only when they are handled.
RECHECK_FACTOR = 10
# Lookups per sweep: a large backlog is worked through over several sweeps.
SWEEP_LIMIT = 1000
WATCH_RETRY_S = 2.0


class Waiting(NamedTuple):
    """A document in a pending state, as the reconciler keeps it."""

    revision: int
    # When its status last changed (DocStatus.updated_at).
    updated_at: float
    # Its current request's id ("" for a request published before requests had ids).
    request_id: str


def waiting_entry(revision: int, data: bytes) -> Waiting | None:
    """The ``Waiting`` record of a status entry in a pending state that records a request; None
    for any other (a final state is recognised without decoding the entry)."""
    if entry_state(data) not in PENDING_STATES:
        return None
    raw = json.loads(data)
    request = raw.get("request")
    if not isinstance(request, dict):
        return None  # nothing to republish
    return Waiting(revision, float(raw.get("updated_at") or 0.0), str(request.get("request_id") or ""))


class Reconciler:
    def __init__(self, js: JetStreamContext, lifecycle: Lifecycle, settings: IngestionSettings) -> None:
        self.js = js
        self.lifecycle = lifecycle
        self.settings = settings
        # Documents in a pending state (with a request to republish), and only those.
        self.waiting: dict[str, Waiting] = {}
        # key -> (revision, when) of the last lookup that found the current event pending.
        self._checked: dict[str, tuple[int, float]] = {}
        self.ready = asyncio.Event()

    def apply(self, key: str, revision: int, status: DocStatus | None) -> None:
        """A decoded status (None: deleted)."""
        pending = status is not None and status.state in PENDING_STATES and status.request is not None
        record = Waiting(revision, status.updated_at, status.request_id) if pending and status else None
        self._keep(key, revision, record)

    def apply_entry(self, key: str, revision: int, data: bytes | None) -> None:
        """A status entry's bytes as the watch delivers them (None: deleted)."""
        held = self.waiting.get(key)
        if held is not None and held.revision >= revision:
            return
        self._keep(key, revision, waiting_entry(revision, data) if data else None)

    def _keep(self, key: str, revision: int, record: Waiting | None) -> None:
        held = self.waiting.get(key)
        if held is not None and held.revision >= revision:
            return
        if record is None:
            self.waiting.pop(key, None)
            self._checked.pop(key, None)
            return
        self.waiting[key] = record

    async def run(self, stopping: asyncio.Event) -> None:
        follower = asyncio.create_task(self._follow(stopping))
        try:
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.settings.ingest_reconcile_interval_s)
                    return
                if self.ready.is_set():
                    try:
                        await self.sweep()
                    except Exception:
                        log.exception("reconciler sweep failed")
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower

    async def _follow(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                watcher = await self.lifecycle.status_kv.watchall()
                await follow_statuses(watcher, self.apply_entry, self.ready)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("status watch ended; starting it again", exc_info=True)
            await asyncio.sleep(WATCH_RETRY_S)

    async def sweep(self, now: float | None = None) -> int:
        """Republish the event of every document that waited past the grace period with none
        pending; returns how many were republished."""
        now = time.time() if now is None else now
        grace = self.settings.ingest_reconcile_grace_s
        republished = looked_up = 0
        for key, waiting in list(self.waiting.items()):
            if looked_up >= SWEEP_LIMIT:
                break
            if now - waiting.updated_at < grace:
                continue
            checked = self._checked.get(key)
            if (
                checked is not None
                and checked[0] == waiting.revision
                and now - checked[1] < grace * RECHECK_FACTOR
            ):
                continue
            looked_up += 1
            if await self._event_pending(key, waiting.request_id):
                self._checked[key] = (waiting.revision, now)
                continue
            # The watch may lag: act only on the status as it is now.
            current = await self.lifecycle.status(key)
            status: DocStatus | None = current.value
            if current.revision != waiting.revision or status is None or status.request is None:
                continue
            await publish_event(
                self.js, self.settings, status.request, f"re-{status.request.request_id}-{waiting.revision}"
            )
            self._checked[key] = (waiting.revision, now)
            republished += 1
            REPUBLISHED.inc()
            log.warning(
                "republished the event of a document that had none pending",
                extra={"collection": status.collection, "doc_id": status.doc_id, "state": status.state},
            )
        return republished

    async def _event_pending(self, key: str, request_id: str) -> bool:
        """Whether the last event on the document's subject is its current request's."""
        try:
            raw = await self.js.get_last_msg(self.settings.ingest_stream, subject_for(key))
        except nats.js.errors.NotFoundError:
            return False
        try:
            pending = IngestEvent.from_bytes(raw.data or b"")
        except MalformedEvent:
            return False
        return pending.request_id == request_id
