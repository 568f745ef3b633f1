"""The synchronous client."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from ragmesh_client._calls import GATEWAY, INGESTION, Call, CallBuilder, finished
from ragmesh_client.config import ClientConfig, new_request_id
from ragmesh_client.errors import from_rpc_error
from ragmesh_client.types import (
    Answer,
    AskEvent,
    CollectionStatus,
    DeadLetterPage,
    Document,
    DocumentStatus,
    ReplayResult,
    SearchResponse,
    Submitted,
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
        self, collection: str, documents: Iterable[Document], *, timeout: float | None = None
    ) -> tuple[Submitted, ...]:
        """Submit documents (all-or-nothing: an invalid one fails the call, nothing is stored)."""
        return self._run(self._ingest(collection, documents, timeout))

    def ingest_files(
        self,
        collection: str,
        paths: Iterable[str | Path],
        *,
        metadata: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[Submitted, ...]:
        """Files as documents: id = file name, format from the suffix (.md, .txt, .html, .pdf)."""
        return self.ingest(collection, self._files(paths, metadata), timeout=timeout)

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
