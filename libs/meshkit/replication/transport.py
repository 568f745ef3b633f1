"""The contract of a replicated log's transport (meshkit.replication.log): where a log lives (one subject
of one stream), what it hands the reader (``LogMessage``) and how it fails (``LogUnavailable``,
``WrongLastSequence``). The transports are ``replog_jetstream`` (NATS JetStream, shared by the
replicas) and ``replog_memory`` (in this process, ``store_log=local``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

SUBJECT_PREFIX = "ragmesh.log"
TICK_PREFIX = "ragmesh.logtick"
# Waits after successive failures to reach the log (the last one repeats).
ERROR_BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0)


class LogUnavailable(RuntimeError):
    """The log cannot be reached (or refused the append): nothing was acknowledged."""


class WrongLastSequence(Exception):
    """The subject's last message is not the one the writer named."""

    def __init__(self, actual: int) -> None:
        super().__init__(f"the log's last entry is {actual}")
        self.actual = actual


@dataclass(frozen=True)
class LogMessage:
    seq: int
    data: bytes
    headers: Mapping[str, str]


class LogTransport(Protocol):
    """Where a log lives: one subject of one stream."""

    @property
    def description(self) -> str: ...

    @property
    def max_message_bytes(self) -> int: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def identity(self) -> str:
        """Names this log; a different answer means the log was recreated (its positions restart)."""
        ...

    async def publish(self, messages: Sequence[tuple[bytes, dict[str, str]]], expected_last: int) -> int:
        """Append the messages as one unit after ``expected_last``; returns the last one's sequence.
        Raises WrongLastSequence or LogUnavailable."""
        ...

    async def next_after(self, seq: int) -> LogMessage | None:
        """The subject's first message with a sequence above ``seq``; None when there is none."""
        ...

    async def notify(self) -> None:
        """Tell the other replicas that something was appended (best effort)."""
        ...

    def on_notify(self, callback: Callable[[], None]) -> None: ...


def log_subject(kind: str, shard: int) -> str:
    return f"{SUBJECT_PREFIX}.{kind}.{shard}"


def tick_subject(kind: str, shard: int) -> str:
    # Outside the stream's subjects, so a wake-up is never stored.
    return f"{TICK_PREFIX}.{kind}.{shard}"
