"""JetStream layout of ingestion: the work-queue stream, its durable pull consumer, the
dead-letter stream and the state buckets. Declared idempotently by every process that
needs them, so a fresh NATS server (or a new cluster) is set up by starting the services.

The consumer redelivers without limit (``max_deliver`` -1): attempts are counted by the
lifecycle (services/ingestion/lifecycle/), which dead-letters by its own count, so a
"busy" redelivery or an infrastructure outage never exhausts an event. A consumer created by
an older version with a delivery limit is recreated, which also brings back the events that
had exhausted their deliveries under it.

Subjects: one per document (``ragmesh.ingest.<collection>.<doc hash>``). Events published by
older versions on ``ragmesh.ingest.<collection>`` still match the stream's ``ragmesh.ingest.>``
and are consumed as before; no migration step is needed."""

from __future__ import annotations

import contextlib
import logging

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from meshkit.rpc import tracing
from meshkit.settings import IngestionSettings
from services.ingestion.events import DLQ_SUBJECT_PREFIX, SUBJECT_PREFIX, IngestEvent

log = logging.getLogger(__name__)

# Client retries of a publish within this window are dropped by the server (Nats-Msg-Id).
DUPLICATE_WINDOW_S = 120.0
EVENT_MAX_BYTES = 64 * 1024
UNLIMITED_DELIVERIES = -1


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.stream_info(config.name or "")
    except nats.js.errors.NotFoundError:
        await js.add_stream(config)


def consumer_config(settings: IngestionSettings) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=settings.ingest_consumer,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=settings.ingest_ack_wait_s,
        max_deliver=UNLIMITED_DELIVERIES,
        # Backpressure: the server hands out at most this many unacked events.
        max_ack_pending=max(1, settings.ingest_max_in_flight) * 8,
    )


async def ensure_topology(js: JetStreamContext, settings: IngestionSettings) -> None:
    replicas = settings.nats_stream_replicas
    await _ensure_stream(
        js,
        StreamConfig(
            name=settings.ingest_stream,
            subjects=[f"{SUBJECT_PREFIX}.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW_S,
            max_msg_size=EVENT_MAX_BYTES,
            discard=DiscardPolicy.NEW,
            num_replicas=replicas,
        ),
    )
    await _ensure_stream(
        js,
        StreamConfig(
            name=settings.ingest_dlq_stream,
            subjects=[f"{DLQ_SUBJECT_PREFIX}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW_S,
            max_msg_size=EVENT_MAX_BYTES * 2,
            num_replicas=replicas,
        ),
    )
    wanted = consumer_config(settings)
    try:
        info = await js.consumer_info(settings.ingest_stream, settings.ingest_consumer)
    except nats.js.errors.NotFoundError:
        await js.add_consumer(settings.ingest_stream, wanted)
        return
    current = info.config
    if current.max_deliver != UNLIMITED_DELIVERIES:
        # A consumer from a version that let JetStream count deliveries. Lifting the limit in
        # place would leave the events that used it up in the stream, never delivered again;
        # a recreated consumer delivers every event still in the stream (a duplicate of one in
        # flight is harmless: its claim decides). Its other settings are kept.
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_consumer(settings.ingest_stream, settings.ingest_consumer)
        updated = wanted.evolve(ack_wait=current.ack_wait, max_ack_pending=current.max_ack_pending)
        await js.add_consumer(settings.ingest_stream, updated)
        log.warning("ingest consumer recreated with unlimited deliveries", extra={"was": current.max_deliver})


async def publish_event(
    js: JetStreamContext, settings: IngestionSettings, event: IngestEvent, msg_id: str
) -> None:
    """Put a request's event on the ingest stream. ``msg_id`` makes a retried publish of the
    same thing (within the duplicate window) a no-op on the server."""
    with tracing.nats_publish(event.subject) as trace_headers:
        await js.publish(
            event.subject,
            event.to_bytes(),
            stream=settings.ingest_stream,
            headers={"Nats-Msg-Id": msg_id, **trace_headers},
        )
