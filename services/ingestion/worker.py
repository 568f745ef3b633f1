"""Ingestion worker: a pull consumer on the ingest work-queue stream.

Each loop fetches a batch of events and claims each document through the lifecycle
(services/ingestion/lifecycle/: compare-and-set on its status, so two workers never both
own one, with a fence that refuses a stale owner's writes). The claimed jobs run through the
pipeline, and each event is settled as soon as its document has an outcome: ack on success,
nak with a delay on a failure worth retrying, dead-letter + term when the lifecycle gives up.
JetStream redelivers without limit; the lifecycle counts attempts. While jobs run, a heartbeat
keeps their events (in_progress) and their claims (lease) alive, so a slow document is not
redelivered to another worker, while a dead worker's events come back after ack_wait and are
claimed again once its lease has expired. Each worker also runs the reconciler
(services/ingestion/reconciler.py), which republishes the event of a document left waiting
without one.

Run as ``python -m services.ingestion.worker``; it serves gRPC health on RAGMESH_PORT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import Counter, Gauge

from meshkit.core.logs import new_request_id, request_id_var
from meshkit.domain.collections import CollectionRegistry, open_collections_bucket
from meshkit.rpc import tracing
from meshkit.rpc.server import REQUEST_SLACK_BYTES, ServiceSpec, run_service
from meshkit.settings import IngestionSettings
from meshkit.storage.natsconn import connect_options
from meshkit.storage.objectstore import ObjectStore
from services.ingestion.chunking import Chunker
from services.ingestion.deadletters import DeadLetters
from services.ingestion.events import IngestEvent, MalformedEvent
from services.ingestion.jobs import Job, JobFailure, Settle
from services.ingestion.lifecycle.outcomes import (
    Busy,
    Claim,
    ClaimResult,
    Done,
    Failure,
    GiveUp,
    Lost,
    Retry,
    Skip,
    Success,
    Superseded,
)
from services.ingestion.lifecycle.store import Lifecycle
from services.ingestion.pipeline import IngestPipeline
from services.ingestion.reconciler import Reconciler
from services.ingestion.stores import Stores
from services.ingestion.topology import ensure_topology

log = logging.getLogger("ingestion.worker")

IN_FLIGHT = Gauge("ragmesh_ingest_worker_in_flight", "Events being processed by this worker.")
SETTLED = Counter("ragmesh_ingest_events_settled_total", "Events settled, by how.", ["how"])
HEARTBEAT_WAIT_S = 5.0


class IngestWorker:
    def __init__(self, settings: IngestionSettings) -> None:
        self.settings = settings
        base = settings.ingest_worker_id or socket.gethostname()
        # Unique per incarnation: a restarted worker must not inherit its predecessor's claims.
        self.worker_id = f"{base}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.lifecycle: Lifecycle | None = None
        self.dead_letters: DeadLetters | None = None
        self.pipeline: IngestPipeline | None = None
        self.objects: ObjectStore | None = None
        self.stores: Stores | None = None
        self.reconciler: Reconciler | None = None
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._background: list[asyncio.Task[None]] = []
        # Documents this process is working on: another event of one of them (a redelivery, a
        # newer request) must wait, not run side by side with it.
        self._held: set[str] = set()

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        settings = self.settings
        self.nc = await nats.connect(
            **connect_options(settings),
            name=self.worker_id,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
        )
        self.js = self.nc.jetstream()
        await ensure_topology(self.js, settings)
        self.lifecycle = await Lifecycle.open(self.js, settings)
        self.dead_letters = DeadLetters(self.js, settings)
        self.stores = Stores.from_settings(settings)
        self.objects = ObjectStore.from_settings(settings)
        await self.objects.ensure_bucket(settings.documents_bucket)
        chunker = Chunker.from_settings(settings)
        bucket = await open_collections_bucket(self.js, settings.nats_stream_replicas)
        collections = CollectionRegistry(bucket)
        self.pipeline = IngestPipeline(
            settings, self.objects, self.lifecycle, self.stores, chunker, collections
        )
        self.reconciler = Reconciler(self.js, self.lifecycle, settings)
        self._background = [asyncio.create_task(self.reconciler.run(self._stopping))]
        loops = max(1, settings.ingest_max_in_flight // max(1, settings.ingest_fetch_batch))
        self._loops = [asyncio.create_task(self._run_loop(i)) for i in range(loops)]
        log.info("worker started", extra={"worker_id": self.worker_id, "loops": loops})

    async def stop(self) -> None:
        """Finish the jobs in hand (their events are acked or nak'ed), then disconnect."""
        self._stopping.set()
        if self._loops:
            _done, pending = await asyncio.wait(self._loops, timeout=self.settings.shutdown_grace_s)
            for task in pending:
                task.cancel()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.pipeline:
            await self.pipeline.close()
        if self.stores:
            await self.stores.close()
        if self.nc:
            with contextlib.suppress(Exception):
                await self.nc.drain()

    # --- the loop ---------------------------------------------------------------------------

    async def _run_loop(self, index: int) -> None:
        assert self.js is not None
        subscription = None
        while not self._stopping.is_set():
            try:
                if subscription is None:
                    subscription = await self.js.pull_subscribe_bind(
                        durable=self.settings.ingest_consumer, stream=self.settings.ingest_stream
                    )
                msgs = await subscription.fetch(self.settings.ingest_fetch_batch, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except Exception:
                log.exception("fetch failed; retrying", extra={"loop": index})
                subscription = None
                await asyncio.sleep(1.0)
                continue
            try:
                await self.handle_batch(msgs)
            except Exception:
                # Unsettled events come back after ack_wait; the loop must outlive any batch.
                log.exception("batch failed", extra={"loop": index})
                await asyncio.sleep(0.5)
        if subscription is not None:
            # A pull subscription left in place makes the connection's drain wait its timeout.
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def handle_batch(self, msgs: list[Msg]) -> None:
        token = request_id_var.set(new_request_id())
        IN_FLIGHT.inc(len(msgs))
        # Jobs not settled yet, by id: the heartbeat keeps exactly these alive.
        pending: dict[int, tuple[Msg, Job]] = {}
        try:
            claimed = await asyncio.gather(*(self._claim(msg) for msg in msgs))
            for msg, job in zip(msgs, claimed, strict=True):
                if job is not None:
                    pending[id(job)] = (msg, job)
            if not pending:
                return

            async def settle(job: Job) -> None:
                entry = pending.pop(id(job), None)
                if entry is not None:
                    await self._settle(entry[0], job)

            done = asyncio.Event()
            heartbeat = asyncio.create_task(self._heartbeat(pending, done))
            try:
                await self._process(pending, settle)
            finally:
                # nats-py's flush swallows cancellation (NATS killed mid-batch left the heartbeat
                # looping and the batch waiting on it for good): the event ends the loop, and the
                # wait is bounded so a heartbeat stuck in the client never holds the batch.
                done.set()
                heartbeat.cancel()
                await asyncio.wait({heartbeat}, timeout=HEARTBEAT_WAIT_S)
        finally:
            # Jobs never settled (an error above): their events come back after ack_wait.
            self._held.difference_update(job.key for _msg, job in pending.values())
            IN_FLIGHT.dec(len(msgs))
            request_id_var.reset(token)

    async def _process(self, pending: dict[int, tuple[Msg, Job]], settle: Settle) -> None:
        """The pipeline under a watchdog: jobs stuck on a hung downstream are given up and
        settled as failed attempts, instead of holding their documents PROCESSING forever."""
        assert self.pipeline is not None
        timeout = self.settings.ingest_batch_timeout_s
        jobs = [job for _msg, job in pending.values()]
        try:
            await asyncio.wait_for(self.pipeline.process(jobs, settle), timeout)
        except TimeoutError:
            log.error("jobs timed out", extra={"documents": len(pending)})
            for _msg, job in list(pending.values()):
                job.failure = job.failure or JobFailure(f"not done within {timeout:g} s", permanent=False)
                await settle(job)

    # --- claims ----------------------------------------------------------------------------

    async def _claim(self, msg: Msg) -> Job | None:
        """Own the document for this event, or settle the event right away. The event's span
        (a child of its publisher's) lasts until the event is settled."""
        trace = tracing.start_consumer_span(msg.subject, msg.headers)
        job: Job | None = None
        try:
            job = await self._claim_event(msg, trace)
            return job
        finally:
            if job is None:
                tracing.finish(trace, outcome="not claimed")

    async def _claim_event(self, msg: Msg, trace: tracing.Incoming | None) -> Job | None:
        assert self.lifecycle is not None
        try:
            event = IngestEvent.from_bytes(msg.data)
        except MalformedEvent as exc:
            # A parser's text (json's) stays in this log; the letter's reason is ours.
            log.warning("malformed event", extra={"reason": str(exc), "detail": repr(exc.__cause__)})
            await self._dead_letter(msg, None, f"malformed event: {exc}", 1)
            return None
        key = event.key
        if key in self._held:
            await self._nak(msg, self.settings.ingest_busy_delay_s, "busy here")
            return None
        self._held.add(key)  # reserved before the first await: claims in one batch race
        job: Job | None = None
        try:
            result: ClaimResult = await self.lifecycle.claim(event, self.worker_id)
            if isinstance(result, Claim):
                job = Job(event=event, claim=result, trace=trace)
                return job
            await self._settle_unclaimed(msg, event, result)
            return None
        except Exception as exc:
            # The state store is unreachable: an infrastructure failure, no attempt counted.
            log.warning("claim failed", extra={"doc_id": event.doc_id, "error": repr(exc)})
            delivered = msg.metadata.num_delivered if msg.metadata else 1
            await self._nak(msg, self.lifecycle.transient_delay(delivered or 1), "claim failed")
            return None
        finally:
            if job is None:
                self._held.discard(key)

    async def _settle_unclaimed(self, msg: Msg, event: IngestEvent, result: Skip | Busy | GiveUp) -> None:
        if isinstance(result, Skip):
            log.info("skipped", extra={"doc_id": event.doc_id, "why": result.why})
            await self._ack(msg, "skipped")
            if result.superseded:
                self._drop_object(event.key, event.object_key)
        elif isinstance(result, Busy):
            await self._nak(msg, result.delay_s, "busy")
        else:
            await self._dead_letter(msg, event, result.reason, result.attempts)

    async def _heartbeat(self, pending: dict[int, tuple[Msg, Job]], done: asyncio.Event) -> None:
        assert self.lifecycle is not None
        interval = max(0.5, min(self.settings.ingest_ack_wait_s, self.settings.ingest_lease_s) / 3)
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), interval)
                return
            for msg, job in list(pending.values()):
                with contextlib.suppress(Exception):
                    await msg.in_progress()
                    if not job.lost and not await self.lifecycle.renew(job.claim):
                        log.warning("claim taken over", extra={"doc_id": job.event.doc_id})

    # --- settling --------------------------------------------------------------------------

    async def _settle(self, msg: Msg, job: Job) -> None:
        try:
            await self._settle_once(msg, job)
        except Exception as exc:
            # The outcome could not be recorded (state store unreachable or contended): leave
            # the event unacknowledged, so it comes back and nothing is lost.
            log.warning("could not settle event", extra={"doc_id": job.event.doc_id, "error": repr(exc)})
            assert self.lifecycle is not None
            await self._nak(msg, self.lifecycle.transient_delay(1), "outcome not recorded")
        finally:
            self._held.discard(job.key)
            tracing.finish(
                job.trace, outcome="lost" if job.lost else "ok" if job.failure is None else "failed"
            )
            previous = job.previous_record
            if job.committed and previous is not None and previous.object_key != job.event.object_key:
                self._drop_object(job.key, previous.object_key)

    async def _settle_once(self, msg: Msg, job: Job) -> None:
        assert self.lifecycle is not None
        if job.lost:
            # Another worker claimed the document meanwhile: it owns the outcome. Our event is
            # looked at again later (and then found superseded or done).
            log.warning("claim lost; nothing recorded", extra={"doc_id": job.event.doc_id})
            await self._nak(msg, self.settings.ingest_busy_delay_s, "claim lost")
            return
        outcome: Success | Failure
        if job.failure is None:
            deleted = job.event.op == "delete"
            outcome = Success(
                indexed_sha256="" if deleted else job.event.content_sha256,
                chunks=0 if deleted else len(job.chunks),
                deleted=deleted,
            )
        else:
            outcome = Failure(job.failure.reason, job.failure.kind)
        result = await self.lifecycle.finish(job.claim, outcome)
        if isinstance(result, Done):
            await self._ack(msg, "done")
        elif isinstance(result, Superseded):
            await self._ack(msg, "superseded")
            self._drop_object(job.key, job.event.object_key)
        elif isinstance(result, Retry):
            await self._nak(msg, result.delay_s, "retry")
        elif isinstance(result, GiveUp):
            await self._dead_letter(msg, job.event, result.reason, result.attempts)
        elif isinstance(result, Lost):
            await self._nak(msg, self.settings.ingest_busy_delay_s, "claim lost")
        if job.failure is not None:
            log.warning(
                "document failed",
                extra={
                    "doc_id": job.event.doc_id,
                    "reason": job.failure.reason,
                    "kind": job.failure.kind,
                    "outcome": type(result).__name__,
                },
            )

    def _drop_object(self, key: str, object_key: str) -> None:
        if self.pipeline is not None:
            self.pipeline.drop_object_later(key, object_key)

    async def _ack(self, msg: Msg, how: str) -> None:
        await msg.ack()
        SETTLED.labels(how).inc()

    async def _nak(self, msg: Msg, delay_s: float, how: str) -> None:
        try:
            await msg.nak(delay=delay_s)
        except Exception as exc:
            # NATS unreachable: the event comes back after ack_wait anyway.
            log.warning("could not nak an event", extra={"how": how, "error": repr(exc)})
            return
        SETTLED.labels(how).inc()

    async def _dead_letter(self, msg: Msg, event: IngestEvent | None, reason: str, attempts: int) -> None:
        assert self.dead_letters is not None
        seq = msg.metadata.sequence.stream if msg.metadata and msg.metadata.sequence else 0
        await self.dead_letters.send(msg.data, event, reason, attempts, seq)
        await msg.term()
        SETTLED.labels("dead-lettered").inc()


def main() -> None:
    settings = IngestionSettings()
    worker = IngestWorker(settings)
    spec = ServiceSpec(
        name="ingestion-worker",
        grpc_services=[],
        register=lambda server: None,
        # It serves health checks only: no caller rules, small messages.
        max_request_bytes=REQUEST_SLACK_BYTES,
        max_concurrent_rpcs=16,
        on_start=[worker.start],
        on_stop=[worker.stop],
    )
    run_service(spec, settings)


if __name__ == "__main__":
    main()
