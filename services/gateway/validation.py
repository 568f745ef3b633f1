"""Search request validation: every field checked against the gateway's limits before any
downstream sees it, and the request's options resolved against the server defaults
(``SearchParams``, and the topicality floor an Ask sets on its search)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from meshkit.core.errors import invalid_argument, resource_exhausted
from meshkit.domain.collections import CollectionRecord, reserved_name_problem
from meshkit.domain.ids import doc_id_problem, validate_collection
from meshkit.domain.metadata import Clause, InvalidFilter, clauses_from_pb, clauses_to_pb
from meshkit.settings import GatewaySettings
from ragmesh.common.v1 import common_pb2
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2

DENSE, BM25, EXACT = "dense", "bm25", "exact"
LEGS = (DENSE, BM25, EXACT)
DEFAULT_TOP_K = 10


@dataclass(frozen=True)
class TopicalityFloor:
    """The gate's topicality floor as configured: ``min_similarity`` (-1: off) for questions
    embedded by one of ``models`` ("*": any). Cosines are one embedder's scale, so a floor
    calibrated for one model says nothing of another's: it is then not applied. It lives with
    the search's parameters because a search an Ask runs skips reranking a question the floor
    refuses (the answer wing reads the same floor for its gate)."""

    min_similarity: float
    models: frozenset[str]

    @classmethod
    def parse(cls, min_similarity: float, models: str) -> TopicalityFloor:
        return cls(min_similarity, frozenset(m.strip() for m in models.split(",") if m.strip()))

    def similarity(self, best: float | None, model: str) -> float | None:
        """``best`` (the dense leg's best cosine) when the floor holds for ``model``; else None."""
        return best if "*" in self.models or model in self.models else None

    def refuses(self, best: float | None, model: str) -> bool:
        """Whether a question this near the collection, embedded by ``model``, is off topic."""
        calibrated = self.similarity(best, model)
        return calibrated is not None and calibrated < self.min_similarity


@dataclass(frozen=True)
class SearchParams:
    collection: str
    query: str
    top_k: int
    doc_ids: list[str]
    collapse_documents: bool
    rrf_k: int
    # Leg name -> RRF weight; 0 disables the leg.
    weights: dict[str, float]
    strategy: planner_pb2.Strategy
    # 0: the planner's default.
    max_variations: int
    include_leg_results: bool
    # 0: the plan's pool size.
    pool_size: int
    rerank: bool = False
    # 0: by the plan's strategy.
    rerank_candidates: int = 0
    # The reranker's keep-fused margin (log-odds); the server default unless the request set one.
    keep_fused_margin: float = 0.0
    # Unspecified: the planner's default.
    hyde_mode: planner_pb2.HydeMode = planner_pb2.HYDE_MODE_UNSPECIFIED
    # Metadata filter clauses (all must hold); empty: none.
    metadata_filter: tuple[Clause, ...] = ()
    # Earlier turns of the conversation, oldest first (the planner rewrites a follow-up).
    history: tuple[narrator_pb2.ChatTurn, ...] = ()
    # The collection's record (meshkit.domain.collections) once resolved: ``collection`` is then the
    # store collection of its serving generation. None: no record (nothing indexed yet).
    record: CollectionRecord | None = None
    # Set by an Ask: a question under this floor will be refused as off topic, so reranking
    # its passages would be time spent on an answer that is not given.
    skip_rerank_off_topic: TopicalityFloor | None = None
    # The options the request set itself ("rerank", "keep_fused_margin", "weights.<leg>"): a
    # collection's calibration (services/gateway/calibration.py) fills in only the others.
    explicit: frozenset[str] = frozenset()
    # Set by an Ask: its evidence gate reads the cross-encoder's scores of the passages, so a
    # calibration that turns reranking off keeps the fused order but still has them scored.
    scores_passages: bool = False

    def enabled(self, leg: str) -> bool:
        return self.weights[leg] > 0

    def filter_pb(self) -> common_pb2.MetadataFilter:
        """The filter as every leg receives it."""
        return clauses_to_pb(self.metadata_filter)


# Log-odds: beyond this every reranking would give way to the fused order.
MAX_KEEP_FUSED_MARGIN = 100.0


def _bounded(value: int, limit: int, what: str) -> int:
    if value > limit:
        raise invalid_argument(f"{what} is {value}, the limit is {limit}")
    return value


def _weights(request: gateway_pb2.SearchRequest, settings: GatewaySettings) -> dict[str, float]:
    given = request.weights
    defaults = {
        DENSE: settings.gateway_weight_dense,
        BM25: settings.gateway_weight_bm25,
        EXACT: settings.gateway_weight_exact,
    }
    weights: dict[str, float] = {}
    for leg in LEGS:
        value = float(getattr(given, leg)) if given.HasField(leg) else defaults[leg]
        if not math.isfinite(value) or value < 0:
            raise invalid_argument(f"weights.{leg} must be a finite number >= 0, got {value}")
        weights[leg] = value
    if not any(weights.values()):
        raise invalid_argument("every leg weight is 0: at least one leg must be enabled")
    return weights


def _doc_ids(raw: list[str], settings: GatewaySettings) -> list[str]:
    _bounded(len(raw), settings.gateway_max_doc_ids, "the number of doc_ids")
    for i, doc_id in enumerate(raw):
        problem = doc_id_problem(doc_id)
        if problem:
            raise invalid_argument(f"doc_ids[{i}]: {problem}")
    return list(dict.fromkeys(raw))


def _metadata_filter(filter_pb: common_pb2.MetadataFilter) -> tuple[Clause, ...]:
    try:
        return clauses_from_pb(filter_pb)
    except InvalidFilter as exc:
        raise invalid_argument(str(exc)) from exc


def validate_search(request: gateway_pb2.SearchRequest, settings: GatewaySettings) -> SearchParams:
    collection = validate_collection(request.collection)
    reserved = reserved_name_problem(collection)
    if reserved:
        raise invalid_argument(reserved)
    if not request.query.strip():
        raise invalid_argument("query is empty")
    _bounded(len(request.query), settings.gateway_max_query_chars, "the query length in characters")
    top_k = _bounded(request.top_k or DEFAULT_TOP_K, settings.gateway_max_top_k, "top_k")
    max_variations = _bounded(request.max_variations, settings.gateway_max_variations, "max_variations")
    pool_size = _bounded(request.pool_size, settings.gateway_max_pool_size, "pool_size")
    if request.strategy not in planner_pb2.Strategy.values():
        raise invalid_argument(f"strategy {request.strategy} is not a known Strategy")
    if request.hyde_mode not in planner_pb2.HydeMode.values():
        raise invalid_argument(f"hyde_mode {request.hyde_mode} is not a known HydeMode")
    rerank_candidates = _bounded(
        request.rerank_candidates, settings.gateway_max_rerank_candidates, "rerank_candidates"
    )
    rrf_k = request.rrf_k if request.HasField("rrf_k") else settings.gateway_rrf_k
    if rrf_k < 1:
        raise invalid_argument(f"rrf_k must be >= 1, got {rrf_k}")
    _validate_history(list(request.history), settings)
    margin = (
        request.keep_fused_margin
        if request.HasField("keep_fused_margin")
        else settings.calibration.rerank_keep_fused_margin
    )
    if not 0.0 <= margin <= MAX_KEEP_FUSED_MARGIN:  # also refuses NaN
        raise invalid_argument(f"keep_fused_margin must be in [0, {MAX_KEEP_FUSED_MARGIN}], got {margin}")
    return SearchParams(
        collection=collection,
        query=request.query,
        top_k=top_k,
        doc_ids=_doc_ids(list(request.doc_ids), settings),
        collapse_documents=request.collapse_documents,
        rrf_k=rrf_k,
        weights=_weights(request, settings),
        strategy=request.strategy,
        max_variations=max_variations,
        include_leg_results=request.include_leg_results,
        pool_size=pool_size,
        rerank=request.rerank if request.HasField("rerank") else settings.gateway_rerank,
        rerank_candidates=rerank_candidates,
        keep_fused_margin=margin,
        hyde_mode=request.hyde_mode,
        metadata_filter=_metadata_filter(request.filter),
        history=tuple(request.history),
        explicit=_explicit_options(request),
    )


def _explicit_options(request: gateway_pb2.SearchRequest) -> frozenset[str]:
    given = {name for name in ("rerank", "keep_fused_margin") if request.HasField(name)}
    return frozenset(given | {f"weights.{leg}" for leg in LEGS if request.weights.HasField(leg)})


ANSWER_MODES = {gateway_pb2.ANSWER_MODE_LLM: "llm", gateway_pb2.ANSWER_MODE_EXTRACTIVE: "extractive"}


def validate_ask(request: gateway_pb2.AskRequest, settings: GatewaySettings) -> tuple[SearchParams, int, str]:
    """The search an Ask runs (validated as any search), the passages it reads and its mode."""
    passages = _bounded(
        request.passages or settings.gateway_ask_passages, settings.gateway_ask_max_passages, "passages"
    )
    if request.mode != gateway_pb2.ANSWER_MODE_UNSPECIFIED and request.mode not in ANSWER_MODES:
        raise invalid_argument(f"mode {request.mode} is not a known AnswerMode")
    mode = ANSWER_MODES.get(request.mode, settings.gateway_answer_mode)
    search = gateway_pb2.SearchRequest(
        collection=request.collection,
        query=request.query,
        top_k=min(settings.gateway_max_top_k, max(passages, DEFAULT_TOP_K)),
        doc_ids=request.doc_ids,
        strategy=request.strategy,
        hyde_mode=request.hyde_mode,
        filter=request.filter,
        history=request.history,
    )
    if request.HasField("rerank"):
        search.rerank = request.rerank
    return replace(validate_search(search, settings), scores_passages=True), passages, mode


def _validate_history(history: list[narrator_pb2.ChatTurn], settings: GatewaySettings) -> None:
    if len(history) > settings.gateway_max_history_turns:
        raise resource_exhausted(
            f"history has {len(history)} turns, the limit is {settings.gateway_max_history_turns}"
        )
    total = sum(len(turn.content) for turn in history)
    if total > settings.gateway_max_history_chars:
        raise resource_exhausted(
            f"history is {total} characters, the limit is {settings.gateway_max_history_chars}"
        )
    for i, turn in enumerate(history):
        if turn.role not in (narrator_pb2.ROLE_USER, narrator_pb2.ROLE_ASSISTANT):
            raise invalid_argument(f"history[{i}].role must be ROLE_USER or ROLE_ASSISTANT")
        if not turn.content.strip():
            raise invalid_argument(f"history[{i}].content is empty")
