"""Dead letters: ingest events that kept failing, kept with their reason and attempt count.

A worker dead-letters an event itself when it knows the failure is final (a permanent
document error, or the last allowed delivery failed). An event whose worker died on its last
delivery never gets that chance: JetStream then emits a MAX_DELIVERIES advisory and leaves the
message in the work-queue stream; ``watch_max_deliveries`` moves it over. Both paths publish
with the same Nats-Msg-Id (the event's stream sequence), so an event is dead-lettered once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from meshkit.settings import IngestionSettings
from services.ingestion.events import DLQ_SUBJECT_PREFIX, IngestEvent, MalformedEvent

log = logging.getLogger(__name__)

REASON_HEADER = "Ragmesh-Reason"
ATTEMPTS_HEADER = "Ragmesh-Attempts"
FAILED_AT_HEADER = "Ragmesh-Failed-At"
SOURCE_SEQ_HEADER = "Ragmesh-Source-Seq"
MAX_REASON_CHARS = 2000

# Why an event failed, looked up from the document's status when the worker could not say.
ReasonLookup = Callable[[IngestEvent], Awaitable[str]]


@dataclass(frozen=True)
class DeadLetter:
    sequence: int
    event: IngestEvent | None
    raw: bytes
    reason: str
    attempts: int
    failed_at: float


class DeadLetters:
    def __init__(self, nc: NATS, js: JetStreamContext, settings: IngestionSettings) -> None:
        self.nc = nc
        self.js = js
        self.settings = settings

    async def send(
        self, raw_event: bytes, collection: str, reason: str, attempts: int, source_seq: int
    ) -> None:
        headers = {
            REASON_HEADER: reason[:MAX_REASON_CHARS].replace("\n", " ").replace("\r", " "),
            ATTEMPTS_HEADER: str(attempts),
            FAILED_AT_HEADER: f"{time.time():.3f}",
            SOURCE_SEQ_HEADER: str(source_seq),
            "Nats-Msg-Id": f"dlq-{self.settings.ingest_stream}-{source_seq}",
        }
        subject = f"{DLQ_SUBJECT_PREFIX}.{collection or '_unknown'}"
        await self.js.publish(subject, raw_event, headers=headers, stream=self.settings.ingest_dlq_stream)
        log.warning("dead-lettered", extra={"collection": collection, "reason": reason, "attempts": attempts})

    async def list(self, collection: str = "", limit: int = 1000) -> list[DeadLetter]:
        info = await self.js.stream_info(self.settings.ingest_dlq_stream)
        letters: list[DeadLetter] = []
        seq = info.state.first_seq
        subject = f"{DLQ_SUBJECT_PREFIX}.{collection}" if collection else None
        while seq and seq <= info.state.last_seq and len(letters) < limit:
            try:
                raw = await self.js.get_msg(self.settings.ingest_dlq_stream, seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                break
            letters.append(self._decode(raw.seq or 0, raw.data or b"", raw.headers or {}))
            seq = (raw.seq or seq) + 1
        return letters

    @staticmethod
    def _decode(seq: int, data: bytes, headers: dict[str, str]) -> DeadLetter:
        try:
            event: IngestEvent | None = IngestEvent.from_bytes(data)
        except MalformedEvent:
            event = None
        return DeadLetter(
            sequence=seq,
            event=event,
            raw=data,
            reason=headers.get(REASON_HEADER, ""),
            attempts=int(headers.get(ATTEMPTS_HEADER, "0") or 0),
            failed_at=float(headers.get(FAILED_AT_HEADER, "0") or 0),
        )

    async def forget(self, sequence: int) -> None:
        """Drop a dead letter once its event is back on the ingest stream."""
        await self.js.delete_msg(self.settings.ingest_dlq_stream, sequence)

    async def watch_max_deliveries(self, reason_for: ReasonLookup) -> None:
        """Move events that exhausted their deliveries without a worker dead-lettering them."""
        subject = (
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."
            f"{self.settings.ingest_stream}.{self.settings.ingest_consumer}"
        )

        async def on_advisory(msg: Msg) -> None:
            try:
                advisory = json.loads(msg.data)
                await self._rescue(
                    int(advisory["stream_seq"]), int(advisory.get("deliveries", 0)), reason_for
                )
            except Exception:
                log.exception("could not dead-letter an exhausted event")

        await self.nc.subscribe(subject, cb=on_advisory)

    async def _rescue(self, stream_seq: int, deliveries: int, reason_for: ReasonLookup) -> None:
        try:
            raw = await self.js.get_msg(self.settings.ingest_stream, stream_seq)
        except nats.js.errors.NotFoundError:
            return  # the worker dead-lettered (and terminated) it already
        data = raw.data or b""
        try:
            event = IngestEvent.from_bytes(data)
            collection, reason = event.collection, await reason_for(event)
        except MalformedEvent as exc:
            collection, reason = "", str(exc)
        await self.send(data, collection, reason or "exceeded max deliveries", deliveries, stream_seq)
        await self.js.delete_msg(self.settings.ingest_stream, stream_seq)
