"""Replicated logs of the stateful stores (index shards, sparse): state-machine replication
through NATS JetStream, shared by both stores.

A write received by any replica of a shard is appended to the shard's log (one subject, e.g.
``ragmesh.log.index.3`` of the stream ``RAGMESH_LOG_INDEX``). Every replica reads that subject
strictly in order and applies each entry through the store's own code path; apply is
deterministic, so replicas that applied the same entries hold the same state. The replica that
took the write answers once it has applied that entry itself (``ReplicatedLog.submit``).

Appends are chained. Each is published with ``Nats-Expected-Last-Subject-Sequence`` (the server
refuses it unless the subject's last message is the one the writer names; on a refusal the
writer learns the real last one and tries again) and carries its predecessor in
``Ragmesh-Prev``. A reader at position p that meets an entry whose predecessor lies beyond p has
missed entries that are no longer in the log (retention removed them first): a gap, which the
store answers by quarantining what it can no longer complete, never by serving it incomplete.

An entry bigger than one message is split into parts published as one JetStream atomic batch:
the server stores all of them, contiguously, or none. The entry's position is the sequence of
its last part.

Positions are kept per collection (``Positions``): a store restores one collection from an
older snapshot while the others are further on, and the reader rewinds for it while the others
skip what they already hold.

The pieces: ``replog_transport`` (the transport contract), ``replog_jetstream`` and
``replog_memory`` (the transports), ``replog_positions`` (positions per collection); this module
holds the log itself (``ReplicatedLog``) and picks the transport (``transport_for``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from meshkit.replication.jetstream import JetStreamTransport
from meshkit.replication.memory import MemoryTransport
from meshkit.replication.positions import Positions
from meshkit.replication.transport import (
    ERROR_BACKOFF_S,
    LogMessage,
    LogTransport,
    LogUnavailable,
    WrongLastSequence,
)
from meshkit.settings import StoreSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

HEADER_ENTRY = "Ragmesh-Entry"
HEADER_PREV = "Ragmesh-Prev"
HEADER_PART = "Ragmesh-Part"
# A JetStream atomic batch holds at most this many messages (the server's default limit).
_MAX_PARTS = 1000
# Appends retried after the subject moved on (another replica appended first).
_MAX_APPEND_ATTEMPTS = 64
# After this replica appended, the entry may take a moment to be readable on the replica of the
# stream that answers direct gets: look again this soon rather than after a whole poll period.
_QUICK_RETRY_S = 0.01
_STOP_TIMEOUT_S = 60.0


class LogTimeout(RuntimeError):
    """The entry is in the log but this replica has not applied it within the time allowed."""


@dataclass(frozen=True)
class Entry:
    """One complete entry: ``seq`` is its position (its last part), ``prev`` its predecessor."""

    seq: int
    first_seq: int
    prev: int
    entry_id: str
    data: bytes


def transport_for(
    settings: StoreSettings, stream: str, kind: str, shard: int, client_name: str
) -> LogTransport:
    if settings.store_log == "local":
        return MemoryTransport(settings.store_log_entry_bytes)
    return JetStreamTransport(settings, stream, kind, shard, client_name=client_name)


ApplyFn = Callable[[Entry], Awaitable[Any]]
GapFn = Callable[[int, int], Awaitable[None]]
ResetFn = Callable[[str], Awaitable[None]]


@dataclass
class _Stray:
    """A message that is not the start of an entry (the reader started inside one)."""

    seq: int


class ReplicatedLog:
    """Append entries, and apply every entry of the log in order through ``apply``.

    ``apply`` is the store's deterministic step; what it returns (or raises) goes back to the
    writer waiting for that entry in this process. ``on_gap(after, prev)`` is called before an
    entry whose predecessor ``prev`` lies beyond the reader's position ``after``;
    ``on_reset(log_id)`` when the log was recreated (positions are restarted first)."""

    def __init__(
        self,
        transport: LogTransport,
        apply: ApplyFn,
        *,
        poll_s: float,
        on_gap: GapFn,
        on_reset: ResetFn,
        positions: Positions | None = None,
    ) -> None:
        self.transport = transport
        self.positions = positions or Positions()
        self._apply = apply
        self._on_gap = on_gap
        self._on_reset = on_reset
        self._poll_s = poll_s
        self._waiters: dict[str, asyncio.Future[Any]] = {}
        self._append_lock = asyncio.Lock()
        self._more = asyncio.Event()
        self._caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._between: list[tuple[Callable[[], Awaitable[Any]], asyncio.Future[Any]]] = []
        # Highest sequence of this subject known here (read or appended): an append's predecessor.
        self._highest = 0
        self._expected_last = 0
        self._appended_max = 0
        self.unreachable_since: float | None = None
        self.last_error = ""
        self.gaps = 0
        transport.on_notify(self._more.set)

    # --- lifecycle

    async def start(self) -> None:
        self._highest = self._expected_last = self.positions.cursor
        self._task = asyncio.create_task(self._run(), name=f"replog-{self.transport.description}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                # An apply running in a worker thread finishes first (it cannot be interrupted).
                await asyncio.wait_for(self._task, _STOP_TIMEOUT_S)
            self._task = None
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(LogUnavailable("the replica is shutting down"))
        self._waiters.clear()
        for _work, done in self._between:
            if not done.done():
                done.set_exception(LogUnavailable("the replica is shutting down"))
        self._between.clear()

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    async def wait_caught_up(self, unreachable_timeout_s: float) -> bool:
        """Until the reader has applied everything the log held when it looked (True), or the log
        has been unreachable for ``unreachable_timeout_s`` in a row (False)."""
        while not self._caught_up.is_set():
            since = self.unreachable_since
            if since is not None and time.monotonic() - since >= unreachable_timeout_s:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._caught_up.wait(), 0.1)
        return True

    async def between_entries(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` in the reader's turn, between two entries (never beside an apply): where
        a store registers a restored collection and rewinds (``rewind_now``). Runs at once when
        the reader is not running."""
        if self._task is None or self._task.done():
            return await work()
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._between.append((work, done))
        self._more.set()
        return await done

    def rewind_now(self, to: int, live_names: Sequence[str]) -> None:
        """Read again from ``to`` (only from ``between_entries`` or before ``start``): the
        collections ``live_names`` keep their place and skip what they already hold."""
        if to >= self.positions.cursor:
            return
        log.info(
            "log reader rewinds",
            extra={"log": self.transport.description, "from": self.positions.cursor, "to": to},
        )
        self.positions.rewind(to, live_names)
        self._caught_up.clear()

    # --- writing

    async def submit(self, data: bytes, timeout_s: float) -> Any:
        """Append one entry and wait until this replica has applied it; returns what ``apply``
        returned for it (or raises what it raised)."""
        entry_id = uuid.uuid4().hex
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[entry_id] = waiter
        try:
            seq = await self._append(entry_id, data)
            self._appended_max = max(self._appended_max, seq)
            self._more.set()
            await self.transport.notify()
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
            except TimeoutError:
                raise LogTimeout(
                    f"written to the log at {seq} but not applied on this replica within {timeout_s:.1f}s"
                ) from None
        finally:
            self._waiters.pop(entry_id, None)

    def _split(self, entry_id: str, data: bytes) -> list[tuple[bytes, dict[str, str]]]:
        size = self.transport.max_message_bytes
        chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
        if len(chunks) > _MAX_PARTS:
            raise LogUnavailable(
                f"an entry of {len(data)} bytes needs {len(chunks)} parts, the log takes {_MAX_PARTS}"
            )
        n = len(chunks)
        return [
            (chunk, {HEADER_ENTRY: entry_id, HEADER_PART: f"{i}/{n}"}) for i, chunk in enumerate(chunks, 1)
        ]

    async def _append(self, entry_id: str, data: bytes) -> int:
        messages = self._split(entry_id, data)
        async with self._append_lock:
            expected = max(self._expected_last, self.positions.cursor, self._highest)
            prev_floor = 0
            for _attempt in range(_MAX_APPEND_ATTEMPTS):
                # Seen before this attempt is sent: entries the log held then.
                seen = self._highest
                first_data, first_headers = messages[0]
                prev = max(expected, prev_floor)
                messages[0] = (first_data, {**first_headers, HEADER_PREV: str(prev)})
                try:
                    seq = await self.transport.publish(messages, expected)
                except WrongLastSequence as exc:
                    if exc.actual < seen:
                        await self._entries_gone(exc.actual, seen)
                        prev_floor = seen
                    expected = exc.actual  # usually: another replica appended first
                    continue
                except LogUnavailable:
                    self._expected_last = 0  # unknown now: the next append learns it
                    raise
                self._expected_last = seq
                self._highest = max(self._highest, seq)
                return seq
        raise LogUnavailable("the log kept moving under this append; try again")

    async def _entries_gone(self, last: int, seen: int) -> None:
        """The subject's last entry is older than one this replica saw in it. If retention
        emptied the subject, the next entry names the newest seen as its predecessor, so a
        reader that missed entries sees the gap. If the log is a new one, this replica catches
        up with it first. Otherwise the log lost entries it had acknowledged (a single server
        crashed inside its sync interval): new entries would get their positions, which
        replicas past them never read, so writes are refused."""
        if await self.transport.identity() != self.positions.log_id:
            raise LogUnavailable("the replicated log was recreated; retry once this replica has caught up")
        if last == 0:
            return
        log.error(
            "the replicated log lost acknowledged entries; writes are refused until it is repaired",
            extra={"log": self.transport.description, "log_last": last, "seen_here": seen},
        )
        raise LogUnavailable("the replicated log lost entries this replica applied; writes are refused")

    # --- reading and applying

    def _wake_soon(self) -> bool:
        return self._appended_max > self.positions.cursor

    async def _run(self) -> None:
        errors = 0
        log_id_checked = False
        while True:
            try:
                await self._run_between()
                if not log_id_checked:
                    await self._check_identity()
                    log_id_checked = True
                item = await self._read_entry(self.positions.cursor)
                self.unreachable_since = None
                errors = 0
            except LogUnavailable as exc:
                if self.unreachable_since is None:
                    self.unreachable_since = time.monotonic()
                    log.warning(
                        "replicated log unreachable",
                        extra={"log": self.transport.description, "error": str(exc)},
                    )
                self.last_error = str(exc)
                log_id_checked = False  # the log may come back as a new one
                await asyncio.sleep(ERROR_BACKOFF_S[min(errors, len(ERROR_BACKOFF_S) - 1)])
                errors += 1
                continue
            except Exception:
                # A bug or a store hook that failed: never let the reader die silently.
                log.exception("log reader failed; retrying", extra={"log": self.transport.description})
                await asyncio.sleep(ERROR_BACKOFF_S[-1])
                continue
            if item is None:
                self._caught_up.set()
                await self._idle()
                continue
            if isinstance(item, _Stray):
                self.positions.advance(item.seq)
                continue
            try:
                await self._process(item)
            except Exception:
                log.exception("log gap handling failed; retrying", extra={"log": self.transport.description})
                await asyncio.sleep(ERROR_BACKOFF_S[-1])

    async def _idle(self) -> None:
        self._more.clear()
        if self._wake_soon():
            await asyncio.sleep(_QUICK_RETRY_S)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._more.wait(), self._poll_s)

    async def _check_identity(self) -> None:
        log_id = await self.transport.identity()
        if not self.positions.log_id:
            self.positions.log_id = log_id
            return
        if log_id != self.positions.log_id:
            log.error(
                "the replicated log was recreated; positions restart at its beginning (local state is kept)",
                extra={"log": self.transport.description, "was": self.positions.log_id, "now": log_id},
            )
            self.positions.restart(log_id)
            self._highest = self._expected_last = self._appended_max = 0
            await self._on_reset(log_id)

    async def _run_between(self) -> None:
        while self._between:
            work, done = self._between.pop(0)
            try:
                result = await work()
            except Exception as exc:
                if not done.done():
                    done.set_exception(exc)
            else:
                if not done.done():
                    done.set_result(result)

    async def _process(self, entry: Entry) -> None:
        self._highest = max(self._highest, entry.seq)
        if entry.prev > self.positions.cursor:
            self.gaps += 1
            log.error(
                "gap in the replicated log: entries were removed before this replica read them",
                extra={"log": self.transport.description, "after": self.positions.cursor, "prev": entry.prev},
            )
            await self._on_gap(self.positions.cursor, entry.prev)
        waiter = self._waiters.get(entry.entry_id)
        try:
            result = await self._apply(entry)
        except Exception as exc:  # the store's refusal, for the writer waiting on it
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)
        else:
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
        self.positions.advance(entry.seq)

    async def _read_entry(self, after: int) -> Entry | _Stray | None:
        first = await self.transport.next_after(after)
        if first is None:
            return None
        parsed = _parse_part(first)
        if parsed is None or parsed[1] != 1:
            log.warning("skipping a log message that starts no entry", extra={"seq": first.seq})
            return _Stray(first.seq)
        entry_id, _index, count = parsed
        parts = [first.data]
        last = first
        for index in range(2, count + 1):
            message = await self.transport.next_after(last.seq)
            if message is None or _parse_part(message) != (entry_id, index, count):
                # Atomic batches are stored whole: this is damage, not a race.
                log.error(
                    "log entry with a missing part; skipped",
                    extra={"entry": entry_id, "first_seq": first.seq, "part": index},
                )
                return _Stray(last.seq)
            parts.append(message.data)
            last = message
        prev = int(first.headers.get(HEADER_PREV, "0") or 0)
        return Entry(last.seq, first.seq, prev, entry_id, b"".join(parts))


def _parse_part(message: LogMessage) -> tuple[str, int, int] | None:
    entry_id = message.headers.get(HEADER_ENTRY)
    part = message.headers.get(HEADER_PART, "")
    index, sep, count = part.partition("/")
    if not entry_id or not sep or not index.isdigit() or not count.isdigit():
        return None
    return entry_id, int(index), int(count)


def write_timeout(time_remaining: float | None, default_s: float) -> float:
    """How long a write waits for its entry to be applied here: the caller's deadline (minus a
    margin to answer in time), or ``default_s`` when it set none."""
    if time_remaining is None:
        return default_s
    return max(0.01, time_remaining - 0.05)
