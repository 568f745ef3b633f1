"""What each client method sends: the stub method, the request, its deadline and how to read the
reply. The sync and asyncio clients only differ in how they run a ``Call``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import grpc
from google.protobuf.message import Message

from ragmesh_client import _convert
from ragmesh_client._pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh_client._pb.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_client.config import TLS, ClientConfig, RetryPolicy, Timeouts, grpc_target
from ragmesh_client.errors import DocumentsRejectedError, RagmeshError, degraded_error
from ragmesh_client.types import (
    Answer,
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
GATEWAY, INGESTION = "gateway", "ingestion"
# What ingest does with rejected documents: return them in the result (report), raise
# DocumentsRejectedError when any was rejected (raise) or when none was accepted.
OnRejected = Literal["report", "raise", "raise_if_none_accepted"]
ON_REJECTED: tuple[OnRejected, ...] = ("report", "raise", "raise_if_none_accepted")
# The most documents one ListDocuments page may ask for (the API's own limit).
MAX_PAGE = 10_000


@dataclass(frozen=True)
class Call(Generic[T]):
    service: str  # GATEWAY or INGESTION
    method: str
    request: Any
    timeout: float
    read: Callable[[Any, str], T]


def _checked(allow_degraded: bool, read: Callable[[Any, str], T]) -> Callable[[Any, str], T]:
    """``read``, raising UnavailableError (with them) when the reply carries degradations and the
    caller refused a degraded result."""

    def checked(reply: Any, request_id: str) -> T:
        result = read(reply, request_id)
        found = getattr(result, "degradations", ())
        if found and not allow_degraded:
            raise degraded_error(found, request_id)
        return result

    return checked


M = TypeVar("M", bound=Message)


def _contract(message: Message, kind: type[M], options: Mapping[str, Any]) -> M:
    """A request given as a contract message (``request=``), checked to be the one expected."""
    if options:
        raise ValueError(f"give either request= or options, not both ({', '.join(sorted(options))})")
    expected = kind.DESCRIPTOR.full_name
    if message.DESCRIPTOR.full_name != expected:
        raise TypeError(f"request must be a {expected}, not a {message.DESCRIPTOR.full_name}")
    return message  # type: ignore[return-value]


def _stub_types() -> dict[str, Any]:
    return {
        GATEWAY: gateway_pb2_grpc.GatewayServiceStub,
        INGESTION: ingestion_pb2_grpc.IngestionServiceStub,
    }


class CallBuilder:
    """The configuration and the calls, for both clients."""

    def __init__(
        self,
        gateway: str | None = None,
        *,
        ingestion: str | None = None,
        api_key: str | None = None,
        tls: TLS | None = None,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        config: ClientConfig | None = None,
    ) -> None:
        base = config or ClientConfig()
        self.config = ClientConfig(
            gateway=gateway or base.gateway,
            ingestion=ingestion or base.ingestion,
            api_key=api_key if api_key is not None else base.api_key,
            tls=tls if tls is not None else base.tls,
            timeouts=timeouts or base.timeouts,
            retry=retry or base.retry,
        )
        self._targets = {
            GATEWAY: grpc_target(self.config.gateway),
            INGESTION: grpc_target(self.config.ingestion),
        }

    def _target(self, service: str) -> str:
        return self._targets[service]

    def _stub(self, service: str, channel: Any) -> Any:
        return _stub_types()[service](channel)

    def _credentials(self) -> grpc.ChannelCredentials | None:
        return None if self.config.tls is None else self.config.tls.credentials()

    @staticmethod
    def _timeout(given: float | None, default: float) -> float:
        timeout = default if given is None else given
        if not timeout > 0:
            raise ValueError("timeout must be > 0 seconds")
        return timeout

    # ------------------------------------------------------------------ gateway

    def _search(
        self,
        collection: str,
        query: str,
        timeout: float | None,
        allow_degraded: bool,
        request: Message | None,
        options: Mapping[str, Any],
    ) -> Call[SearchResponse]:
        message = (
            _contract(request, gateway_pb2.SearchRequest, options)
            if request is not None
            else _convert.search_request(collection, query, **options)
        )
        return Call(
            GATEWAY,
            "Search",
            message,
            self._timeout(timeout, self.config.timeouts.search),
            _checked(allow_degraded, _convert.search_response),
        )

    def _ask(
        self,
        collection: str,
        query: str,
        timeout: float | None,
        allow_degraded: bool,
        request: Message | None,
        options: Mapping[str, Any],
    ) -> Call[Answer]:
        message = self._ask_message(collection, query, request, options)
        return Call(
            GATEWAY,
            "Ask",
            message,
            self._timeout(timeout, self.config.timeouts.ask),
            _checked(allow_degraded, _convert.answer),
        )

    def _ask_stream(
        self,
        collection: str,
        query: str,
        timeout: float | None,
        request: Message | None,
        options: Mapping[str, Any],
    ) -> Call[Any]:
        message = self._ask_message(collection, query, request, options)
        return Call(
            GATEWAY,
            "AskStream",
            gateway_pb2.AskStreamRequest(request=message),
            self._timeout(timeout, self.config.timeouts.ask),
            _convert.ask_event,
        )

    @staticmethod
    def _ask_message(
        collection: str, query: str, request: Message | None, options: Mapping[str, Any]
    ) -> gateway_pb2.AskRequest:
        if request is not None:
            return _contract(request, gateway_pb2.AskRequest, options)
        return _convert.ask_request(collection, query, **options)

    # ------------------------------------------------------------------ ingestion

    def _ingest(
        self, collection: str, documents: Iterable[Document], timeout: float | None, on_rejected: OnRejected
    ) -> Call[IngestResult]:
        if on_rejected not in ON_REJECTED:
            raise ValueError(f"on_rejected must be one of {', '.join(ON_REJECTED)}, not {on_rejected!r}")
        request = ingestion_pb2.IngestDocumentsRequest(
            collection=collection, documents=[_convert.document_message(d) for d in documents]
        )
        if not request.documents:
            raise ValueError("no documents to ingest")

        def read(reply: Any, request_id: str) -> IngestResult:
            result = _convert.submitted(reply)
            refused = result.rejected and (on_rejected == "raise" or not result.accepted)
            if refused and on_rejected != "report":
                raise DocumentsRejectedError(result, request_id)
            return result

        return Call(
            INGESTION,
            "IngestDocuments",
            request,
            self._timeout(timeout, self.config.timeouts.ingest),
            read,
        )

    @staticmethod
    def _files(paths: Iterable[str | Path], metadata: Mapping[str, str] | None) -> list[Document]:
        return [_convert.file_document(Path(p), None, metadata or {}) for p in paths]

    def _document_status(
        self, collection: str, doc_ids: Sequence[str], timeout: float | None
    ) -> Call[tuple[DocumentStatus, ...]]:
        return Call(
            INGESTION,
            "GetDocumentStatus",
            ingestion_pb2.GetDocumentStatusRequest(collection=collection, doc_ids=list(doc_ids)),
            self._timeout(timeout, self.config.timeouts.other),
            lambda reply, _rid: tuple(_convert.document_status(d) for d in reply.documents),
        )

    def _collection_status(self, collection: str, timeout: float | None) -> Call[CollectionStatus]:
        return Call(
            INGESTION,
            "GetCollectionStatus",
            ingestion_pb2.GetCollectionStatusRequest(collection=collection),
            self._timeout(timeout, self.config.timeouts.other),
            lambda reply, _rid: _convert.collection_status(reply),
        )

    def _list_collections(self, timeout: float | None) -> Call[tuple[str, ...]]:
        return Call(
            INGESTION,
            "ListCollections",
            ingestion_pb2.ListCollectionsRequest(),
            self._timeout(timeout, self.config.timeouts.other),
            lambda reply, _rid: tuple(reply.collections),
        )

    def _delete(self, collection: str, doc_ids: Sequence[str], timeout: float | None) -> Call[int]:
        return Call(
            INGESTION,
            "DeleteDocuments",
            ingestion_pb2.DeleteDocumentsRequest(collection=collection, doc_ids=list(doc_ids)),
            self._timeout(timeout, self.config.timeouts.other),
            lambda reply, _rid: int(reply.queued),
        )

    def _list_documents(
        self, collection: str, source_prefix: str, page_size: int, after: str, timeout: float | None
    ) -> Call[tuple[tuple[DocumentSummary, ...], str]]:
        """One page of ListDocuments: the documents and the cursor of the next page ("" at the end)."""
        if not 1 <= page_size <= MAX_PAGE:
            raise ValueError(f"page_size must be 1..{MAX_PAGE}, not {page_size}")
        return Call(
            INGESTION,
            "ListDocuments",
            ingestion_pb2.ListDocumentsRequest(
                collection=collection, source_uri_prefix=source_prefix, limit=page_size, after_doc_id=after
            ),
            self._timeout(timeout, self.config.timeouts.other),
            lambda reply, _rid: (
                tuple(_convert.document_summary(d) for d in reply.documents),
                reply.next_after_doc_id,
            ),
        )

    def _reindex_step(self, collection: str, start: bool, timeout: float | None) -> Call[ReindexProgress]:
        return Call(
            INGESTION,
            "ReindexCollection",
            ingestion_pb2.ReindexCollectionRequest(collection=collection, start=start),
            self._timeout(timeout, self.config.timeouts.other),
            lambda reply, _rid: _convert.reindex_progress(reply),
        )

    def _dead_letters(
        self, collection: str, limit: int, after_sequence: int, timeout: float | None
    ) -> Call[DeadLetterPage]:
        return Call(
            INGESTION,
            "ListDeadLetters",
            ingestion_pb2.ListDeadLettersRequest(
                collection=collection, limit=limit, after_sequence=after_sequence
            ),
            self._timeout(timeout, self.config.timeouts.other),
            lambda reply, _rid: _convert.dead_letter_page(reply),
        )

    def _replay(
        self, collection: str, sequences: Sequence[int], after_sequence: int, timeout: float | None
    ) -> Call[ReplayResult]:
        return Call(
            INGESTION,
            "ReplayDeadLetters",
            ingestion_pb2.ReplayDeadLettersRequest(
                collection=collection, sequences=list(sequences), after_sequence=after_sequence
            ),
            self._timeout(timeout, self.config.timeouts.other),
            lambda reply, _rid: _convert.replay_result(reply),
        )


def finished(statuses: Iterable[DocumentStatus]) -> bool:
    """Every document reached a final state (indexed, failed or deleted)."""
    return all(s.state in ("indexed", "failed", "deleted") for s in statuses)


# A reindex step that failed on the way (the API restarting, NATS failing over, a step slower
# than its deadline) is tried again by ``reindex``: the step is idempotent and the reindex's
# state lives in the collection record, not in the caller.
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# Pause before trying a failed step again.
STEP_RETRY_PAUSE_S = 1.0


class ReindexDriver:
    """What ``reindex`` decides between steps, for both clients (they only differ in how they
    call a step and how they sleep): whether the next step starts the reindex, whether a failed
    step is tried again, when to give up, and how long to pause."""

    def __init__(
        self,
        on_progress: Callable[[ReindexProgress], None] | None,
        interval_s: float,
        timeout: float | None,
        step_retry_s: float,
    ) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be > 0 seconds (None: wait until done)")
        now = time.monotonic()
        self.on_progress, self.interval_s, self.timeout = on_progress, interval_s, timeout
        self.step_retry_s = step_retry_s
        self.deadline = None if timeout is None else now + timeout
        self.retry_until = now + step_retry_s
        # Only the first step begins a reindex; the others advance (or report) the one begun.
        self.start = True

    def failed(self, exc: RagmeshError) -> float:
        """The pause before trying again a step that failed on the way within the retry
        window since the last step that answered; anything else is raised."""
        if exc.code not in TRANSIENT or time.monotonic() >= self.retry_until:
            raise exc
        return STEP_RETRY_PAUSE_S

    def answered(self, progress: ReindexProgress) -> float | None:
        """None when the reindex is done, else the pause before the next step; TimeoutError
        once ``timeout`` has passed."""
        self.start, self.retry_until = False, time.monotonic() + self.step_retry_s
        if self.on_progress is not None:
            self.on_progress(progress)
        if progress.done:
            return None
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise TimeoutError(f"reindex of {progress.collection!r} not complete within {self.timeout:g}s")
        return self.interval_s
