from ragmesh.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TextKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TEXT_KIND_UNSPECIFIED: _ClassVar[TextKind]
    TEXT_KIND_QUERY: _ClassVar[TextKind]
    TEXT_KIND_PASSAGE: _ClassVar[TextKind]
TEXT_KIND_UNSPECIFIED: TextKind
TEXT_KIND_QUERY: TextKind
TEXT_KIND_PASSAGE: TextKind

class EmbedRequest(_message.Message):
    __slots__ = ("texts", "kind")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    kind: TextKind
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., kind: _Optional[_Union[TextKind, str]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("vectors", "model", "truncated", "model_sha256")
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    vectors: _containers.RepeatedCompositeFieldContainer[_common_pb2.Vector]
    model: str
    truncated: int
    model_sha256: str
    def __init__(self, vectors: _Optional[_Iterable[_Union[_common_pb2.Vector, _Mapping]]] = ..., model: _Optional[str] = ..., truncated: _Optional[int] = ..., model_sha256: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model", "dimension", "max_tokens", "query_prefix", "passage_prefix", "provider", "max_batch", "model_sha256")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUERY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    PASSAGE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    model: str
    dimension: int
    max_tokens: int
    query_prefix: str
    passage_prefix: str
    provider: str
    max_batch: int
    model_sha256: str
    def __init__(self, model: _Optional[str] = ..., dimension: _Optional[int] = ..., max_tokens: _Optional[int] = ..., query_prefix: _Optional[str] = ..., passage_prefix: _Optional[str] = ..., provider: _Optional[str] = ..., max_batch: _Optional[int] = ..., model_sha256: _Optional[str] = ...) -> None: ...
