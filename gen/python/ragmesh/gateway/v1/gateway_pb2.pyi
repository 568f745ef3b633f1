from ragmesh.common.v1 import common_pb2 as _common_pb2
from ragmesh.extractor.v1 import extractor_pb2 as _extractor_pb2
from ragmesh.narrator.v1 import narrator_pb2 as _narrator_pb2
from ragmesh.planner.v1 import planner_pb2 as _planner_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Leg(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEG_UNSPECIFIED: _ClassVar[Leg]
    LEG_DENSE: _ClassVar[Leg]
    LEG_BM25: _ClassVar[Leg]
    LEG_EXACT: _ClassVar[Leg]

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    STAGE_PLANNER: _ClassVar[Stage]
    STAGE_EMBEDDER: _ClassVar[Stage]
    STAGE_INDEX: _ClassVar[Stage]
    STAGE_SPARSE: _ClassVar[Stage]
    STAGE_RERANKER: _ClassVar[Stage]
    STAGE_HYDE: _ClassVar[Stage]
    STAGE_EXTRACTOR: _ClassVar[Stage]
    STAGE_NARRATOR: _ClassVar[Stage]

class DegradationReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEGRADATION_REASON_UNSPECIFIED: _ClassVar[DegradationReason]
    DEGRADATION_REASON_UNAVAILABLE: _ClassVar[DegradationReason]
    DEGRADATION_REASON_DEADLINE: _ClassVar[DegradationReason]
    DEGRADATION_REASON_BREAKER_OPEN: _ClassVar[DegradationReason]
    DEGRADATION_REASON_ERROR: _ClassVar[DegradationReason]
    DEGRADATION_REASON_INVALID_OUTPUT: _ClassVar[DegradationReason]
    DEGRADATION_REASON_DEGENERATE_OUTPUT: _ClassVar[DegradationReason]

class Fallback(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FALLBACK_UNSPECIFIED: _ClassVar[Fallback]
    FALLBACK_INDEX_PAYLOAD: _ClassVar[Fallback]

class AnswerMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ANSWER_MODE_UNSPECIFIED: _ClassVar[AnswerMode]
    ANSWER_MODE_LLM: _ClassVar[AnswerMode]
    ANSWER_MODE_EXTRACTIVE: _ClassVar[AnswerMode]
LEG_UNSPECIFIED: Leg
LEG_DENSE: Leg
LEG_BM25: Leg
LEG_EXACT: Leg
STAGE_UNSPECIFIED: Stage
STAGE_PLANNER: Stage
STAGE_EMBEDDER: Stage
STAGE_INDEX: Stage
STAGE_SPARSE: Stage
STAGE_RERANKER: Stage
STAGE_HYDE: Stage
STAGE_EXTRACTOR: Stage
STAGE_NARRATOR: Stage
DEGRADATION_REASON_UNSPECIFIED: DegradationReason
DEGRADATION_REASON_UNAVAILABLE: DegradationReason
DEGRADATION_REASON_DEADLINE: DegradationReason
DEGRADATION_REASON_BREAKER_OPEN: DegradationReason
DEGRADATION_REASON_ERROR: DegradationReason
DEGRADATION_REASON_INVALID_OUTPUT: DegradationReason
DEGRADATION_REASON_DEGENERATE_OUTPUT: DegradationReason
FALLBACK_UNSPECIFIED: Fallback
FALLBACK_INDEX_PAYLOAD: Fallback
ANSWER_MODE_UNSPECIFIED: AnswerMode
ANSWER_MODE_LLM: AnswerMode
ANSWER_MODE_EXTRACTIVE: AnswerMode

class LegWeights(_message.Message):
    __slots__ = ("dense", "bm25", "exact")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    BM25_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    dense: float
    bm25: float
    exact: float
    def __init__(self, dense: _Optional[float] = ..., bm25: _Optional[float] = ..., exact: _Optional[float] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("collection", "query", "top_k", "doc_ids", "collapse_documents", "rrf_k", "weights", "strategy", "max_variations", "include_leg_results", "pool_size", "rerank", "rerank_candidates", "hyde_mode", "filter", "history", "keep_fused_margin")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    COLLAPSE_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    RRF_K_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    MAX_VARIATIONS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_LEG_RESULTS_FIELD_NUMBER: _ClassVar[int]
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    RERANK_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    HYDE_MODE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    KEEP_FUSED_MARGIN_FIELD_NUMBER: _ClassVar[int]
    collection: str
    query: str
    top_k: int
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    collapse_documents: bool
    rrf_k: int
    weights: LegWeights
    strategy: _planner_pb2.Strategy
    max_variations: int
    include_leg_results: bool
    pool_size: int
    rerank: bool
    rerank_candidates: int
    hyde_mode: _planner_pb2.HydeMode
    filter: _common_pb2.MetadataFilter
    history: _containers.RepeatedCompositeFieldContainer[_narrator_pb2.ChatTurn]
    keep_fused_margin: float
    def __init__(self, collection: _Optional[str] = ..., query: _Optional[str] = ..., top_k: _Optional[int] = ..., doc_ids: _Optional[_Iterable[str]] = ..., collapse_documents: _Optional[bool] = ..., rrf_k: _Optional[int] = ..., weights: _Optional[_Union[LegWeights, _Mapping]] = ..., strategy: _Optional[_Union[_planner_pb2.Strategy, str]] = ..., max_variations: _Optional[int] = ..., include_leg_results: _Optional[bool] = ..., pool_size: _Optional[int] = ..., rerank: _Optional[bool] = ..., rerank_candidates: _Optional[int] = ..., hyde_mode: _Optional[_Union[_planner_pb2.HydeMode, str]] = ..., filter: _Optional[_Union[_common_pb2.MetadataFilter, _Mapping]] = ..., history: _Optional[_Iterable[_Union[_narrator_pb2.ChatTurn, _Mapping]]] = ..., keep_fused_margin: _Optional[float] = ...) -> None: ...

class LegRank(_message.Message):
    __slots__ = ("leg", "rank", "score")
    LEG_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    leg: Leg
    rank: int
    score: float
    def __init__(self, leg: _Optional[_Union[Leg, str]] = ..., rank: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class SearchResult(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "title", "text", "location", "fused_score", "leg_ranks", "rerank_score", "fused_rank", "source_uri", "metadata", "score")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    FUSED_SCORE_FIELD_NUMBER: _ClassVar[int]
    LEG_RANKS_FIELD_NUMBER: _ClassVar[int]
    RERANK_SCORE_FIELD_NUMBER: _ClassVar[int]
    FUSED_RANK_FIELD_NUMBER: _ClassVar[int]
    SOURCE_URI_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    title: str
    text: str
    location: _common_pb2.ChunkLocation
    fused_score: float
    leg_ranks: _containers.RepeatedCompositeFieldContainer[LegRank]
    rerank_score: float
    fused_rank: int
    source_uri: str
    metadata: _containers.ScalarMap[str, str]
    score: float
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., location: _Optional[_Union[_common_pb2.ChunkLocation, _Mapping]] = ..., fused_score: _Optional[float] = ..., leg_ranks: _Optional[_Iterable[_Union[LegRank, _Mapping]]] = ..., rerank_score: _Optional[float] = ..., fused_rank: _Optional[int] = ..., source_uri: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., score: _Optional[float] = ...) -> None: ...

class Degradation(_message.Message):
    __slots__ = ("stage", "reason", "message", "legs", "fallback")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEGS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    stage: Stage
    reason: DegradationReason
    message: str
    legs: _containers.RepeatedScalarFieldContainer[Leg]
    fallback: Fallback
    def __init__(self, stage: _Optional[_Union[Stage, str]] = ..., reason: _Optional[_Union[DegradationReason, str]] = ..., message: _Optional[str] = ..., legs: _Optional[_Iterable[_Union[Leg, str]]] = ..., fallback: _Optional[_Union[Fallback, str]] = ...) -> None: ...

class StageTiming(_message.Message):
    __slots__ = ("stage", "ms")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    ms: float
    def __init__(self, stage: _Optional[str] = ..., ms: _Optional[float] = ...) -> None: ...

class LegHit(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "score")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    score: float
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class LegResult(_message.Message):
    __slots__ = ("leg", "hits")
    LEG_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    leg: Leg
    hits: _containers.RepeatedCompositeFieldContainer[LegHit]
    def __init__(self, leg: _Optional[_Union[Leg, str]] = ..., hits: _Optional[_Iterable[_Union[LegHit, _Mapping]]] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("results", "plan", "degradations", "timings", "leg_results", "reranked", "fused_hits", "searched_query", "unknown_terms", "novel_terms")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    DEGRADATIONS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    LEG_RESULTS_FIELD_NUMBER: _ClassVar[int]
    RERANKED_FIELD_NUMBER: _ClassVar[int]
    FUSED_HITS_FIELD_NUMBER: _ClassVar[int]
    SEARCHED_QUERY_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_TERMS_FIELD_NUMBER: _ClassVar[int]
    NOVEL_TERMS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SearchResult]
    plan: _planner_pb2.Plan
    degradations: _containers.RepeatedCompositeFieldContainer[Degradation]
    timings: _containers.RepeatedCompositeFieldContainer[StageTiming]
    leg_results: _containers.RepeatedCompositeFieldContainer[LegResult]
    reranked: bool
    fused_hits: _containers.RepeatedCompositeFieldContainer[LegHit]
    searched_query: str
    unknown_terms: _containers.RepeatedScalarFieldContainer[str]
    novel_terms: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, results: _Optional[_Iterable[_Union[SearchResult, _Mapping]]] = ..., plan: _Optional[_Union[_planner_pb2.Plan, _Mapping]] = ..., degradations: _Optional[_Iterable[_Union[Degradation, _Mapping]]] = ..., timings: _Optional[_Iterable[_Union[StageTiming, _Mapping]]] = ..., leg_results: _Optional[_Iterable[_Union[LegResult, _Mapping]]] = ..., reranked: _Optional[bool] = ..., fused_hits: _Optional[_Iterable[_Union[LegHit, _Mapping]]] = ..., searched_query: _Optional[str] = ..., unknown_terms: _Optional[_Iterable[str]] = ..., novel_terms: _Optional[_Iterable[str]] = ...) -> None: ...

class AskRequest(_message.Message):
    __slots__ = ("collection", "query", "passages", "doc_ids", "mode", "history", "hyde_mode", "rerank", "strategy", "include_facts", "filter")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    HYDE_MODE_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FACTS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    collection: str
    query: str
    passages: int
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    mode: AnswerMode
    history: _containers.RepeatedCompositeFieldContainer[_narrator_pb2.ChatTurn]
    hyde_mode: _planner_pb2.HydeMode
    rerank: bool
    strategy: _planner_pb2.Strategy
    include_facts: bool
    filter: _common_pb2.MetadataFilter
    def __init__(self, collection: _Optional[str] = ..., query: _Optional[str] = ..., passages: _Optional[int] = ..., doc_ids: _Optional[_Iterable[str]] = ..., mode: _Optional[_Union[AnswerMode, str]] = ..., history: _Optional[_Iterable[_Union[_narrator_pb2.ChatTurn, _Mapping]]] = ..., hyde_mode: _Optional[_Union[_planner_pb2.HydeMode, str]] = ..., rerank: _Optional[bool] = ..., strategy: _Optional[_Union[_planner_pb2.Strategy, str]] = ..., include_facts: _Optional[bool] = ..., filter: _Optional[_Union[_common_pb2.MetadataFilter, _Mapping]] = ...) -> None: ...

class AnswerCitation(_message.Message):
    __slots__ = ("number", "doc_id", "chunk_id", "title", "snippet", "location", "source_uri", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_URI_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    number: int
    doc_id: str
    chunk_id: str
    title: str
    snippet: str
    location: _common_pb2.ChunkLocation
    source_uri: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, number: _Optional[int] = ..., doc_id: _Optional[str] = ..., chunk_id: _Optional[str] = ..., title: _Optional[str] = ..., snippet: _Optional[str] = ..., location: _Optional[_Union[_common_pb2.ChunkLocation, _Mapping]] = ..., source_uri: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ExploredSource(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "title", "preview", "rerank_score", "cited")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    RERANK_SCORE_FIELD_NUMBER: _ClassVar[int]
    CITED_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    title: str
    preview: str
    rerank_score: float
    cited: bool
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., title: _Optional[str] = ..., preview: _Optional[str] = ..., rerank_score: _Optional[float] = ..., cited: _Optional[bool] = ...) -> None: ...

class AskResponse(_message.Message):
    __slots__ = ("answer", "answered", "citations", "sentences", "contradictions", "sources", "degradations", "timings", "plan", "mode", "facts", "searched_query", "unknown_terms", "novel_terms")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    CITATIONS_FIELD_NUMBER: _ClassVar[int]
    SENTENCES_FIELD_NUMBER: _ClassVar[int]
    CONTRADICTIONS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    DEGRADATIONS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    SEARCHED_QUERY_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_TERMS_FIELD_NUMBER: _ClassVar[int]
    NOVEL_TERMS_FIELD_NUMBER: _ClassVar[int]
    answer: str
    answered: bool
    citations: _containers.RepeatedCompositeFieldContainer[AnswerCitation]
    sentences: _containers.RepeatedCompositeFieldContainer[_narrator_pb2.Sentence]
    contradictions: _containers.RepeatedCompositeFieldContainer[_narrator_pb2.Contradiction]
    sources: _containers.RepeatedCompositeFieldContainer[ExploredSource]
    degradations: _containers.RepeatedCompositeFieldContainer[Degradation]
    timings: _containers.RepeatedCompositeFieldContainer[StageTiming]
    plan: _planner_pb2.Plan
    mode: AnswerMode
    facts: _containers.RepeatedCompositeFieldContainer[_extractor_pb2.Fact]
    searched_query: str
    unknown_terms: _containers.RepeatedScalarFieldContainer[str]
    novel_terms: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, answer: _Optional[str] = ..., answered: _Optional[bool] = ..., citations: _Optional[_Iterable[_Union[AnswerCitation, _Mapping]]] = ..., sentences: _Optional[_Iterable[_Union[_narrator_pb2.Sentence, _Mapping]]] = ..., contradictions: _Optional[_Iterable[_Union[_narrator_pb2.Contradiction, _Mapping]]] = ..., sources: _Optional[_Iterable[_Union[ExploredSource, _Mapping]]] = ..., degradations: _Optional[_Iterable[_Union[Degradation, _Mapping]]] = ..., timings: _Optional[_Iterable[_Union[StageTiming, _Mapping]]] = ..., plan: _Optional[_Union[_planner_pb2.Plan, _Mapping]] = ..., mode: _Optional[_Union[AnswerMode, str]] = ..., facts: _Optional[_Iterable[_Union[_extractor_pb2.Fact, _Mapping]]] = ..., searched_query: _Optional[str] = ..., unknown_terms: _Optional[_Iterable[str]] = ..., novel_terms: _Optional[_Iterable[str]] = ...) -> None: ...

class AskProgress(_message.Message):
    __slots__ = ("stage", "ms", "count")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    stage: str
    ms: float
    count: int
    def __init__(self, stage: _Optional[str] = ..., ms: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class AskStreamRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: AskRequest
    def __init__(self, request: _Optional[_Union[AskRequest, _Mapping]] = ...) -> None: ...

class AskStreamResponse(_message.Message):
    __slots__ = ("progress", "delta", "answer")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    progress: AskProgress
    delta: str
    answer: AskResponse
    def __init__(self, progress: _Optional[_Union[AskProgress, _Mapping]] = ..., delta: _Optional[str] = ..., answer: _Optional[_Union[AskResponse, _Mapping]] = ...) -> None: ...
