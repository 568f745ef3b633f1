"""Dead letters: ingest events whose document failed for good, kept with their reason and
attempt count in the dead-letter stream until an operator replays or drops them.

Only workers dead-letter, and only by their own count (services/ingestion/lifecycle/): a
permanent document failure, the last counted attempt, an infrastructure outage longer than its
window, or a claim that finds the previous attempts used up (the workers that had them died).
Nothing depends on a JetStream advisory or on another process being up. A letter is published
with the request id as its Nats-Msg-Id, so the retry of a worker that crashed between the
publish and terminating its event does not add a second one.

Reads are paged (``page``: at most ``limit`` letters after a cursor), never the whole stream.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext

from meshkit.settings import IngestionSettings
from services.ingestion.events import DLQ_SUBJECT_PREFIX, IngestEvent, MalformedEvent

log = logging.getLogger(__name__)

REASON_HEADER = "Ragmesh-Reason"
ATTEMPTS_HEADER = "Ragmesh-Attempts"
FAILED_AT_HEADER = "Ragmesh-Failed-At"
SOURCE_SEQ_HEADER = "Ragmesh-Source-Seq"
MAX_REASON_CHARS = 2000


@dataclass(frozen=True)
class DeadLetter:
    sequence: int
    event: IngestEvent | None
    raw: bytes
    reason: str
    attempts: int
    failed_at: float


class DeadLetters:
    def __init__(self, js: JetStreamContext, settings: IngestionSettings) -> None:
        self.js = js
        self.settings = settings

    async def send(
        self,
        raw_event: bytes,
        event: IngestEvent | None,
        reason: str,
        attempts: int,
        source_seq: int,
    ) -> None:
        dedup = event.request_id if event is not None and event.request_id else f"seq-{source_seq}"
        headers = {
            REASON_HEADER: reason[:MAX_REASON_CHARS].replace("\n", " ").replace("\r", " "),
            ATTEMPTS_HEADER: str(attempts),
            FAILED_AT_HEADER: f"{time.time():.3f}",
            SOURCE_SEQ_HEADER: str(source_seq),
            "Nats-Msg-Id": f"dlq-{self.settings.ingest_stream}-{dedup}",
        }
        collection = event.collection if event is not None else ""
        subject = f"{DLQ_SUBJECT_PREFIX}.{collection or '_unknown'}"
        await self.js.publish(subject, raw_event, headers=headers, stream=self.settings.ingest_dlq_stream)
        log.warning(
            "dead-lettered",
            extra={
                "collection": collection,
                "doc_id": event.doc_id if event else "",
                "reason": reason,
                "attempts": attempts,
            },
        )

    @staticmethod
    def _subject(collection: str) -> str | None:
        return f"{DLQ_SUBJECT_PREFIX}.{collection}" if collection else None

    async def page(self, collection: str, after: int, limit: int) -> tuple[list[DeadLetter], int]:
        """At most ``limit`` letters with a sequence above ``after`` (of one collection, if
        given), and the cursor to continue from (0: there are no more)."""
        info = await self.js.stream_info(self.settings.ingest_dlq_stream)
        last = info.state.last_seq or 0
        seq = max(after + 1, info.state.first_seq or 1)
        letters: list[DeadLetter] = []
        while seq <= last and len(letters) < limit:
            try:
                raw = await self.js.get_msg(
                    self.settings.ingest_dlq_stream, seq, subject=self._subject(collection), next=True
                )
            except nats.js.errors.NotFoundError:
                return letters, 0
            letters.append(self._decode(raw.seq or 0, raw.data or b"", raw.headers or {}))
            seq = (raw.seq or seq) + 1
        more = len(letters) == limit and seq <= last
        return letters, (letters[-1].sequence if more else 0)

    async def get(self, sequence: int, collection: str = "") -> DeadLetter | None:
        """The letter at ``sequence`` (None if there is none, or it is of another collection)."""
        try:
            raw = await self.js.get_msg(self.settings.ingest_dlq_stream, sequence)
        except nats.js.errors.NotFoundError:
            return None
        subject = self._subject(collection)
        if subject is not None and raw.subject != subject:
            return None
        return self._decode(raw.seq or sequence, raw.data or b"", raw.headers or {})

    @staticmethod
    def _decode(seq: int, data: bytes, headers: dict[str, str]) -> DeadLetter:
        try:
            event: IngestEvent | None = IngestEvent.from_bytes(data)
        except MalformedEvent:
            event = None
        try:
            attempts = int(headers.get(ATTEMPTS_HEADER, "0") or 0)
            failed_at = float(headers.get(FAILED_AT_HEADER, "0") or 0)
        except ValueError:
            attempts, failed_at = 0, 0.0
        return DeadLetter(
            sequence=seq,
            event=event,
            raw=data,
            reason=headers.get(REASON_HEADER, ""),
            attempts=attempts,
            failed_at=failed_at,
        )

    async def forget(self, sequence: int) -> None:
        """Drop a dead letter (replayed, or superseded by a newer request)."""
        # Not found: forgotten already (two replays raced).
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.js.delete_msg(self.settings.ingest_dlq_stream, sequence)
