"""The gateway's view of collection records (meshkit.domain.collections): which generation serves a
collection (the store collection every leg searches) and which embedder built it (a query
embedded by another is refused with FAILED_PRECONDITION).

Records come from NATS KV, cached ``gateway_collection_cache_s``. NATS is not on the search's
critical path: when it cannot be reached the last record read is used, and a collection never
read is searched as generation 1 without the embedder check (logged), as before records existed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace

import nats
import nats.js.errors
from nats.aio.client import Client as NATS

from meshkit.domain.collections import (
    COLLECTIONS_BUCKET,
    CachedRecords,
    CollectionRecord,
    CollectionRegistry,
    EmbedderIdentity,
    check_embedder,
)
from meshkit.rpc.client import DownstreamError
from meshkit.settings import GatewaySettings
from meshkit.storage.natsconn import connect_options
from services.gateway.calibration import calibrated
from services.gateway.validation import SearchParams

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
# How long the gateway's start waits for its first NATS connection (less when it is refused).
START_WAIT_S = 5.0


class CollectionResolver:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self._nc: NATS | None = None
        self._records: CachedRecords | None = None
        self._next_try = 0.0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        # Set by the first connection or the first failed attempt, whichever comes first.
        self._first_try = asyncio.Event()

    async def start(self) -> None:
        """Connect in the background (NATS down must not keep the gateway from serving), waiting
        a moment for the first attempt so that a started gateway already resolves generations."""
        self._task = asyncio.create_task(self._connect())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first_try.wait(), START_WAIT_S)

    async def _connect(self) -> None:
        async def failed(exc: Exception) -> None:
            if not self._first_try.is_set():  # once: the client retries every half second
                log.warning(
                    "NATS unreachable; collection records unchecked meanwhile", extra={"error": repr(exc)}
                )
            self._first_try.set()

        try:
            self._nc = await nats.connect(
                **connect_options(self.settings),
                name="gateway",
                connect_timeout=CONNECT_TIMEOUT_S,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                error_cb=failed,
            )
        finally:
            self._first_try.set()

    async def _open(self) -> CachedRecords | None:
        """The record cache once NATS is connected and the bucket exists (looked up at most once
        per cache period until then)."""
        if self._records is not None or self._nc is None or not self._nc.is_connected:
            return self._records
        async with self._lock:
            if self._records is not None or time.monotonic() < self._next_try:
                return self._records
            self._next_try = time.monotonic() + self.settings.gateway_collection_cache_s
            try:
                kv = await self._nc.jetstream().key_value(COLLECTIONS_BUCKET)
            except nats.js.errors.BucketNotFoundError:
                # Nothing indexed yet on this NATS: no collection has a record to check.
                return None
            except Exception as exc:
                log.warning("collection records unreachable", extra={"error": repr(exc)})
                return None
            self._records = CachedRecords(CollectionRegistry(kv), self.settings.gateway_collection_cache_s)
            return self._records

    async def resolve(self, params: SearchParams) -> SearchParams:
        """``params`` searching the generation that serves its collection, with its record and
        the collection's calibration for the choices the request left unset."""
        records = await self._open()
        record = await records.get(params.collection) if records is not None else None
        if record is None:
            return params
        return calibrated(replace(params, collection=record.physical, record=record))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()


def check_query_embedder(params: SearchParams, model: str, sha256: str, vectors: object) -> None:
    """Refuse query vectors from another embedder than the one that built the generation being
    searched: FAILED_PRECONDITION, or, while the collection is being reindexed with exactly this
    embedder, a DownstreamError that turns the dense leg into a degradation so the sparse legs
    keep answering until the switch."""
    record: CollectionRecord | None = params.record
    identity = EmbedderIdentity.of_reply(model, sha256, vectors)
    if record is None or identity is None or record.embedder in (None, identity):
        return
    if record.pending_generation and record.pending_embedder in (None, identity):
        raise DownstreamError(
            "embedder",
            "error",
            None,
            f"collection {record.collection!r} is being reindexed for embedder {identity.describe()}; "
            "its dense leg is off until the new generation serves",
        )
    check_embedder(record, record.generation, identity)
