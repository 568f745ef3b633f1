from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Head(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEAD_UNSPECIFIED: _ClassVar[Head]
    HEAD_SINGLE_LOGIT: _ClassVar[Head]
    HEAD_TWO_CLASS: _ClassVar[Head]
HEAD_UNSPECIFIED: Head
HEAD_SINGLE_LOGIT: Head
HEAD_TWO_CLASS: Head

class Passage(_message.Message):
    __slots__ = ("id", "text")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    id: str
    text: str
    def __init__(self, id: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("query", "passages", "top_n", "min_score", "fallback_count", "uncached")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    MIN_SCORE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_COUNT_FIELD_NUMBER: _ClassVar[int]
    UNCACHED_FIELD_NUMBER: _ClassVar[int]
    query: str
    passages: _containers.RepeatedCompositeFieldContainer[Passage]
    top_n: int
    min_score: float
    fallback_count: int
    uncached: bool
    def __init__(self, query: _Optional[str] = ..., passages: _Optional[_Iterable[_Union[Passage, _Mapping]]] = ..., top_n: _Optional[int] = ..., min_score: _Optional[float] = ..., fallback_count: _Optional[int] = ..., uncached: _Optional[bool] = ...) -> None: ...

class RerankedPassage(_message.Message):
    __slots__ = ("id", "score", "input_index", "truncated")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    INPUT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    id: str
    score: float
    input_index: int
    truncated: bool
    def __init__(self, id: _Optional[str] = ..., score: _Optional[float] = ..., input_index: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("results", "fallback", "scored", "model")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    SCORED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RerankedPassage]
    fallback: bool
    scored: int
    model: str
    def __init__(self, results: _Optional[_Iterable[_Union[RerankedPassage, _Mapping]]] = ..., fallback: _Optional[bool] = ..., scored: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model", "head", "max_tokens", "max_batch", "provider", "model_sha256", "default_min_score", "default_fallback_count", "max_passages")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MIN_SCORE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FALLBACK_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_PASSAGES_FIELD_NUMBER: _ClassVar[int]
    model: str
    head: Head
    max_tokens: int
    max_batch: int
    provider: str
    model_sha256: str
    default_min_score: float
    default_fallback_count: int
    max_passages: int
    def __init__(self, model: _Optional[str] = ..., head: _Optional[_Union[Head, str]] = ..., max_tokens: _Optional[int] = ..., max_batch: _Optional[int] = ..., provider: _Optional[str] = ..., model_sha256: _Optional[str] = ..., default_min_score: _Optional[float] = ..., default_fallback_count: _Optional[int] = ..., max_passages: _Optional[int] = ...) -> None: ...
