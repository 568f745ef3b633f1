"""Ingestion worker: a pull consumer on the ingest work-queue stream.

Each loop fetches a batch of events, claims each document (compare-and-set on its status,
so two workers never both own one), runs the batch through the pipeline and settles every
event: ack on success, nak with backoff on a transient failure, dead-letter + term on a
permanent one or on the last allowed delivery. While a batch runs, a heartbeat keeps the
events (in_progress) and the claims (lease) alive, so a slow batch is not redelivered to
another worker, while a dead worker's events come back after ack_wait.

Run as ``python -m services.ingestion.worker``; it serves gRPC health on RAGMESH_PORT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import Gauge

from meshkit.client import ClientPolicy, Downstream
from meshkit.ids import doc_key
from meshkit.logs import new_request_id, request_id_var
from meshkit.natsconn import connect_options
from meshkit.objectstore import ObjectStore
from meshkit.server import REQUEST_SLACK_BYTES, ServiceSpec, run_service
from meshkit.settings import IngestionSettings
from ragmesh.embedder.v1 import embedder_pb2_grpc
from ragmesh.index.v1 import index_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2_grpc
from services.ingestion.chunking import Chunker
from services.ingestion.deadletters import DeadLetters
from services.ingestion.events import IngestEvent, MalformedEvent
from services.ingestion.pipeline import IngestPipeline, Job, JobFailure, Stores
from services.ingestion.state import (
    DELETE_TARGET,
    DELETED,
    FAILED,
    INDEXED,
    PROCESSING,
    QUEUED,
    Conflict,
    DocStatus,
    StateStore,
    open_buckets,
)
from services.ingestion.topology import ensure_topology

log = logging.getLogger("ingestion.worker")

IN_FLIGHT = Gauge("ragmesh_ingest_worker_in_flight", "Events being processed by this worker.")
CAS_RETRIES = 5

# How a settled job changes its status; ``ours`` is False when a newer request is queued.
StatusChange = Callable[[DocStatus, bool], DocStatus]


@dataclass(frozen=True)
class Skip:
    """The event needs no work (superseded or already indexed): ack it."""

    why: str


@dataclass(frozen=True)
class Busy:
    """Another live worker owns the document: come back later."""

    delay_s: float


def target_of(event: IngestEvent) -> str:
    return DELETE_TARGET if event.op == "delete" else event.content_sha256


class IngestWorker:
    def __init__(self, settings: IngestionSettings) -> None:
        self.settings = settings
        base = settings.ingest_worker_id or socket.gethostname()
        # Unique per incarnation: a restarted worker must not inherit its predecessor's claims.
        self.worker_id = f"{base}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.state: StateStore | None = None
        self.dead_letters: DeadLetters | None = None
        self.pipeline: IngestPipeline | None = None
        self.stores: Stores | None = None
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        # Documents this process is working on: a redelivery of one of them (its event timed
        # out while NATS was unreachable, say) must wait, not run twice side by side.
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
        status_kv, records_kv = await open_buckets(self.js)
        self.state = StateStore(status_kv, records_kv)
        self.dead_letters = DeadLetters(self.nc, self.js, settings)
        policy = ClientPolicy.from_settings(settings)
        self.stores = Stores(
            Downstream("embedder", settings.embedder_address, embedder_pb2_grpc.EmbedderServiceStub, policy),
            [
                Downstream(f"index-{i}", address, index_pb2_grpc.IndexServiceStub, policy)
                for i, address in enumerate(settings.index_address_list())
            ],
            Downstream("sparse", settings.sparse_address, sparse_pb2_grpc.SparseServiceStub, policy),
        )
        chunker = Chunker.from_settings(settings)
        objects = ObjectStore.from_settings(settings)
        await objects.ensure_bucket(settings.documents_bucket)
        self.pipeline = IngestPipeline(settings, objects, self.state, self.stores, chunker)
        loops = max(1, settings.ingest_max_in_flight // max(1, settings.ingest_fetch_batch))
        self._loops = [asyncio.create_task(self._run_loop(i)) for i in range(loops)]
        log.info("worker started", extra={"worker_id": self.worker_id, "loops": loops})

    async def stop(self) -> None:
        """Finish the batches in hand (their events are acked or nak'ed), then disconnect."""
        self._stopping.set()
        if self._loops:
            _done, pending = await asyncio.wait(self._loops, timeout=self.settings.shutdown_grace_s)
            for task in pending:
                task.cancel()
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

    async def handle_batch(self, msgs: list[Msg]) -> None:
        token = request_id_var.set(new_request_id())
        IN_FLIGHT.inc(len(msgs))
        jobs: list[tuple[Msg, Job]] = []
        try:
            claimed = await asyncio.gather(*(self._claim(msg) for msg in msgs))
            jobs = [(msg, job) for msg, job in zip(msgs, claimed, strict=True) if isinstance(job, Job)]
            done = asyncio.Event()
            heartbeat = asyncio.create_task(self._heartbeat(jobs, done))
            try:
                await self._process([job for _msg, job in jobs])
            finally:
                # nats-py's flush swallows cancellation (NATS killed mid-batch left the heartbeat
                # looping and the batch waiting on it for good): the event ends the loop, and the
                # wait is bounded so a heartbeat stuck in the client never holds the batch.
                done.set()
                heartbeat.cancel()
                await asyncio.wait({heartbeat}, timeout=5.0)
            await asyncio.gather(*(self._settle(msg, job) for msg, job in jobs))
        finally:
            self._held.difference_update(job.key for _msg, job in jobs)
            IN_FLIGHT.dec(len(msgs))
            request_id_var.reset(token)

    async def _process(self, jobs: list[Job]) -> None:
        """The pipeline under a watchdog: a batch stuck on a hung downstream is given up and
        its events come back, instead of holding its documents PROCESSING forever."""
        assert self.pipeline is not None
        try:
            await asyncio.wait_for(self.pipeline.process(jobs), self.settings.ingest_batch_timeout_s)
        except TimeoutError:
            log.error("batch timed out", extra={"documents": len(jobs)})
            for job in jobs:
                job.failure = job.failure or JobFailure(
                    f"batch did not finish within {self.settings.ingest_batch_timeout_s}s", permanent=False
                )

    # --- claims ----------------------------------------------------------------------------

    async def _claim(self, msg: Msg) -> Job | Skip | Busy | None:
        """Own the document (CAS on its status) or say why not. Settles the message itself
        unless a Job is returned."""
        try:
            event = IngestEvent.from_bytes(msg.data)
        except MalformedEvent as exc:
            await self._dead_letter(msg, "", f"malformed event: {exc}")
            return None
        try:
            outcome = await self._try_claim(event, msg.metadata.num_delivered or 1)
        except Exception as exc:
            log.warning("claim failed", extra={"doc_id": event.doc_id, "error": repr(exc)})
            await msg.nak(delay=self._backoff(msg))
            return None
        if isinstance(outcome, Skip):
            log.info("skipped", extra={"doc_id": event.doc_id, "why": outcome.why})
            await msg.ack()
        elif isinstance(outcome, Busy):
            await msg.nak(delay=outcome.delay_s)
        return outcome

    async def _try_claim(self, event: IngestEvent, attempt: int) -> Job | Skip | Busy:
        assert self.state is not None
        key = doc_key(event.collection, event.doc_id)
        if key in self._held:
            return Busy(max(0.5, self.settings.ingest_ack_wait_s / 2))
        self._held.add(key)  # reserved before the first await: claims in one batch race
        try:
            outcome = await self._claim_status(key, event, attempt)
        except BaseException:
            self._held.discard(key)
            raise
        if not isinstance(outcome, Job):
            self._held.discard(key)
        return outcome

    async def _claim_status(self, key: str, event: IngestEvent, attempt: int) -> Job | Skip | Busy:
        assert self.state is not None
        target = target_of(event)
        for _ in range(CAS_RETRIES):
            current = await self.state.get_status(key)
            status: DocStatus = current.value or DocStatus(
                event.collection, event.doc_id, QUEUED, target_sha256=target
            )
            now = time.time()
            if status.target_sha256 and status.target_sha256 != target:
                return Skip("superseded by a newer request")
            if status.state == PROCESSING and status.owner != self.worker_id and status.lease_until > now:
                return Busy(min(status.lease_until - now + 0.5, self.settings.ingest_lease_s))
            if event.op == "upsert" and status.state == INDEXED and status.indexed_sha256 == target:
                return Skip("already indexed")
            if event.op == "delete" and status.state == DELETED:
                return Skip("already deleted")
            claimed = status.with_changes(
                state=PROCESSING,
                owner=self.worker_id,
                lease_until=now + self.settings.ingest_lease_s,
                attempts=attempt,
                target_sha256=target,
            )
            try:
                revision = await self.state.put_status(key, claimed, current.revision)
            except Conflict:
                continue
            return Job(event=event, status=claimed, status_revision=revision, attempt=attempt)
        return Busy(1.0)

    async def _heartbeat(self, jobs: list[tuple[Msg, Job]], done: asyncio.Event) -> None:
        interval = max(0.5, min(self.settings.ingest_ack_wait_s, self.settings.ingest_lease_s) / 3)
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), interval)
                return
            for msg, job in jobs:
                with contextlib.suppress(Exception):
                    await msg.in_progress()
                    await self._extend_lease(job)

    async def _extend_lease(self, job: Job) -> None:
        assert self.state is not None
        renewed = job.status.with_changes(lease_until=time.time() + self.settings.ingest_lease_s)
        try:
            job.status_revision = await self.state.put_status(job.key, renewed, job.status_revision)
            job.status = renewed
        except Conflict:
            # The API recorded a newer request for this document; our claim stands (it keeps
            # PROCESSING entries owned), so pick up the new revision.
            current = await self.state.get_status(job.key)
            if current.value is not None:
                job.status, job.status_revision = current.value, current.revision

    # --- settling --------------------------------------------------------------------------

    async def _settle(self, msg: Msg, job: Job) -> None:
        try:
            await self._settle_once(msg, job)
        except Exception as exc:
            # NATS unreachable mid-settle: the event comes back after ack_wait and is redone
            # idempotently (or skipped as already indexed).
            log.warning("could not settle event", extra={"doc_id": job.event.doc_id, "error": repr(exc)})

    async def _settle_once(self, msg: Msg, job: Job) -> None:
        failure = job.failure
        if failure is None:
            await self._finish_status(job, self._succeeded(job))
            await msg.ack()
            return
        final = failure.permanent or job.attempt >= self.settings.ingest_max_deliver
        if final:
            await self._finish_status(job, self._failed(failure.reason, job.attempt))
            await self._dead_letter(msg, job.event.collection, failure.reason, job.attempt)
        else:
            await self._finish_status(job, self._retrying(failure.reason, job.attempt))
            await msg.nak(delay=self._backoff(msg))
        log.warning(
            "document failed",
            extra={
                "doc_id": job.event.doc_id,
                "reason": failure.reason,
                "final": final,
                "attempt": job.attempt,
            },
        )

    def _succeeded(self, job: Job) -> StatusChange:
        deleted = job.event.op == "delete"
        indexed_sha = "" if deleted else job.event.content_sha256
        chunks = 0 if deleted else len(job.chunks)

        def change(status: DocStatus, ours: bool) -> DocStatus:
            if not ours:  # a newer request is queued behind us: leave it queued
                return status.with_changes(
                    state=QUEUED, owner="", lease_until=0.0, indexed_sha256=indexed_sha
                )
            return status.with_changes(
                state=DELETED if deleted else INDEXED,
                owner="",
                lease_until=0.0,
                reason="",
                indexed_sha256=indexed_sha,
                chunks=chunks,
            )

        return change

    @staticmethod
    def _failed(reason: str, attempts: int) -> StatusChange:
        def change(status: DocStatus, ours: bool) -> DocStatus:
            if not ours:
                return status.with_changes(state=QUEUED, owner="", lease_until=0.0)
            return status.with_changes(
                state=FAILED, owner="", lease_until=0.0, reason=reason, attempts=attempts
            )

        return change

    @staticmethod
    def _retrying(reason: str, attempts: int) -> StatusChange:
        def change(status: DocStatus, ours: bool) -> DocStatus:
            return status.with_changes(
                state=QUEUED,
                owner="",
                lease_until=0.0,
                reason=f"retrying: {reason}" if ours else status.reason,
                attempts=attempts if ours else status.attempts,
            )

        return change

    async def _finish_status(self, job: Job, change: StatusChange) -> None:
        """Apply ``change`` with compare-and-set, re-reading when the API recorded a newer
        request meanwhile (then ``ours`` is False)."""
        assert self.state is not None
        status, revision = job.status, job.status_revision
        target = target_of(job.event)
        for _ in range(CAS_RETRIES):
            try:
                await self.state.put_status(job.key, change(status, status.target_sha256 == target), revision)
                return
            except Conflict:
                current = await self.state.get_status(job.key)
                if current.value is None:
                    return
                status, revision = current.value, current.revision
        log.error("could not record the outcome of a document", extra={"doc_id": job.event.doc_id})

    async def _dead_letter(self, msg: Msg, collection: str, reason: str, attempts: int | None = None) -> None:
        assert self.dead_letters is not None
        seq = msg.metadata.sequence.stream if msg.metadata and msg.metadata.sequence else 0
        await self.dead_letters.send(
            msg.data, collection, reason, attempts or msg.metadata.num_delivered or 1, seq
        )
        await msg.term()

    def _backoff(self, msg: Msg) -> float:
        delays = self.settings.retry_backoffs() or [1.0]
        attempt = max(1, (msg.metadata.num_delivered if msg.metadata else 1) or 1)
        return delays[min(attempt, len(delays)) - 1]


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
