"""Every method of both clients, written once: its signature, docstring, argument handling, the
calls it makes and the loops between them, as a generator of steps (``_steps.py``). ``Client``
runs the steps blocking and ``AsyncClient`` awaits them; neither has any per-method code.

A new RPC is one method here: build its ``Call`` (service, stub method, request, deadline, how
to read the reply) and ``return (yield from run(call))`` under ``@operation``, or ``yield``
``Emit``/``Stream`` steps under ``@iterator``; ``Sleep`` pauses. Both faces get it, with this
signature and docstring and their own return type (see docs/CLIENT.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from ragmesh_client import _convert
from ragmesh_client._calls import (
    GATEWAY,
    INGESTION,
    MAX_PAGE,
    ON_REJECTED,
    Call,
    CallBuilder,
    OnRejected,
    checked,
    contract,
)
from ragmesh_client._pb.gateway.v1 import gateway_pb2
from ragmesh_client._pb.ingestion.v1 import ingestion_pb2
from ragmesh_client._steps import Emit, Items, Sleep, Steps, Stream, iterator, operation, run
from ragmesh_client.errors import DocumentsRejectedError, RagmeshError
from ragmesh_client.types import (
    Answer,
    AskEvent,
    CollectionCalibration,
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

# A reindex step that failed on the way (the API restarting, NATS failing over, a step slower
# than its deadline) is tried again by ``reindex``: the step is idempotent and the reindex's
# state lives in the collection record, not in the caller.
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# Pause before trying a failed step again.
STEP_RETRY_PAUSE_S = 1.0


def finished(statuses: Iterable[DocumentStatus]) -> bool:
    """Every document reached a final state (indexed, failed or deleted)."""
    return all(s.state in ("indexed", "failed", "deleted") for s in statuses)


class Operations(CallBuilder):
    """The methods of ``Client`` and ``AsyncClient`` (``self`` is positional-only where a method
    takes ``**options``, so that type checkers can carry its signature to both faces)."""

    # ------------------------------------------------------------------ gateway

    @operation
    def search(
        self,
        /,
        collection: str,
        query: str,
        *,
        timeout: float | None = None,
        allow_degraded: bool = True,
        request: Message | None = None,
        **options: Any,
    ) -> Steps[SearchResponse]:
        message = (
            contract(request, gateway_pb2.SearchRequest, options)
            if request is not None
            else _convert.search_request(collection, query, **options)
        )
        timeout = self._timeout(timeout, self.config.timeouts.search)
        read = checked(allow_degraded, _convert.search_response)
        return (yield from run(Call(GATEWAY, "Search", message, timeout, read)))

    @operation
    def ask(
        self,
        /,
        collection: str,
        query: str,
        *,
        timeout: float | None = None,
        allow_degraded: bool = True,
        request: Message | None = None,
        **options: Any,
    ) -> Steps[Answer]:
        message = self._ask_message(collection, query, request, options)
        timeout = self._timeout(timeout, self.config.timeouts.ask)
        read = checked(allow_degraded, _convert.answer)
        return (yield from run(Call(GATEWAY, "Ask", message, timeout, read)))

    @iterator
    def ask_stream(
        self,
        /,
        collection: str,
        query: str,
        *,
        timeout: float | None = None,
        request: Message | None = None,
        **options: Any,
    ) -> Items[AskEvent]:
        """Progress per stage, the text as it is written (AskDelta), then the verified Answer."""
        message = gateway_pb2.AskStreamRequest(request=self._ask_message(collection, query, request, options))
        timeout = self._timeout(timeout, self.config.timeouts.ask)
        yield Stream(Call(GATEWAY, "AskStream", message, timeout, _convert.ask_event))

    @staticmethod
    def _ask_message(
        collection: str, query: str, request: Message | None, options: Mapping[str, Any]
    ) -> gateway_pb2.AskRequest:
        if request is not None:
            return contract(request, gateway_pb2.AskRequest, options)
        return _convert.ask_request(collection, query, **options)

    # ------------------------------------------------------------------ ingestion

    @operation
    def ingest(
        self,
        collection: str,
        documents: Iterable[Document],
        *,
        timeout: float | None = None,
        on_rejected: OnRejected = "report",
    ) -> Steps[IngestResult]:
        """Submit documents; each is judged on its own: a valid one is stored and queued, an
        invalid one is rejected with its reason (``result.rejected``) and nothing of it stored.
        ``on_rejected``: report (return them), raise (DocumentsRejectedError if any was
        rejected; the others were still queued) or raise_if_none_accepted."""
        return (yield from run(self._ingest(collection, documents, timeout, on_rejected)))

    @operation
    def ingest_files(
        self,
        collection: str,
        paths: Iterable[str | Path],
        *,
        metadata: dict[str, str] | None = None,
        timeout: float | None = None,
        on_rejected: OnRejected = "report",
    ) -> Steps[IngestResult]:
        """Files as documents: id = file name, format from the suffix (.md, .txt, .html, .pdf)."""
        documents = [_convert.file_document(Path(p), None, metadata or {}) for p in paths]
        return (yield from run(self._ingest(collection, documents, timeout, on_rejected)))

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
            INGESTION, "IngestDocuments", request, self._timeout(timeout, self.config.timeouts.ingest), read
        )

    @operation
    def document_status(
        self, collection: str, doc_ids: Sequence[str], *, timeout: float | None = None
    ) -> Steps[tuple[DocumentStatus, ...]]:
        return (yield from run(self._document_status(collection, doc_ids, timeout)))

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

    @operation
    def wait_indexed(
        self, collection: str, doc_ids: Sequence[str], *, timeout: float = 300.0, poll_s: float = 0.5
    ) -> Steps[tuple[DocumentStatus, ...]]:
        """Poll until every document is indexed, failed or deleted; TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            statuses = yield from run(self._document_status(collection, doc_ids, None))
            if finished(statuses):
                return statuses
            if time.monotonic() >= deadline:
                raise TimeoutError(f"documents not indexed within {timeout:.0f}s")
            yield Sleep(poll_s)

    @operation
    def collection_status(self, collection: str, *, timeout: float | None = None) -> Steps[CollectionStatus]:
        return (
            yield from run(
                Call(
                    INGESTION,
                    "GetCollectionStatus",
                    ingestion_pb2.GetCollectionStatusRequest(collection=collection),
                    self._timeout(timeout, self.config.timeouts.other),
                    lambda reply, _rid: _convert.collection_status(reply),
                )
            )
        )

    @operation
    def set_collection_calibration(
        self, collection: str, calibration: CollectionCalibration | None, *, timeout: float | None = None
    ) -> Steps[CollectionCalibration | None]:
        """Record ``calibration`` for ``collection`` (None: clear it); returns what is recorded."""
        request = ingestion_pb2.SetCollectionCalibrationRequest(
            collection=collection, clear=calibration is None
        )
        if calibration is not None:
            request.calibration.CopyFrom(_convert.calibration_message(calibration))
        return (
            yield from run(
                Call(
                    INGESTION,
                    "SetCollectionCalibration",
                    request,
                    self._timeout(timeout, self.config.timeouts.other),
                    lambda reply, _rid: (
                        _convert.calibration(reply.calibration) if reply.HasField("calibration") else None
                    ),
                )
            )
        )

    @operation
    def list_collections(self, *, timeout: float | None = None) -> Steps[tuple[str, ...]]:
        return (
            yield from run(
                Call(
                    INGESTION,
                    "ListCollections",
                    ingestion_pb2.ListCollectionsRequest(),
                    self._timeout(timeout, self.config.timeouts.other),
                    lambda reply, _rid: tuple(reply.collections),
                )
            )
        )

    @operation
    def delete(self, collection: str, doc_ids: Sequence[str], *, timeout: float | None = None) -> Steps[int]:
        """Queue the documents' deletion; returns how many were queued."""
        return (
            yield from run(
                Call(
                    INGESTION,
                    "DeleteDocuments",
                    ingestion_pb2.DeleteDocumentsRequest(collection=collection, doc_ids=list(doc_ids)),
                    self._timeout(timeout, self.config.timeouts.other),
                    lambda reply, _rid: int(reply.queued),
                )
            )
        )

    @iterator
    def list_documents(
        self,
        collection: str,
        *,
        source_prefix: str = "",
        page_size: int = 1000,
        timeout: float | None = None,
    ) -> Items[DocumentSummary]:
        """Every document of the collection (not deleted ones; only those whose source_uri starts
        with ``source_prefix`` when given) in doc id order, a page of ``page_size`` per call;
        ``timeout`` is each page's deadline."""
        yield from self._list_pages(collection, source_prefix, page_size, timeout, by_source=False)

    @iterator
    def list_folder(
        self,
        collection: str,
        source_prefix: str,
        *,
        page_size: int = 1000,
        timeout: float | None = None,
    ) -> Items[DocumentSummary]:
        """The documents of the collection whose source_uri starts with ``source_prefix`` (a
        folder's ``file://.../``; not deleted ones) in (source_uri, doc id) order, a page of
        ``page_size`` per call: each page costs its size however large the collection is.
        ``timeout`` is each page's deadline."""
        yield from self._list_pages(collection, source_prefix, page_size, timeout, by_source=True)

    def _list_pages(
        self, collection: str, source_prefix: str, page_size: int, timeout: float | None, *, by_source: bool
    ) -> Items[DocumentSummary]:
        if not 1 <= page_size <= MAX_PAGE:
            raise ValueError(f"page_size must be 1..{MAX_PAGE}, not {page_size}")
        after, after_source = "", ""
        while True:
            request = ingestion_pb2.ListDocumentsRequest(
                collection=collection,
                source_uri_prefix=source_prefix,
                limit=page_size,
                after_doc_id=after,
                by_source_uri=by_source,
                after_source_uri=after_source,
            )
            page, after, after_source = yield from run(
                Call(
                    INGESTION,
                    "ListDocuments",
                    request,
                    self._timeout(timeout, self.config.timeouts.other),
                    lambda reply, _rid: (
                        tuple(_convert.document_summary(d) for d in reply.documents),
                        reply.next_after_doc_id,
                        reply.next_after_source_uri,
                    ),
                )
            )
            for summary in page:
                yield Emit(summary)
            if not after:
                return

    @operation
    def reindex_step(
        self, collection: str, *, start: bool = False, timeout: float | None = None
    ) -> Steps[ReindexProgress]:
        """Advance the collection's reindex by one bounded step (``start``: begin one when none
        is in progress) and report where it stands. Idempotent: retried like a read."""
        return (yield from run(self._reindex_step(collection, start, timeout)))

    def _reindex_step(self, collection: str, start: bool, timeout: float | None) -> Call[ReindexProgress]:
        return Call(
            INGESTION,
            "ReindexCollection",
            ingestion_pb2.ReindexCollectionRequest(collection=collection, start=start),
            self._timeout(timeout, self.config.timeouts.other),
            lambda reply, _rid: _convert.reindex_progress(reply),
        )

    @operation
    def reindex(
        self,
        collection: str,
        *,
        on_progress: Callable[[ReindexProgress], None] | None = None,
        interval_s: float = 2.0,
        timeout: float | None = None,
        step_timeout: float = 60.0,
        step_retry_s: float = 120.0,
    ) -> Steps[ReindexProgress]:
        """Start (or resume) the collection's reindex and step it until done, calling
        ``on_progress`` after every step; returns the last (done) progress. TimeoutError after
        ``timeout`` seconds (None: never); the reindex stays where it is, and calling again
        resumes it. A step failing on the way (UNAVAILABLE, DEADLINE_EXCEEDED) is tried again
        for up to ``step_retry_s``."""
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be > 0 seconds (None: wait until done)")
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        # A failed step is tried again until this long after the last step that answered.
        retry_until = now + step_retry_s
        # Only the first step begins a reindex; the others advance (or report) the one begun.
        start = True
        while True:
            try:
                progress = yield from run(self._reindex_step(collection, start, step_timeout))
            except RagmeshError as exc:
                if exc.code not in TRANSIENT or time.monotonic() >= retry_until:
                    raise
                yield Sleep(STEP_RETRY_PAUSE_S)
                continue
            start, retry_until = False, time.monotonic() + step_retry_s
            if on_progress is not None:
                on_progress(progress)
            if progress.done:
                return progress
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"reindex of {progress.collection!r} not complete within {timeout:g}s")
            yield Sleep(interval_s)

    @operation
    def dead_letters(
        self,
        collection: str = "",
        *,
        limit: int = 1000,
        after_sequence: int = 0,
        timeout: float | None = None,
    ) -> Steps[DeadLetterPage]:
        return (
            yield from run(
                Call(
                    INGESTION,
                    "ListDeadLetters",
                    ingestion_pb2.ListDeadLettersRequest(
                        collection=collection, limit=limit, after_sequence=after_sequence
                    ),
                    self._timeout(timeout, self.config.timeouts.other),
                    lambda reply, _rid: _convert.dead_letter_page(reply),
                )
            )
        )

    @operation
    def replay_dead_letters(
        self,
        collection: str = "",
        *,
        sequences: Sequence[int] = (),
        after_sequence: int = 0,
        timeout: float | None = None,
    ) -> Steps[ReplayResult]:
        """One bounded batch; call again with ``next_after_sequence`` until it is 0."""
        return (
            yield from run(
                Call(
                    INGESTION,
                    "ReplayDeadLetters",
                    ingestion_pb2.ReplayDeadLettersRequest(
                        collection=collection, sequences=list(sequences), after_sequence=after_sequence
                    ),
                    self._timeout(timeout, self.config.timeouts.other),
                    lambda reply, _rid: _convert.replay_result(reply),
                )
            )
        )
