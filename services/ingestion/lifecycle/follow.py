"""Feeding the status index (``index.StatusIndex``) from the status bucket.

The bucket is a JetStream stream (``KV_ragmesh_doc_status``, one subject per document, the
latest entry of each kept); an entry's revision is its stream sequence. The follower reads the
stream with an ordered consumer starting right after the last sequence the index applied (from
the first one when the index is new), applies the entries in batches (one SQLite transaction
each, the sequence recorded with them), and keeps following: every later status write reaches
the index within moments, as the in-memory view's watch did before.

Where the index stands against the bucket is checked when the follower starts: an index of
another bucket generation (the stream was created again, e.g. a NATS server that lost its
data) or ahead of the stream is emptied and rebuilt. Until the index has applied everything
the bucket held at that moment, ``caught_up`` is not set: the API says so (its log, and
UNAVAILABLE on the calls answered from the index).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from services.ingestion.lifecycle.buckets import STATUS_BUCKET
from services.ingestion.lifecycle.index import Change, Removal, StatusIndex
from services.ingestion.lifecycle.rows import row_from_entry

log = logging.getLogger("services.ingestion.status_index")

# Entries applied per transaction while catching up.
BATCH = 2000
# A partial batch is applied after this long (steady state: each write within moments).
FLUSH_S = 0.05
RETRY_S = 2.0
# The longest stop() waits for the follower's tasks to end.
STOP_WAIT_S = 5.0
PROGRESS_LOG_S = 5.0
# An ordered consumer the server forgets when this process is gone.
INACTIVE_S = 120.0
_REMOVED = ("DEL", "PURGE")


def stream_of(bucket: str) -> str:
    return f"KV_{bucket}"


def entry_change(key: str, sequence: int, data: bytes, removed: bool) -> Change:
    """What one stream message of the bucket does to the index (ValueError: not a status)."""
    if removed or not data:
        return Removal(key, sequence)
    return row_from_entry(key, sequence, data)


def _removed(msg: Msg) -> bool:
    headers = msg.headers or {}
    if headers.get("KV-Operation") in _REMOVED:
        return True
    # nats-server 2.11+: markers of expiry and removal carry a reason instead.
    return headers.get("Nats-Marker-Reason") in ("MaxAge", "Purge", "Remove")


class IndexFollower:
    def __init__(self, js: JetStreamContext, index: StatusIndex, bucket: str = STATUS_BUCKET) -> None:
        self.js = js
        self.index = index
        self.bucket = bucket
        self.prefix = f"$KV.{bucket}."
        self.caught_up = asyncio.Event()
        # The stream's last sequence when the follower started: caught up once applied.
        self.target = 0
        self.pending = 0
        self.started_at = time.monotonic()
        self._batch: list[Change] = []
        self._batch_sequence = 0
        self._failed = asyncio.Event()
        # Set by stop(): nats-py may swallow a cancellation inside a subscribe, so the loop checks it.
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._logged_at = 0.0

    # --- start and stop -----------------------------------------------------------------------

    async def start(self) -> None:
        """Check the index against the bucket, then follow it from where the index stands."""
        info = await self.js.stream_info(stream_of(self.bucket))
        identity = info.created.isoformat() if info.created else ""
        last = int(info.state.last_seq)
        applied = self.index.applied_sequence
        if self.index.identity != identity or applied > last:
            log.warning(
                "status index rebuilt from the status bucket",
                extra={
                    "was": self.index.identity or None,
                    "bucket": identity,
                    "applied": applied,
                    "last": last,
                },
            )
            self.index.reset(identity)
        self.target = last
        self.pending = max(0, last - self.index.applied_sequence)
        if self.index.applied_sequence >= last:
            self.caught_up.set()
        self._tasks = [asyncio.create_task(self._follow()), asyncio.create_task(self._flush_periodically())]

    async def stop(self) -> None:
        self._stopping = True
        self._failed.set()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_WAIT_S)
        self._tasks = []
        with contextlib.suppress(Exception):
            self._flush()

    def progress(self) -> dict[str, Any]:
        applied = self.index.applied_sequence
        return {
            "applied_sequence": applied,
            "bucket_sequence_at_start": self.target,
            "pending": self.pending,
            "elapsed_s": round(time.monotonic() - self.started_at, 1),
        }

    # --- following ------------------------------------------------------------------------

    async def _follow(self) -> None:
        """Subscribe from the index's sequence; on a failure of the index, start over from it."""
        while not self._stopping:
            self._failed.clear()
            self._batch, self._batch_sequence = [], 0
            try:
                sub = await self._subscribe(self.index.applied_sequence + 1)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("status index: could not subscribe to the status bucket; retrying", exc_info=True)
                await asyncio.sleep(RETRY_S)
                continue
            try:
                if not self._stopping:
                    await self._failed.wait()
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(sub.unsubscribe())
            await asyncio.sleep(RETRY_S)

    async def _subscribe(self, start: int) -> Any:
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start > 1 else DeliverPolicy.ALL,
            opt_start_seq=start if start > 1 else None,
        )
        sub = await self.js.subscribe(
            f"{self.prefix}>",
            stream=stream_of(self.bucket),
            cb=self._on_message,
            ordered_consumer=True,
            config=config,
            inactive_threshold=INACTIVE_S,
        )
        info = await sub.consumer_info()
        if not info.num_pending and (info.delivered is None or not info.delivered.consumer_seq):
            # Nothing after the index's sequence (what it lacks was removed from the stream).
            self._mark_caught_up()
        return sub

    async def _on_message(self, msg: Msg) -> None:
        meta = msg.metadata
        sequence = int(meta.sequence.stream)
        key = msg.subject[len(self.prefix) :]
        try:
            self._batch.append(entry_change(key, sequence, msg.data, _removed(msg)))
        except (ValueError, TypeError):
            log.exception("status index: undecodable status entry skipped", extra={"key": key})
        self._batch_sequence = sequence
        self.pending = int(meta.num_pending)
        if len(self._batch) >= BATCH or self.pending == 0:
            self._flush()
            # Catching up, a batch is a few milliseconds of CPU: let the calls in between.
            await asyncio.sleep(0)

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            if self._batch_sequence:
                self._flush()
            self._log_progress()

    def _flush(self) -> None:
        if not self._batch_sequence or self._failed.is_set():
            return
        batch, sequence = self._batch, self._batch_sequence
        self._batch, self._batch_sequence = [], 0
        try:
            self.index.apply(batch, applied_sequence=sequence)
        except Exception:
            log.exception("status index: could not apply entries; following again from its sequence")
            self._failed.set()
            return
        if not self.caught_up.is_set() and (sequence >= self.target or self.pending == 0):
            self._mark_caught_up()

    def _mark_caught_up(self) -> None:
        if self.caught_up.is_set():
            return
        self.caught_up.set()
        log.info("status index caught up with the status bucket", extra=self.progress())

    def _log_progress(self) -> None:
        if self.caught_up.is_set() or time.monotonic() - self._logged_at < PROGRESS_LOG_S:
            return
        self._logged_at = time.monotonic()
        log.info("status index catching up with the status bucket", extra=self.progress())
