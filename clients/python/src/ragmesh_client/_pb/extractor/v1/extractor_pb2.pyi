from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExtractionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXTRACTION_MODE_UNSPECIFIED: _ClassVar[ExtractionMode]
    EXTRACTION_MODE_LLM: _ClassVar[ExtractionMode]
    EXTRACTION_MODE_EXTRACTIVE: _ClassVar[ExtractionMode]

class FactOrigin(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FACT_ORIGIN_UNSPECIFIED: _ClassVar[FactOrigin]
    FACT_ORIGIN_LLM: _ClassVar[FactOrigin]
    FACT_ORIGIN_EXTRACTIVE: _ClassVar[FactOrigin]
    FACT_ORIGIN_SNIPPET: _ClassVar[FactOrigin]
    FACT_ORIGIN_SUMMARY: _ClassVar[FactOrigin]
EXTRACTION_MODE_UNSPECIFIED: ExtractionMode
EXTRACTION_MODE_LLM: ExtractionMode
EXTRACTION_MODE_EXTRACTIVE: ExtractionMode
FACT_ORIGIN_UNSPECIFIED: FactOrigin
FACT_ORIGIN_LLM: FactOrigin
FACT_ORIGIN_EXTRACTIVE: FactOrigin
FACT_ORIGIN_SNIPPET: FactOrigin
FACT_ORIGIN_SUMMARY: FactOrigin

class Passage(_message.Message):
    __slots__ = ("id", "doc_id", "title", "text", "score")
    ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    id: str
    doc_id: str
    title: str
    text: str
    score: float
    def __init__(self, id: _Optional[str] = ..., doc_id: _Optional[str] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class ExtractRequest(_message.Message):
    __slots__ = ("query", "passages", "mode", "max_facts", "batch_size", "context_budget_tokens")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_FACTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    query: str
    passages: _containers.RepeatedCompositeFieldContainer[Passage]
    mode: ExtractionMode
    max_facts: int
    batch_size: int
    context_budget_tokens: int
    def __init__(self, query: _Optional[str] = ..., passages: _Optional[_Iterable[_Union[Passage, _Mapping]]] = ..., mode: _Optional[_Union[ExtractionMode, str]] = ..., max_facts: _Optional[int] = ..., batch_size: _Optional[int] = ..., context_budget_tokens: _Optional[int] = ...) -> None: ...

class Fact(_message.Message):
    __slots__ = ("text", "passage_id", "doc_id", "origin", "score")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PASSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    text: str
    passage_id: str
    doc_id: str
    origin: FactOrigin
    score: float
    def __init__(self, text: _Optional[str] = ..., passage_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., origin: _Optional[_Union[FactOrigin, str]] = ..., score: _Optional[float] = ...) -> None: ...

class ExtractIssue(_message.Message):
    __slots__ = ("batch", "kind", "message")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    batch: int
    kind: str
    message: str
    def __init__(self, batch: _Optional[int] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ExtractResponse(_message.Message):
    __slots__ = ("facts", "mode", "degraded_reason", "issues", "llm_calls", "gated_out", "summary_rounds")
    FACTS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_REASON_FIELD_NUMBER: _ClassVar[int]
    ISSUES_FIELD_NUMBER: _ClassVar[int]
    LLM_CALLS_FIELD_NUMBER: _ClassVar[int]
    GATED_OUT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    facts: _containers.RepeatedCompositeFieldContainer[Fact]
    mode: ExtractionMode
    degraded_reason: str
    issues: _containers.RepeatedCompositeFieldContainer[ExtractIssue]
    llm_calls: int
    gated_out: int
    summary_rounds: int
    def __init__(self, facts: _Optional[_Iterable[_Union[Fact, _Mapping]]] = ..., mode: _Optional[_Union[ExtractionMode, str]] = ..., degraded_reason: _Optional[str] = ..., issues: _Optional[_Iterable[_Union[ExtractIssue, _Mapping]]] = ..., llm_calls: _Optional[int] = ..., gated_out: _Optional[int] = ..., summary_rounds: _Optional[int] = ...) -> None: ...
