"""The asyncio client: the same methods as ``Client``, awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from grpc import aio

from ragmesh_client._calls import (
    GATEWAY,
    Call,
    CallBuilder,
    OnRejected,
    ReindexDriver,
    finished,
)
from ragmesh_client.config import ClientConfig, new_request_id
from ragmesh_client.errors import RagmeshError, from_rpc_error
from ragmesh_client.types import (
    Answer,
    AskEvent,
    CollectionStatus,
    DeadLetterPage,
    Document,
    DocumentStatus,
    DocumentSummary,
    IngestResult,
    ReindexProgress,
    ReplayResult,
    SearchResponse,
)

T = TypeVar("T")


class AsyncClient(CallBuilder):
    """An asyncio client of the gateway and the ingestion API (see ``Client`` for the options).
    Its channels open on first use, in the running event loop; ``await close()`` (or
    ``async with``) releases them."""

    def __init__(self, gateway: str | None = None, **kwargs: Any) -> None:
        super().__init__(gateway, **kwargs)
        self._channels: dict[str, aio.Channel] = {}

    @classmethod
    def from_env(cls, **overrides: Any) -> AsyncClient:
        return cls(config=ClientConfig.from_env(**overrides))

    def _channel(self, service: str) -> aio.Channel:
        if service not in self._channels:
            target, options = self._target(service), self.config.channel_options()
            credentials = self._credentials()
            self._channels[service] = (
                aio.insecure_channel(target, options=options)
                if credentials is None
                else aio.secure_channel(target, credentials, options=options)
            )
        return self._channels[service]

    async def _run(self, call: Call[T]) -> T:
        request_id = new_request_id()
        method = getattr(self._stub(call.service, self._channel(call.service)), call.method)
        try:
            reply = await method(
                call.request, timeout=call.timeout, metadata=self.config.metadata(request_id)
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, request_id) from None
        return call.read(reply, request_id)

    # ------------------------------------------------------------------ gateway

    async def search(
        self,
        collection: str,
        query: str,
        *,
        timeout: float | None = None,
        allow_degraded: bool = True,
        request: Message | None = None,
        **options: Any,
    ) -> SearchResponse:
        return await self._run(self._search(collection, query, timeout, allow_degraded, request, options))

    async def ask(
        self,
        collection: str,
        query: str,
        *,
        timeout: float | None = None,
        allow_degraded: bool = True,
        request: Message | None = None,
        **options: Any,
    ) -> Answer:
        return await self._run(self._ask(collection, query, timeout, allow_degraded, request, options))

    async def ask_stream(
        self,
        collection: str,
        query: str,
        *,
        timeout: float | None = None,
        request: Message | None = None,
        **options: Any,
    ) -> AsyncIterator[AskEvent]:
        """Progress per stage, the text as it is written (AskDelta), then the verified Answer."""
        call = self._ask_stream(collection, query, timeout, request, options)
        request_id = new_request_id()
        stub = self._stub(GATEWAY, self._channel(GATEWAY))
        try:
            async for message in stub.AskStream(
                call.request, timeout=call.timeout, metadata=self.config.metadata(request_id)
            ):
                event = call.read(message, request_id)
                if event is not None:
                    yield event
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, request_id) from None

    # ------------------------------------------------------------------ ingestion

    async def ingest(
        self,
        collection: str,
        documents: Iterable[Document],
        *,
        timeout: float | None = None,
        on_rejected: OnRejected = "report",
    ) -> IngestResult:
        return await self._run(self._ingest(collection, documents, timeout, on_rejected))

    async def ingest_files(
        self,
        collection: str,
        paths: Iterable[str | Path],
        *,
        metadata: dict[str, str] | None = None,
        timeout: float | None = None,
        on_rejected: OnRejected = "report",
    ) -> IngestResult:
        return await self.ingest(
            collection, self._files(paths, metadata), timeout=timeout, on_rejected=on_rejected
        )

    async def document_status(
        self, collection: str, doc_ids: Sequence[str], *, timeout: float | None = None
    ) -> tuple[DocumentStatus, ...]:
        return await self._run(self._document_status(collection, doc_ids, timeout))

    async def wait_indexed(
        self, collection: str, doc_ids: Sequence[str], *, timeout: float = 300.0, poll_s: float = 0.5
    ) -> tuple[DocumentStatus, ...]:
        deadline = time.monotonic() + timeout
        while True:
            statuses = await self.document_status(collection, doc_ids)
            if finished(statuses):
                return statuses
            if time.monotonic() >= deadline:
                raise TimeoutError(f"documents not indexed within {timeout:.0f}s")
            await asyncio.sleep(poll_s)

    async def collection_status(self, collection: str, *, timeout: float | None = None) -> CollectionStatus:
        return await self._run(self._collection_status(collection, timeout))

    async def list_collections(self, *, timeout: float | None = None) -> tuple[str, ...]:
        return await self._run(self._list_collections(timeout))

    async def delete(self, collection: str, doc_ids: Sequence[str], *, timeout: float | None = None) -> int:
        return await self._run(self._delete(collection, doc_ids, timeout))

    async def list_documents(
        self,
        collection: str,
        *,
        source_prefix: str = "",
        page_size: int = 1000,
        timeout: float | None = None,
    ) -> AsyncIterator[DocumentSummary]:
        """Every document of the collection (not deleted ones; only those whose source_uri starts
        with ``source_prefix`` when given) in doc id order, a page of ``page_size`` per call;
        ``timeout`` is each page's deadline."""
        after = ""
        while True:
            page, after = await self._run(
                self._list_documents(collection, source_prefix, page_size, after, timeout)
            )
            for summary in page:
                yield summary
            if not after:
                return

    async def reindex_step(
        self, collection: str, *, start: bool = False, timeout: float | None = None
    ) -> ReindexProgress:
        """Advance the collection's reindex by one bounded step (``start``: begin one when none
        is in progress) and report where it stands. Idempotent: retried like a read."""
        return await self._run(self._reindex_step(collection, start, timeout))

    async def reindex(
        self,
        collection: str,
        *,
        on_progress: Callable[[ReindexProgress], None] | None = None,
        interval_s: float = 2.0,
        timeout: float | None = None,
        step_timeout: float = 60.0,
        step_retry_s: float = 120.0,
    ) -> ReindexProgress:
        """Start (or resume) the collection's reindex and step it until done, calling
        ``on_progress`` after every step; returns the last (done) progress. TimeoutError after
        ``timeout`` seconds (None: never); the reindex stays where it is, and calling again
        resumes it. A step failing on the way (UNAVAILABLE, DEADLINE_EXCEEDED) is tried again
        for up to ``step_retry_s``."""
        driver = ReindexDriver(on_progress, interval_s, timeout, step_retry_s)
        while True:
            try:
                progress = await self.reindex_step(collection, start=driver.start, timeout=step_timeout)
            except RagmeshError as exc:
                await asyncio.sleep(driver.failed(exc))
                continue
            pause = driver.answered(progress)
            if pause is None:
                return progress
            await asyncio.sleep(pause)

    async def dead_letters(
        self,
        collection: str = "",
        *,
        limit: int = 1000,
        after_sequence: int = 0,
        timeout: float | None = None,
    ) -> DeadLetterPage:
        return await self._run(self._dead_letters(collection, limit, after_sequence, timeout))

    async def replay_dead_letters(
        self,
        collection: str = "",
        *,
        sequences: Sequence[int] = (),
        after_sequence: int = 0,
        timeout: float | None = None,
    ) -> ReplayResult:
        return await self._run(self._replay(collection, sequences, after_sequence, timeout))

    # ------------------------------------------------------------------ lifecycle

    async def close(self, grace: float | None = None) -> None:
        """Close the channels; calls in flight get ``grace`` seconds to finish (None: cancelled)."""
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close(grace)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
