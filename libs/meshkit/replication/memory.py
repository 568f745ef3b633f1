"""A replicated log inside this process (``store_log=local``): one replica, no NATS, the same
transport contract as JetStream (meshkit.replication.transport)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meshkit.replication.transport import LogMessage, LogUnavailable, WrongLastSequence

# Messages an in-process log keeps behind its reader.
_MEMORY_KEEP = 256


class MemoryTransport:
    """A log inside this process (``store_log=local``): one replica, no NATS. The same code
    path as JetStream, so the store's behaviour does not depend on the transport."""

    def __init__(self, max_message_bytes: int = 1024 * 1024) -> None:
        self._messages: list[LogMessage] = []
        self._last = 0
        self._max = max_message_bytes
        self._callbacks: list[Callable[[], None]] = []
        self.refuse_appends = False  # tests: the log is "down"

    @property
    def description(self) -> str:
        return "in-process log"

    @property
    def max_message_bytes(self) -> int:
        return self._max

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def identity(self) -> str:
        return "local"

    def resume_at(self, seq: int) -> None:
        """Number new entries after ``seq`` (what a restarted local replica already holds)."""
        self._last = max(self._last, seq)

    async def publish(self, messages: Sequence[tuple[bytes, dict[str, str]]], expected_last: int) -> int:
        if self.refuse_appends:
            raise LogUnavailable("in-process log refuses appends")
        last_on_subject = self._messages[-1].seq if self._messages else 0
        if expected_last != last_on_subject:
            raise WrongLastSequence(last_on_subject)
        for data, headers in messages:
            self._last += 1
            self._messages.append(LogMessage(self._last, data, dict(headers)))
        return self._last

    async def next_after(self, seq: int) -> LogMessage | None:
        if len(self._messages) > _MEMORY_KEEP:
            # One reader: what it has passed is only kept for a short rewind.
            self._messages = [m for m in self._messages if m.seq > seq - _MEMORY_KEEP]
        for message in self._messages:
            if message.seq > seq:
                return message
        return None

    async def notify(self) -> None:
        for callback in self._callbacks:
            callback()

    def on_notify(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def drop_before(self, seq: int) -> None:
        """Tests: retention removed every message below ``seq``."""
        self._messages = [m for m in self._messages if m.seq >= seq]
