"""A replicated log in NATS JetStream (``store_log=nats``): the transport the replicas of a
store share. It connects in the background, declares the log stream idempotently
(``ensure_log_stream``), appends single messages or atomic batches with an expected last
sequence, reads with direct gets and wakes the other replicas on a tick subject."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from meshkit.replication.transport import (
    ERROR_BACKOFF_S,
    SUBJECT_PREFIX,
    LogMessage,
    LogUnavailable,
    WrongLastSequence,
    log_subject,
    tick_subject,
)
from meshkit.settings import StoreSettings

log = logging.getLogger(__name__)

# Room kept in every message for headers (ours and the server's) under the server's max_payload.
_HEADER_ROOM = 8 * 1024
# Longest wait for JetStream's ack of an append. A healthy server acks in milliseconds (a 32 MB
# multi-part entry in about a second); a request written to a connection that died before its
# ack came back is never answered, and waiting longer would hold the append lock, and with it
# every write of the shard. Unacknowledged is reported as UNAVAILABLE: the entry may or may not
# be in the log, and the writer's retry is idempotent.
_APPEND_ACK_TIMEOUT_S = 10.0
_WRONG_LAST_RE = re.compile(r"wrong last sequence: (\d+)")
_ERR_WRONG_LAST_SEQUENCE = 10071
_CLOSE_TIMEOUT_S = 5.0


class JetStreamTransport:
    """A log in NATS JetStream. Connects in the background (a replica starts and serves its
    local state while NATS is down) and declares the stream idempotently."""

    def __init__(
        self, settings: StoreSettings, stream: str, kind: str, shard: int, *, client_name: str
    ) -> None:
        self.settings = settings
        self.stream = stream
        self.subject = log_subject(kind, shard)
        self.tick = tick_subject(kind, shard)
        self.kind = kind
        self._client_name = client_name
        self._nc: Any = None
        self._js: Any = None
        self._ready = asyncio.Event()
        self._connector: asyncio.Task[None] | None = None
        self._callbacks: list[Callable[[], None]] = []

    @property
    def description(self) -> str:
        return f"{self.stream}/{self.subject}"

    @property
    def max_message_bytes(self) -> int:
        server_max = int(getattr(self._nc, "max_payload", 0) or 1024 * 1024)
        return max(1024, min(self.settings.store_log_entry_bytes, server_max - _HEADER_ROOM))

    async def open(self) -> None:
        if self._connector is None:
            self._connector = asyncio.create_task(self._connect(), name=f"replog-connect-{self.subject}")

    async def _connect(self) -> None:
        import nats

        from meshkit.storage.natsconn import connect_options

        # max_reconnect_attempts=-1 also keeps the first connection trying until NATS is up.
        self._nc = await nats.connect(
            **connect_options(self.settings),
            name=self._client_name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=2,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        self._js = self._nc.jetstream(timeout=10)
        await self._nc.subscribe(self.tick, cb=self._on_tick)
        for attempt in range(1_000_000):
            try:
                await ensure_log_stream(self._js, self.settings, self.stream, self.kind)
                break
            except Exception as exc:
                log.warning(
                    "log stream not ready; retrying", extra={"stream": self.stream, "error": str(exc)}
                )
                await asyncio.sleep(ERROR_BACKOFF_S[min(attempt, len(ERROR_BACKOFF_S) - 1)])
        self._ready.set()
        log.info("replicated log connected", extra={"stream": self.stream, "subject": self.subject})

    async def _on_error(self, exc: Exception) -> None:
        # Every failed reconnect lands here (twice a second while NATS is down): the reader
        # reports the outage once, with its effect.
        log.debug("nats client error", extra={"error": str(exc)})

    async def _on_disconnected(self) -> None:
        log.info("disconnected from NATS", extra={"subject": self.subject})

    async def _on_reconnected(self) -> None:
        log.info("reconnected to NATS", extra={"subject": self.subject})

    async def _on_tick(self, _msg: Any) -> None:
        for callback in self._callbacks:
            callback()

    def on_notify(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    async def close(self) -> None:
        if self._connector is not None:
            self._connector.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._connector
        if self._nc is not None:
            # A client in the middle of reconnecting can take long to close: never hold up a
            # shutdown for it.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.close(), _CLOSE_TIMEOUT_S)

    def _jetstream(self) -> Any:
        if not self._ready.is_set() or self._nc is None or not self._nc.is_connected:
            raise LogUnavailable(f"NATS is not reachable (log {self.description})")
        return self._js

    async def identity(self) -> str:
        js = self._jetstream()
        try:
            info = await js.stream_info(self.stream)
        except Exception as exc:
            raise LogUnavailable(f"stream info of {self.stream}: {exc}") from exc
        created = info.created.isoformat() if info.created is not None else ""
        return f"{self.stream}@{created}"

    async def publish(self, messages: Sequence[tuple[bytes, dict[str, str]]], expected_last: int) -> int:
        import nats.errors
        import nats.js.errors

        js = self._jetstream()
        expect = {"Nats-Expected-Last-Subject-Sequence": str(expected_last)}
        timeout = min(_APPEND_ACK_TIMEOUT_S, self.settings.store_write_timeout_s)
        try:
            if len(messages) == 1:
                data, headers = messages[0]
                ack = await js.publish(self.subject, data, headers={**headers, **expect}, timeout=timeout)
                return int(ack.seq)
            batch = uuid.uuid4().hex
            for i, (data, headers) in enumerate(messages, 1):
                extra = {"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(i)}
                if i == 1:
                    extra.update(expect)
                if i < len(messages):
                    await self._nc.publish(self.subject, data, headers={**headers, **extra})
                    continue
                extra["Nats-Batch-Commit"] = "1"
                ack = await js.publish(self.subject, data, headers={**headers, **extra}, timeout=timeout)
                return int(ack.seq)
        except nats.js.errors.APIError as exc:
            actual = _wrong_last(exc)
            if actual is not None:
                raise WrongLastSequence(actual) from None
            raise LogUnavailable(f"the log refused the append: {exc.description}") from exc
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise LogUnavailable(f"append to {self.description} failed: {type(exc).__name__}") from exc
        raise AssertionError("unreachable: messages is never empty")

    async def next_after(self, seq: int) -> LogMessage | None:
        import nats.errors
        import nats.js.errors

        js = self._jetstream()
        try:
            raw = await js.get_msg(self.stream, seq=seq + 1, subject=self.subject, next=True, direct=True)
        except nats.js.errors.NotFoundError:
            return None
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise LogUnavailable(f"read of {self.description} failed: {type(exc).__name__}") from exc
        return LogMessage(int(raw.seq), bytes(raw.data or b""), dict(raw.headers or {}))

    async def notify(self) -> None:
        with contextlib.suppress(Exception):
            self._jetstream()  # raises when down: nobody to tell then
            await self._nc.publish(self.tick, b"")


def _wrong_last(exc: Any) -> int | None:
    if getattr(exc, "err_code", None) != _ERR_WRONG_LAST_SEQUENCE:
        return None
    match = _WRONG_LAST_RE.search(str(getattr(exc, "description", "")))
    return int(match.group(1)) if match else None


async def ensure_log_stream(js: Any, settings: StoreSettings, stream: str, kind: str) -> None:
    """Declare a store's log stream (idempotent): file storage, limits retention by age, direct
    gets and atomic batches allowed. An existing stream missing those two is updated."""
    import nats.js.errors
    from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        await js.add_stream(
            StreamConfig(
                name=stream,
                description=f"ragmesh {kind} replicated log: one subject per shard",
                subjects=[f"{SUBJECT_PREFIX}.{kind}.>"],
                retention=RetentionPolicy.LIMITS,
                discard=DiscardPolicy.OLD,
                storage=StorageType.FILE,
                num_replicas=settings.nats_stream_replicas,
                max_age=settings.store_log_max_age_s,
                allow_direct=True,
                allow_atomic=True,
            )
        )
        return
    config = info.config
    if not config.allow_direct or not config.allow_atomic:
        log.warning("enabling direct gets and atomic batches on the log stream", extra={"stream": stream})
        config.allow_direct = True
        config.allow_atomic = True
        await js.update_stream(config)
