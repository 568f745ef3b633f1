"""Requests from keyword arguments, and typed results from the gateway's and ingestion API's
messages. Shared by the sync and the asyncio client."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from ragmesh_client._pb.common.v1 import common_pb2
from ragmesh_client._pb.gateway.v1 import gateway_pb2
from ragmesh_client._pb.ingestion.v1 import ingestion_pb2
from ragmesh_client._pb.narrator.v1 import narrator_pb2
from ragmesh_client._pb.planner.v1 import planner_pb2
from ragmesh_client.types import (
    Answer,
    AskDelta,
    AskEvent,
    AskProgress,
    Citation,
    CollectionCalibration,
    CollectionStatus,
    DeadLetter,
    DeadLetterPage,
    Degradation,
    Document,
    DocumentStatus,
    DocumentSummary,
    Exists,
    IngestResult,
    Location,
    Not,
    ReindexProgress,
    ReplayResult,
    SearchResponse,
    SearchResult,
    Sentence,
    Source,
    Submitted,
)

E = TypeVar("E")
STRATEGIES = {"precise": planner_pb2.STRATEGY_PRECISE, "exhaustive": planner_pb2.STRATEGY_EXHAUSTIVE}
HYDE_MODES = {
    "off": planner_pb2.HYDE_MODE_OFF,
    "fusion": planner_pb2.HYDE_MODE_FUSION,
    "supplement": planner_pb2.HYDE_MODE_SUPPLEMENT,
}
MODES = {"llm": gateway_pb2.ANSWER_MODE_LLM, "extractive": gateway_pb2.ANSWER_MODE_EXTRACTIVE}
ROLES = {"user": narrator_pb2.ROLE_USER, "assistant": narrator_pb2.ROLE_ASSISTANT}
LEGS = ("dense", "bm25", "exact")
FORMATS = {
    "markdown": ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN,
    "text": ingestion_pb2.DOCUMENT_FORMAT_TEXT,
    "html": ingestion_pb2.DOCUMENT_FORMAT_HTML,
    "pdf": ingestion_pb2.DOCUMENT_FORMAT_PDF,
    # Markdown of an Obsidian vault: wikilinks read as their text, embeds dropped, #tags kept.
    "obsidian_markdown": ingestion_pb2.DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN,
}
FORMAT_OF_SUFFIX = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "text",
    ".text": "text",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
}

# A filter: {"key": "value"} (equals), {"key": ["a", "b"]} (one of), {"key": Not("v")} (not
# equal; documents without the key match) or {"key": EXISTS} (set); every entry must hold.
Filter = Mapping[str, str | Sequence[str] | Not | Exists]
# Earlier turns: ("user" | "assistant", text) pairs or {"role": ..., "content": ...} dicts.
History = Iterable[tuple[str, str] | Mapping[str, str]]


def _choice(table: Mapping[str, E], value: str, what: str) -> E:
    if value not in table:
        raise ValueError(f"{what} must be one of {', '.join(sorted(table))}, not {value!r}")
    return table[value]


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    name: str = enum.Name(value) if value in enum.values() else str(value)
    return name.removeprefix(prefix).lower()


def metadata_filter(spec: Filter) -> common_pb2.MetadataFilter:
    clauses = []
    for key, value in spec.items():
        if isinstance(value, str):
            clauses.append(common_pb2.MetadataClause(key=key, op=common_pb2.FILTER_OP_EQ, values=[value]))
        elif isinstance(value, Not):
            clauses.append(
                common_pb2.MetadataClause(key=key, op=common_pb2.FILTER_OP_NE, values=[value.value])
            )
        elif isinstance(value, Exists):
            clauses.append(common_pb2.MetadataClause(key=key, op=common_pb2.FILTER_OP_EXISTS))
        else:
            clauses.append(common_pb2.MetadataClause(key=key, op=common_pb2.FILTER_OP_IN, values=list(value)))
    return common_pb2.MetadataFilter(clauses=clauses)


def chat_history(turns: History) -> list[narrator_pb2.ChatTurn]:
    history = []
    for turn in turns:
        role, content = (turn["role"], turn["content"]) if isinstance(turn, Mapping) else turn
        history.append(narrator_pb2.ChatTurn(role=_choice(ROLES, role, "a turn's role"), content=content))
    return history


def search_request(
    collection: str,
    query: str,
    *,
    top_k: int = 10,
    doc_ids: Sequence[str] = (),
    collapse_documents: bool = False,
    filter: Filter | None = None,
    history: History = (),
    rerank: bool | None = None,
    strategy: str | None = None,
    weights: Mapping[str, float] | None = None,
    rrf_k: int | None = None,
    pool_size: int = 0,
    rerank_candidates: int = 0,
    include_leg_results: bool = False,
) -> gateway_pb2.SearchRequest:
    request = gateway_pb2.SearchRequest(
        collection=collection,
        query=query,
        top_k=top_k,
        doc_ids=list(doc_ids),
        collapse_documents=collapse_documents,
        pool_size=pool_size,
        rerank_candidates=rerank_candidates,
        include_leg_results=include_leg_results,
        history=chat_history(history),
    )
    if filter:
        request.filter.CopyFrom(metadata_filter(filter))
    if rerank is not None:
        request.rerank = rerank
    if strategy is not None:
        request.strategy = _choice(STRATEGIES, strategy, "strategy")
    if rrf_k is not None:
        request.rrf_k = rrf_k
    for leg, weight in (weights or {}).items():
        _choice(dict.fromkeys(LEGS, 0), leg, "a weight's leg")
        setattr(request.weights, leg, weight)
    return request


def ask_request(
    collection: str,
    query: str,
    *,
    passages: int = 0,
    doc_ids: Sequence[str] = (),
    mode: str | None = None,
    filter: Filter | None = None,
    history: History = (),
    rerank: bool | None = None,
    strategy: str | None = None,
    hyde: str | None = None,
    include_facts: bool = False,
) -> gateway_pb2.AskRequest:
    request = gateway_pb2.AskRequest(
        collection=collection,
        query=query,
        passages=passages,
        doc_ids=list(doc_ids),
        include_facts=include_facts,
        history=chat_history(history),
    )
    if mode is not None:
        request.mode = _choice(MODES, mode, "mode")
    if filter:
        request.filter.CopyFrom(metadata_filter(filter))
    if rerank is not None:
        request.rerank = rerank
    if strategy is not None:
        request.strategy = _choice(STRATEGIES, strategy, "strategy")
    if hyde is not None:
        request.hyde_mode = _choice(HYDE_MODES, hyde, "hyde")
    return request


def document_message(document: Document) -> ingestion_pb2.Document:
    content = document.content.encode("utf-8") if isinstance(document.content, str) else document.content
    return ingestion_pb2.Document(
        doc_id=document.doc_id,
        title=document.title,
        format=_choice(FORMATS, document.format or "text", "format"),
        content=content,
        source_uri=document.source_uri,
        metadata=dict(document.metadata),
    )


def file_document(path: Path, doc_id: str | None, metadata: Mapping[str, str]) -> Document:
    """A file as a document: its id (default: the file name), its format from the suffix."""
    suffix = path.suffix.lower()
    if suffix not in FORMAT_OF_SUFFIX:
        raise ValueError(f"{path}: unsupported file type {suffix or '(none)'!r}")
    return Document(
        doc_id=doc_id or path.name,
        content=path.read_bytes(),
        title="",
        format=FORMAT_OF_SUFFIX[suffix],
        source_uri=path.absolute().as_uri(),
        metadata=dict(metadata),
    )


# ----------------------------------------------------------------------------- results


def _location(location: common_pb2.ChunkLocation) -> Location:
    return Location(tuple(location.heading_path), location.ordinal, location.char_start, location.char_end)


def degradations(items: Iterable[gateway_pb2.Degradation]) -> tuple[Degradation, ...]:
    return tuple(
        Degradation(
            stage=_enum_name(gateway_pb2.Stage, d.stage, "STAGE_"),
            reason=_enum_name(gateway_pb2.DegradationReason, d.reason, "DEGRADATION_REASON_"),
            message=d.message,
            legs=tuple(_enum_name(gateway_pb2.Leg, leg, "LEG_") for leg in d.legs),
            fallback="" if not d.fallback else _enum_name(gateway_pb2.Fallback, d.fallback, "FALLBACK_"),
        )
        for d in items
    )


def _timings(items: Iterable[gateway_pb2.StageTiming]) -> dict[str, float]:
    return {t.stage: t.ms for t in items}


def _order_score(result: gateway_pb2.SearchResult, rerank_score: float | None) -> float:
    # A gateway without the ``score`` field: the reranker's score, else the fused one (which
    # need not follow the order when the gateway blended the two).
    if result.HasField("score"):
        return result.score
    return result.fused_score if rerank_score is None else rerank_score


def search_result(result: gateway_pb2.SearchResult) -> SearchResult:
    rerank_score = result.rerank_score if result.HasField("rerank_score") else None
    return SearchResult(
        chunk_id=result.chunk_id,
        doc_id=result.doc_id,
        score=_order_score(result, rerank_score),
        text=result.text,
        title=result.title,
        source_uri=result.source_uri,
        metadata=dict(result.metadata),
        location=_location(result.location),
        fused_score=result.fused_score,
        fused_rank=result.fused_rank,
        rerank_score=rerank_score,
        leg_ranks={_enum_name(gateway_pb2.Leg, lr.leg, "LEG_"): lr.rank for lr in result.leg_ranks},
    )


def search_response(response: gateway_pb2.SearchResponse, request_id: str) -> SearchResponse:
    return SearchResponse(
        results=tuple(search_result(r) for r in response.results),
        degradations=degradations(response.degradations),
        reranked=response.reranked,
        searched_query=response.searched_query,
        unknown_terms=tuple(response.unknown_terms),
        novel_terms=tuple(response.novel_terms),
        timings=_timings(response.timings),
        request_id=request_id,
        raw=response,
    )


def answer(response: gateway_pb2.AskResponse, request_id: str) -> Answer:
    return Answer(
        text=response.answer,
        answered=response.answered,
        citations=tuple(
            Citation(
                number=c.number,
                doc_id=c.doc_id,
                chunk_id=c.chunk_id,
                title=c.title,
                snippet=c.snippet,
                source_uri=c.source_uri,
                metadata=dict(c.metadata),
                location=_location(c.location),
            )
            for c in response.citations
        ),
        sentences=tuple(
            Sentence(
                text=s.text,
                sources=tuple(s.sources),
                support_check=_enum_name(narrator_pb2.SupportCheck, s.support_check, "SUPPORT_CHECK_"),
                support_score=s.support_score if s.HasField("support_score") else None,
            )
            for s in response.sentences
        ),
        sources=tuple(
            Source(
                chunk_id=s.chunk_id,
                doc_id=s.doc_id,
                title=s.title,
                preview=s.preview,
                cited=s.cited,
                rerank_score=s.rerank_score if s.HasField("rerank_score") else None,
            )
            for s in response.sources
        ),
        degradations=degradations(response.degradations),
        mode=_enum_name(gateway_pb2.AnswerMode, response.mode, "ANSWER_MODE_"),
        searched_query=response.searched_query,
        contradictions=tuple((c.description, tuple(c.sources)) for c in response.contradictions),
        timings=_timings(response.timings),
        request_id=request_id,
        raw=response,
    )


def ask_event(event: gateway_pb2.AskStreamResponse, request_id: str) -> AskEvent | None:
    kind = event.WhichOneof("event")
    if kind == "progress":
        return AskProgress(event.progress.stage, event.progress.ms, event.progress.count)
    if kind == "delta":
        return AskDelta(event.delta)
    if kind == "answer":
        return answer(event.answer, request_id)
    return None  # an event kind newer than this client: skipped


def _time(message: Any, name: str) -> datetime | None:
    if not message.HasField(name):
        return None
    stamp: datetime = getattr(message, name).ToDatetime(tzinfo=UTC)
    return stamp


def submitted(response: ingestion_pb2.IngestDocumentsResponse) -> IngestResult:
    return IngestResult(
        Submitted(
            r.doc_id,
            _enum_name(ingestion_pb2.SubmitOutcome, r.outcome, "SUBMIT_OUTCOME_"),
            r.content_sha256,
            r.reason,
        )
        for r in response.results
    )


def document_summary(summary: ingestion_pb2.DocumentSummary) -> DocumentSummary:
    return DocumentSummary(
        doc_id=summary.doc_id,
        state=_enum_name(ingestion_pb2.DocumentState, summary.state, "DOCUMENT_STATE_"),
        source_uri=summary.source_uri,
        content_sha256=summary.content_sha256,
    )


def reindex_progress(response: ingestion_pb2.ReindexCollectionResponse) -> ReindexProgress:
    return ReindexProgress(
        collection=response.collection,
        phase=_enum_name(ingestion_pb2.ReindexPhase, response.phase, "REINDEX_PHASE_"),
        serving_generation=response.serving_generation,
        other_generation=response.other_generation,
        documents=response.documents,
        indexed=response.indexed,
        pending=response.pending,
        failed=response.failed,
        retiring=response.retiring,
        serving_model=response.serving_model,
        building_model=response.building_model,
        raw=response,
    )


def document_status(status: ingestion_pb2.DocumentStatus) -> DocumentStatus:
    return DocumentStatus(
        collection=status.collection,
        doc_id=status.doc_id,
        state=_enum_name(ingestion_pb2.DocumentState, status.state, "DOCUMENT_STATE_"),
        reason=status.reason,
        attempts=status.attempts,
        chunks=status.chunks,
        content_sha256=status.content_sha256,
        updated_at=_time(status, "updated_at"),
    )


def collection_status(response: ingestion_pb2.GetCollectionStatusResponse) -> CollectionStatus:
    return CollectionStatus(
        collection=response.collection,
        queued=response.queued,
        processing=response.processing,
        indexed=response.indexed,
        failed=response.failed,
        deleting=response.deleting,
        chunks=response.chunks,
        calibration=calibration(response.calibration) if response.HasField("calibration") else None,
    )


_LEGS = ("dense", "bm25", "exact")


def calibration(message: ingestion_pb2.CollectionCalibration) -> CollectionCalibration:
    return CollectionCalibration(
        rerank=message.rerank,
        weights={leg: getattr(message, f"weight_{leg}") for leg in _LEGS},
        keep_fused_margin=message.keep_fused_margin if message.HasField("keep_fused_margin") else None,
        queries=message.queries,
        documents=message.documents,
        measured=dict(message.measured),
        rerank_gain=message.rerank_gain,
        rerank_gain_low=message.rerank_gain_low,
        rerank_gain_high=message.rerank_gain_high,
        method=message.method,
        calibrated_at=_time(message, "calibrated_at"),
        embedder_sha256=message.embedder_sha256,
    )


def calibration_message(value: CollectionCalibration) -> ingestion_pb2.CollectionCalibration:
    """The request form of a calibration (the server sets calibrated_at and the embedder)."""
    message = ingestion_pb2.CollectionCalibration(
        rerank=value.rerank,
        queries=value.queries,
        documents=value.documents,
        measured=dict(value.measured),
        rerank_gain=value.rerank_gain,
        rerank_gain_low=value.rerank_gain_low,
        rerank_gain_high=value.rerank_gain_high,
        method=value.method,
        weight_dense=float(value.weights.get("dense", 0.0)),
        weight_bm25=float(value.weights.get("bm25", 0.0)),
        weight_exact=float(value.weights.get("exact", 0.0)),
    )
    if value.keep_fused_margin is not None:
        message.keep_fused_margin = value.keep_fused_margin
    return message


def dead_letter_page(response: ingestion_pb2.ListDeadLettersResponse) -> DeadLetterPage:
    return DeadLetterPage(
        dead_letters=tuple(
            DeadLetter(d.sequence, d.collection, d.doc_id, d.reason, d.attempts, _time(d, "failed_at"))
            for d in response.dead_letters
        ),
        next_after_sequence=response.next_after_sequence,
    )


def replay_result(response: ingestion_pb2.ReplayDeadLettersResponse) -> ReplayResult:
    return ReplayResult(response.replayed, response.superseded, response.next_after_sequence)
