"""An in-process fake of the gateway and the ingestion API for the client's failure-path tests:
each call takes the next scripted outcome (a status code to fail with, or success) and records
what it received (method, metadata, remaining deadline)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from ragmesh_client._pb.common.v1 import common_pb2
from ragmesh_client._pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh_client._pb.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_client._pb.narrator.v1 import narrator_pb2


@dataclass
class Seen:
    method: str
    metadata: dict[str, str]
    time_remaining: float | None


@dataclass
class Script:
    """Outcomes of the next calls, in order (None: answer); then always answer."""

    outcomes: list[grpc.StatusCode | None] = field(default_factory=list)
    delay_s: float = 0.0
    degraded: bool = False
    # AskStream: fail with this code after the first event.
    stream_break: grpc.StatusCode | None = None
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # ListDocuments serves these ids (source_uri "file:///<id>"), paged by the request's limit.
    documents: list[str] = field(default_factory=list)
    # ReindexCollection: documents indexed into the new generation per step.
    reindex_per_step: int = 2
    reindexed: int = 0
    reindex_started: bool = False
    reindex_documents: int = 5
    # (collection, start) of every ReindexCollection call.
    reindex_calls: list[tuple[str, bool]] = field(default_factory=list)
    calibrations: list[Any] = field(default_factory=list)

    def attempts(self, method: str) -> int:
        return sum(1 for s in self.seen if s.method == method)


def search_reply(degraded: bool) -> gateway_pb2.SearchResponse:
    reply = gateway_pb2.SearchResponse(
        results=[
            gateway_pb2.SearchResult(
                chunk_id="doc-1#0",
                doc_id="doc-1",
                title="Rotating keys",
                text="Mint a new key, move clients, remove the old one.",
                location=common_pb2.ChunkLocation(heading_path=["Keys", "Rotation"], ordinal=0),
                fused_score=0.5,
                rerank_score=3.25,
                fused_rank=2,
                source_uri="file:///docs/keys.md",
                metadata={"team": "platform"},
                leg_ranks=[
                    gateway_pb2.LegRank(leg=gateway_pb2.LEG_DENSE, rank=1, score=0.8),
                    gateway_pb2.LegRank(leg=gateway_pb2.LEG_BM25, rank=3, score=7.0),
                ],
            ),
            gateway_pb2.SearchResult(chunk_id="doc-2#1", doc_id="doc-2", text="other", fused_score=0.25),
        ],
        reranked=True,
        searched_query="rotate keys",
        timings=[gateway_pb2.StageTiming(stage="total", ms=12.5)],
    )
    if degraded:
        reply.degradations.append(
            gateway_pb2.Degradation(
                stage=gateway_pb2.STAGE_SPARSE,
                reason=gateway_pb2.DEGRADATION_REASON_UNAVAILABLE,
                message="sparse: could not reach the service",
                legs=[gateway_pb2.LEG_BM25, gateway_pb2.LEG_EXACT],
                fallback=gateway_pb2.FALLBACK_INDEX_PAYLOAD,
            )
        )
    return reply


def ask_reply(degraded: bool) -> gateway_pb2.AskResponse:
    reply = gateway_pb2.AskResponse(
        answer="Mint a new key and remove the old one [1].",
        answered=True,
        citations=[
            gateway_pb2.AnswerCitation(
                number=1, doc_id="doc-1", chunk_id="doc-1#0", title="Rotating keys", snippet="Mint a new key"
            )
        ],
        sentences=[
            narrator_pb2.Sentence(
                text="Mint a new key and remove the old one [1].",
                sources=[1],
                support_score=2.5,
                support_check=narrator_pb2.SUPPORT_CHECK_CROSS_ENCODER,
            )
        ],
        sources=[gateway_pb2.ExploredSource(chunk_id="doc-1#0", doc_id="doc-1", cited=True)],
        mode=gateway_pb2.ANSWER_MODE_EXTRACTIVE,
    )
    if degraded:
        reply.degradations.append(
            gateway_pb2.Degradation(
                stage=gateway_pb2.STAGE_NARRATOR,
                reason=gateway_pb2.DEGRADATION_REASON_DEADLINE,
                message="late",
            )
        )
    return reply


class _Base:
    def __init__(self, script: Script) -> None:
        self.script = script

    def _attempt(self, method: str, context: grpc.ServicerContext) -> None:
        metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        with self.script.lock:
            self.script.seen.append(Seen(method, metadata, context.time_remaining()))
            outcome = self.script.outcomes.pop(0) if self.script.outcomes else None
        if self.script.delay_s:
            time.sleep(self.script.delay_s)
        if outcome is not None:
            # As a mesh server does: the request id echoed in the trailers of every answer.
            context.set_trailing_metadata((("x-request-id", metadata.get("x-request-id", "")),))
            context.abort(outcome, f"scripted {outcome.name.lower()}")


class FakeGateway(_Base, gateway_pb2_grpc.GatewayServiceServicer):
    def Search(self, request: Any, context: grpc.ServicerContext) -> gateway_pb2.SearchResponse:
        self._attempt("Search", context)
        return search_reply(self.script.degraded)

    def Ask(self, request: Any, context: grpc.ServicerContext) -> gateway_pb2.AskResponse:
        self._attempt("Ask", context)
        return ask_reply(self.script.degraded)

    def AskStream(
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[gateway_pb2.AskStreamResponse]:
        self._attempt("AskStream", context)
        yield gateway_pb2.AskStreamResponse(progress=gateway_pb2.AskProgress(stage="search", ms=3.0, count=5))
        if self.script.stream_break is not None:
            context.abort(self.script.stream_break, "the stream broke")
        yield gateway_pb2.AskStreamResponse(delta="Mint a new key")
        yield gateway_pb2.AskStreamResponse(answer=ask_reply(self.script.degraded))


def _judged(document: Any) -> ingestion_pb2.SubmitResult:
    """As the API judges each document on its own: an empty one is rejected with its reason."""
    if not document.content:
        return ingestion_pb2.SubmitResult(
            doc_id=document.doc_id, outcome=ingestion_pb2.SUBMIT_OUTCOME_REJECTED, reason="empty document"
        )
    return ingestion_pb2.SubmitResult(
        doc_id=document.doc_id, outcome=ingestion_pb2.SUBMIT_OUTCOME_QUEUED, content_sha256="ab"
    )


class FakeIngestion(_Base, ingestion_pb2_grpc.IngestionServiceServicer):
    def IngestDocuments(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._attempt("IngestDocuments", context)
        return ingestion_pb2.IngestDocumentsResponse(results=[_judged(d) for d in request.documents])

    def ListDocuments(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._attempt("ListDocuments", context)
        ids = sorted(
            i
            for i in self.script.documents
            if i > request.after_doc_id and f"file:///{i}".startswith(request.source_uri_prefix)
        )
        page, rest = ids[: request.limit], ids[request.limit :]
        return ingestion_pb2.ListDocumentsResponse(
            documents=[
                ingestion_pb2.DocumentSummary(
                    doc_id=i, state=ingestion_pb2.DOCUMENT_STATE_INDEXED, source_uri=f"file:///{i}"
                )
                for i in page
            ],
            next_after_doc_id=page[-1] if rest else "",
        )

    def ReindexCollection(self, request: Any, context: grpc.ServicerContext) -> Any:
        """A reindex of ``reindex_documents`` documents, ``reindex_per_step`` more indexed per
        call, then one retiring step, then done."""
        self._attempt("ReindexCollection", context)
        script = self.script
        with script.lock:
            script.reindex_calls.append((request.collection, request.start))
            reply = ingestion_pb2.ReindexCollectionResponse(
                collection=request.collection, serving_generation=1, serving_model="minilm"
            )
            if script.reindexed > script.reindex_documents:
                reply.phase = ingestion_pb2.REINDEX_PHASE_DONE
                reply.serving_generation = 2
            elif script.reindexed == script.reindex_documents:
                script.reindexed += 1
                reply.phase = ingestion_pb2.REINDEX_PHASE_RETIRING
                reply.serving_generation, reply.other_generation, reply.retiring = 2, 1, 3
            elif not script.reindex_started and not request.start:
                reply.phase = ingestion_pb2.REINDEX_PHASE_DONE
            else:
                script.reindex_started = True
                script.reindexed = min(script.reindexed + script.reindex_per_step, script.reindex_documents)
                reply.phase = ingestion_pb2.REINDEX_PHASE_BUILDING
                reply.other_generation, reply.documents = 2, script.reindex_documents
                reply.indexed = script.reindexed
                reply.pending = script.reindex_documents - script.reindexed
                reply.building_model = "minilm"
        return reply

    def DeleteDocuments(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._attempt("DeleteDocuments", context)
        return ingestion_pb2.DeleteDocumentsResponse(queued=len(request.doc_ids))

    def GetCollectionStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._attempt("GetCollectionStatus", context)
        return ingestion_pb2.GetCollectionStatusResponse(collection=request.collection, indexed=3, chunks=9)

    def SetCollectionCalibration(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Records the calibration sent (stamped as the server does) and answers it."""
        self._attempt("SetCollectionCalibration", context)
        reply = ingestion_pb2.SetCollectionCalibrationResponse()
        if not request.clear:
            reply.calibration.CopyFrom(request.calibration)
            reply.calibration.embedder_sha256 = "e" * 64
            reply.calibration.calibrated_at.FromSeconds(1_700_000_000)
        with self.script.lock:
            self.script.calibrations.append(request)
        return reply

    def ReplayDeadLetters(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._attempt("ReplayDeadLetters", context)
        return ingestion_pb2.ReplayDeadLettersResponse(replayed=1)


class FakeMesh:
    """Both services on one port, plaintext or TLS (``credentials``)."""

    def __init__(self, credentials: grpc.ServerCredentials | None = None) -> None:
        self.script = Script()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(FakeGateway(self.script), self.server)
        ingestion_pb2_grpc.add_IngestionServiceServicer_to_server(FakeIngestion(self.script), self.server)
        if credentials is None:
            port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            port = self.server.add_secure_port("127.0.0.1:0", credentials)
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)
