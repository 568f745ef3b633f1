"""The synchronous client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from ragmesh_client._calls import (
    GATEWAY,
    INGESTION,
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


class Client(CallBuilder):
    """A blocking client of the gateway (search, ask) and the ingestion API (ingest, status,
    delete, dead letters). Thread-safe; close it (or use ``with``) to release its channels.

    Search and ask options (keywords): top_k, doc_ids, collapse_documents, filter ({key: value}
    or {key: [values]}), history ([(role, text)]), rerank, strategy (precise|exhaustive),
    weights ({leg: weight}), rrf_k, pool_size, rerank_candidates; ask also passages, mode
    (llm|extractive), hyde (off|fusion|supplement), include_facts. ``request=`` sends a contract
    message as is instead.
    """

    def __init__(self, gateway: str | None = None, **kwargs: Any) -> None:
        super().__init__(gateway, **kwargs)
        # Both channels now (they connect on first use), so threads never race to create one.
        self._channels: dict[str, grpc.Channel] = {
            service: self._open(service) for service in (GATEWAY, INGESTION)
        }

    @classmethod
    def from_env(cls, **overrides: Any) -> Client:
        """Configured like the ragmesh CLI (RAGMESH_GATEWAY_ADDRESS, RAGMESH_API_KEY, ...)."""
        return cls(config=ClientConfig.from_env(**overrides))

    def _open(self, service: str) -> grpc.Channel:
        target, options = self._target(service), self.config.channel_options()
        credentials = self._credentials()
        if credentials is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, credentials, options=options)

    def _channel(self, service: str) -> grpc.Channel:
        if not self._channels:
            raise RuntimeError("the client is closed")
        return self._channels[service]

    def _run(self, call: Call[T]) -> T:
        request_id = new_request_id()
        method = getattr(self._stub(call.service, self._channel(call.service)), call.method)
        try:
            reply = method(call.request, timeout=call.timeout, metadata=self.config.metadata(request_id))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, request_id) from None
        return call.read(reply, request_id)

    # ------------------------------------------------------------------ gateway

    def search(
        self,
        collection: str,
        query: str,
        *,
        timeout: float | None = None,
        allow_degraded: bool = True,
        request: Message | None = None,
        **options: Any,
    ) -> SearchResponse:
        return self._run(self._search(collection, query, timeout, allow_degraded, request, options))

    def ask(
        self,
        collection: str,
        query: str,
        *,
        timeout: float | None = None,
        allow_degraded: bool = True,
        request: Message | None = None,
        **options: Any,
    ) -> Answer:
        return self._run(self._ask(collection, query, timeout, allow_degraded, request, options))

    def ask_stream(
        self,
        collection: str,
        query: str,
        *,
        timeout: float | None = None,
        request: Message | None = None,
        **options: Any,
    ) -> Iterator[AskEvent]:
        """Progress per stage, the text as it is written (AskDelta), then the verified Answer."""
        call = self._ask_stream(collection, query, timeout, request, options)
        request_id = new_request_id()
        stub = self._stub(GATEWAY, self._channel(GATEWAY))
        try:
            for message in stub.AskStream(
                call.request, timeout=call.timeout, metadata=self.config.metadata(request_id)
            ):
                event = call.read(message, request_id)
                if event is not None:
                    yield event
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, request_id) from None

    # ------------------------------------------------------------------ ingestion

    def ingest(
        self,
        collection: str,
        documents: Iterable[Document],
        *,
        timeout: float | None = None,
        on_rejected: OnRejected = "report",
    ) -> IngestResult:
        """Submit documents; each is judged on its own: a valid one is stored and queued, an
        invalid one is rejected with its reason (``result.rejected``) and nothing of it stored.
        ``on_rejected``: report (return them), raise (DocumentsRejectedError if any was
        rejected; the others were still queued) or raise_if_none_accepted."""
        return self._run(self._ingest(collection, documents, timeout, on_rejected))

    def ingest_files(
        self,
        collection: str,
        paths: Iterable[str | Path],
        *,
        metadata: dict[str, str] | None = None,
        timeout: float | None = None,
        on_rejected: OnRejected = "report",
    ) -> IngestResult:
        """Files as documents: id = file name, format from the suffix (.md, .txt, .html, .pdf)."""
        return self.ingest(collection, self._files(paths, metadata), timeout=timeout, on_rejected=on_rejected)

    def document_status(
        self, collection: str, doc_ids: Sequence[str], *, timeout: float | None = None
    ) -> tuple[DocumentStatus, ...]:
        return self._run(self._document_status(collection, doc_ids, timeout))

    def wait_indexed(
        self, collection: str, doc_ids: Sequence[str], *, timeout: float = 300.0, poll_s: float = 0.5
    ) -> tuple[DocumentStatus, ...]:
        """Poll until every document is indexed, failed or deleted; TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            statuses = self.document_status(collection, doc_ids)
            if finished(statuses):
                return statuses
            if time.monotonic() >= deadline:
                raise TimeoutError(f"documents not indexed within {timeout:.0f}s")
            time.sleep(poll_s)

    def collection_status(self, collection: str, *, timeout: float | None = None) -> CollectionStatus:
        return self._run(self._collection_status(collection, timeout))

    def list_collections(self, *, timeout: float | None = None) -> tuple[str, ...]:
        return self._run(self._list_collections(timeout))

    def delete(self, collection: str, doc_ids: Sequence[str], *, timeout: float | None = None) -> int:
        """Queue the documents' deletion; returns how many were queued."""
        return self._run(self._delete(collection, doc_ids, timeout))

    def list_documents(
        self,
        collection: str,
        *,
        source_prefix: str = "",
        page_size: int = 1000,
        timeout: float | None = None,
    ) -> Iterator[DocumentSummary]:
        """Every document of the collection (not deleted ones; only those whose source_uri starts
        with ``source_prefix`` when given) in doc id order, a page of ``page_size`` per call;
        ``timeout`` is each page's deadline."""
        after = ""
        while True:
            page, after = self._run(
                self._list_documents(collection, source_prefix, page_size, after, timeout)
            )
            yield from page
            if not after:
                return

    def reindex_step(
        self, collection: str, *, start: bool = False, timeout: float | None = None
    ) -> ReindexProgress:
        """Advance the collection's reindex by one bounded step (``start``: begin one when none
        is in progress) and report where it stands. Idempotent: retried like a read."""
        return self._run(self._reindex_step(collection, start, timeout))

    def reindex(
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
                progress = self.reindex_step(collection, start=driver.start, timeout=step_timeout)
            except RagmeshError as exc:
                time.sleep(driver.failed(exc))
                continue
            pause = driver.answered(progress)
            if pause is None:
                return progress
            time.sleep(pause)

    def dead_letters(
        self,
        collection: str = "",
        *,
        limit: int = 1000,
        after_sequence: int = 0,
        timeout: float | None = None,
    ) -> DeadLetterPage:
        return self._run(self._dead_letters(collection, limit, after_sequence, timeout))

    def replay_dead_letters(
        self,
        collection: str = "",
        *,
        sequences: Sequence[int] = (),
        after_sequence: int = 0,
        timeout: float | None = None,
    ) -> ReplayResult:
        """One bounded batch; call again with ``next_after_sequence`` until it is 0."""
        return self._run(self._replay(collection, sequences, after_sequence, timeout))

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
