from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NarrationMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NARRATION_MODE_UNSPECIFIED: _ClassVar[NarrationMode]
    NARRATION_MODE_LLM: _ClassVar[NarrationMode]
    NARRATION_MODE_EXTRACTIVE: _ClassVar[NarrationMode]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]

class SupportCheck(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUPPORT_CHECK_UNSPECIFIED: _ClassVar[SupportCheck]
    SUPPORT_CHECK_LEXICAL: _ClassVar[SupportCheck]
    SUPPORT_CHECK_QUOTED: _ClassVar[SupportCheck]
    SUPPORT_CHECK_CROSS_ENCODER: _ClassVar[SupportCheck]
NARRATION_MODE_UNSPECIFIED: NarrationMode
NARRATION_MODE_LLM: NarrationMode
NARRATION_MODE_EXTRACTIVE: NarrationMode
ROLE_UNSPECIFIED: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
SUPPORT_CHECK_UNSPECIFIED: SupportCheck
SUPPORT_CHECK_LEXICAL: SupportCheck
SUPPORT_CHECK_QUOTED: SupportCheck
SUPPORT_CHECK_CROSS_ENCODER: SupportCheck

class Source(_message.Message):
    __slots__ = ("id", "doc_id", "title", "snippet")
    ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    id: str
    doc_id: str
    title: str
    snippet: str
    def __init__(self, id: _Optional[str] = ..., doc_id: _Optional[str] = ..., title: _Optional[str] = ..., snippet: _Optional[str] = ...) -> None: ...

class Fact(_message.Message):
    __slots__ = ("text", "source", "score")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    text: str
    source: int
    score: float
    def __init__(self, text: _Optional[str] = ..., source: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class ChatTurn(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: Role
    content: str
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ...) -> None: ...

class NarrateRequest(_message.Message):
    __slots__ = ("query", "sources", "facts", "history", "mode", "max_tokens")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    query: str
    sources: _containers.RepeatedCompositeFieldContainer[Source]
    facts: _containers.RepeatedCompositeFieldContainer[Fact]
    history: _containers.RepeatedCompositeFieldContainer[ChatTurn]
    mode: NarrationMode
    max_tokens: int
    def __init__(self, query: _Optional[str] = ..., sources: _Optional[_Iterable[_Union[Source, _Mapping]]] = ..., facts: _Optional[_Iterable[_Union[Fact, _Mapping]]] = ..., history: _Optional[_Iterable[_Union[ChatTurn, _Mapping]]] = ..., mode: _Optional[_Union[NarrationMode, str]] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class Sentence(_message.Message):
    __slots__ = ("text", "sources", "support_score", "support_check")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_SCORE_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_CHECK_FIELD_NUMBER: _ClassVar[int]
    text: str
    sources: _containers.RepeatedScalarFieldContainer[int]
    support_score: float
    support_check: SupportCheck
    def __init__(self, text: _Optional[str] = ..., sources: _Optional[_Iterable[int]] = ..., support_score: _Optional[float] = ..., support_check: _Optional[_Union[SupportCheck, str]] = ...) -> None: ...

class Citation(_message.Message):
    __slots__ = ("number", "source_id", "doc_id", "title", "snippet")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    number: int
    source_id: str
    doc_id: str
    title: str
    snippet: str
    def __init__(self, number: _Optional[int] = ..., source_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., title: _Optional[str] = ..., snippet: _Optional[str] = ...) -> None: ...

class Contradiction(_message.Message):
    __slots__ = ("description", "sources")
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    description: str
    sources: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, description: _Optional[str] = ..., sources: _Optional[_Iterable[int]] = ...) -> None: ...

class Rejected(_message.Message):
    __slots__ = ("text", "reason")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    text: str
    reason: str
    def __init__(self, text: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("text", "sentences", "citations", "contradictions", "answered", "mode", "degraded_reason", "rejected")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SENTENCES_FIELD_NUMBER: _ClassVar[int]
    CITATIONS_FIELD_NUMBER: _ClassVar[int]
    CONTRADICTIONS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_REASON_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    text: str
    sentences: _containers.RepeatedCompositeFieldContainer[Sentence]
    citations: _containers.RepeatedCompositeFieldContainer[Citation]
    contradictions: _containers.RepeatedCompositeFieldContainer[Contradiction]
    answered: bool
    mode: NarrationMode
    degraded_reason: str
    rejected: _containers.RepeatedCompositeFieldContainer[Rejected]
    def __init__(self, text: _Optional[str] = ..., sentences: _Optional[_Iterable[_Union[Sentence, _Mapping]]] = ..., citations: _Optional[_Iterable[_Union[Citation, _Mapping]]] = ..., contradictions: _Optional[_Iterable[_Union[Contradiction, _Mapping]]] = ..., answered: _Optional[bool] = ..., mode: _Optional[_Union[NarrationMode, str]] = ..., degraded_reason: _Optional[str] = ..., rejected: _Optional[_Iterable[_Union[Rejected, _Mapping]]] = ...) -> None: ...

class NarrateResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: Answer
    def __init__(self, answer: _Optional[_Union[Answer, _Mapping]] = ...) -> None: ...

class NarrateStreamRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: NarrateRequest
    def __init__(self, request: _Optional[_Union[NarrateRequest, _Mapping]] = ...) -> None: ...

class NarrateStreamResponse(_message.Message):
    __slots__ = ("delta", "answer")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    delta: str
    answer: Answer
    def __init__(self, delta: _Optional[str] = ..., answer: _Optional[_Union[Answer, _Mapping]] = ...) -> None: ...
