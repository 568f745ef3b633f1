from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FilterOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILTER_OP_UNSPECIFIED: _ClassVar[FilterOp]
    FILTER_OP_EQ: _ClassVar[FilterOp]
    FILTER_OP_NE: _ClassVar[FilterOp]
    FILTER_OP_IN: _ClassVar[FilterOp]
    FILTER_OP_EXISTS: _ClassVar[FilterOp]
FILTER_OP_UNSPECIFIED: FilterOp
FILTER_OP_EQ: FilterOp
FILTER_OP_NE: FilterOp
FILTER_OP_IN: FilterOp
FILTER_OP_EXISTS: FilterOp

class Vector(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class ChunkLocation(_message.Message):
    __slots__ = ("heading_path", "ordinal", "char_start", "char_end")
    HEADING_PATH_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    CHAR_START_FIELD_NUMBER: _ClassVar[int]
    CHAR_END_FIELD_NUMBER: _ClassVar[int]
    heading_path: _containers.RepeatedScalarFieldContainer[str]
    ordinal: int
    char_start: int
    char_end: int
    def __init__(self, heading_path: _Optional[_Iterable[str]] = ..., ordinal: _Optional[int] = ..., char_start: _Optional[int] = ..., char_end: _Optional[int] = ...) -> None: ...

class DocumentSource(_message.Message):
    __slots__ = ("title", "source_uri", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_URI_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    title: str
    source_uri: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, title: _Optional[str] = ..., source_uri: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class MetadataClause(_message.Message):
    __slots__ = ("key", "op", "values")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    key: str
    op: FilterOp
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., op: _Optional[_Union[FilterOp, str]] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class MetadataFilter(_message.Message):
    __slots__ = ("clauses",)
    CLAUSES_FIELD_NUMBER: _ClassVar[int]
    clauses: _containers.RepeatedCompositeFieldContainer[MetadataClause]
    def __init__(self, clauses: _Optional[_Iterable[_Union[MetadataClause, _Mapping]]] = ...) -> None: ...
