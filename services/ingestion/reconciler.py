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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats.js.errors
from nats.js import JetStreamContext
from prometheus_client import Counter

from meshkit.settings import IngestionSettings
from services.ingestion.events import IngestEvent, MalformedEvent
from services.ingestion.lifecycle import Lifecycle
from services.ingestion.lifecycle_entries import DocStatus
from services.ingestion.lifecycle_states import PENDING_STATES
from services.ingestion.status_view import follow_statuses
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


class Reconciler:
    def __init__(self, js: JetStreamContext, lifecycle: Lifecycle, settings: IngestionSettings) -> None:
        self.js = js
        self.lifecycle = lifecycle
        self.settings = settings
        # Documents in a pending state: key -> (revision, status).
        self.waiting: dict[str, tuple[int, DocStatus]] = {}
        # key -> (revision, when) of the last lookup that found the current event pending.
        self._checked: dict[str, tuple[int, float]] = {}
        self.ready = asyncio.Event()

    def apply(self, key: str, revision: int, status: DocStatus | None) -> None:
        held = self.waiting.get(key)
        if held is not None and held[0] >= revision:
            return
        if status is None or status.state not in PENDING_STATES:
            self.waiting.pop(key, None)
            self._checked.pop(key, None)
            return
        self.waiting[key] = (revision, status)

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
                await follow_statuses(watcher, self.apply, self.ready)
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
        for key, (revision, status) in list(self.waiting.items()):
            if looked_up >= SWEEP_LIMIT:
                break
            if status.request is None or now - status.updated_at < grace:
                continue
            checked = self._checked.get(key)
            if checked is not None and checked[0] == revision and now - checked[1] < grace * RECHECK_FACTOR:
                continue
            looked_up += 1
            if await self._event_pending(status.request):
                self._checked[key] = (revision, now)
                continue
            # The view may lag: act only on the status as it is now.
            current = await self.lifecycle.status(key)
            if current.revision != revision:
                continue
            await publish_event(
                self.js, self.settings, status.request, f"re-{status.request.request_id}-{revision}"
            )
            self._checked[key] = (revision, now)
            republished += 1
            REPUBLISHED.inc()
            log.warning(
                "republished the event of a document that had none pending",
                extra={"collection": status.collection, "doc_id": status.doc_id, "state": status.state},
            )
        return republished

    async def _event_pending(self, request: IngestEvent) -> bool:
        try:
            raw = await self.js.get_last_msg(self.settings.ingest_stream, request.subject)
        except nats.js.errors.NotFoundError:
            return False
        try:
            pending = IngestEvent.from_bytes(raw.data or b"")
        except MalformedEvent:
            return False
        return pending.request_id == request.request_id
