from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

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
