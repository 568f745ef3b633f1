"""JetStream layout of ingestion: the work-queue stream, its durable pull consumer, the
dead-letter stream and the state buckets. Declared idempotently by every process that
needs them, so a fresh NATS server (or a new cluster) is set up by starting the services."""

from __future__ import annotations

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

from meshkit.settings import IngestionSettings
from services.ingestion.events import DLQ_SUBJECT_PREFIX, SUBJECT_PREFIX

# Client retries of a publish within this window are dropped by the server (Nats-Msg-Id).
DUPLICATE_WINDOW_S = 120.0
EVENT_MAX_BYTES = 64 * 1024


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.stream_info(config.name or "")
    except nats.js.errors.NotFoundError:
        await js.add_stream(config)


async def ensure_topology(js: JetStreamContext, settings: IngestionSettings) -> None:
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
        ),
    )
    try:
        await js.consumer_info(settings.ingest_stream, settings.ingest_consumer)
    except nats.js.errors.NotFoundError:
        await js.add_consumer(
            settings.ingest_stream,
            ConsumerConfig(
                durable_name=settings.ingest_consumer,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=settings.ingest_ack_wait_s,
                max_deliver=settings.ingest_max_deliver,
                # Backpressure: the server hands out at most this many unacked events.
                max_ack_pending=max(1, settings.ingest_max_in_flight) * 8,
            ),
        )
