from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Strategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STRATEGY_UNSPECIFIED: _ClassVar[Strategy]
    STRATEGY_PRECISE: _ClassVar[Strategy]
    STRATEGY_EXHAUSTIVE: _ClassVar[Strategy]

class HydeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HYDE_MODE_UNSPECIFIED: _ClassVar[HydeMode]
    HYDE_MODE_OFF: _ClassVar[HydeMode]
    HYDE_MODE_FUSION: _ClassVar[HydeMode]
    HYDE_MODE_SUPPLEMENT: _ClassVar[HydeMode]

class TurnRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TURN_ROLE_UNSPECIFIED: _ClassVar[TurnRole]
    TURN_ROLE_USER: _ClassVar[TurnRole]
    TURN_ROLE_ASSISTANT: _ClassVar[TurnRole]
STRATEGY_UNSPECIFIED: Strategy
STRATEGY_PRECISE: Strategy
STRATEGY_EXHAUSTIVE: Strategy
HYDE_MODE_UNSPECIFIED: HydeMode
HYDE_MODE_OFF: HydeMode
HYDE_MODE_FUSION: HydeMode
HYDE_MODE_SUPPLEMENT: HydeMode
TURN_ROLE_UNSPECIFIED: TurnRole
TURN_ROLE_USER: TurnRole
TURN_ROLE_ASSISTANT: TurnRole

class PlanRequest(_message.Message):
    __slots__ = ("query", "strategy", "max_variations", "hyde_mode", "history")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    MAX_VARIATIONS_FIELD_NUMBER: _ClassVar[int]
    HYDE_MODE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    query: str
    strategy: Strategy
    max_variations: int
    hyde_mode: HydeMode
    history: _containers.RepeatedCompositeFieldContainer[Turn]
    def __init__(self, query: _Optional[str] = ..., strategy: _Optional[_Union[Strategy, str]] = ..., max_variations: _Optional[int] = ..., hyde_mode: _Optional[_Union[HydeMode, str]] = ..., history: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: TurnRole
    content: str
    def __init__(self, role: _Optional[_Union[TurnRole, str]] = ..., content: _Optional[str] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("strategy", "pool_size", "variations", "hard_keywords", "hyde_passage", "hyde_mode", "planner", "searched_query")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    VARIATIONS_FIELD_NUMBER: _ClassVar[int]
    HARD_KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    HYDE_PASSAGE_FIELD_NUMBER: _ClassVar[int]
    HYDE_MODE_FIELD_NUMBER: _ClassVar[int]
    PLANNER_FIELD_NUMBER: _ClassVar[int]
    SEARCHED_QUERY_FIELD_NUMBER: _ClassVar[int]
    strategy: Strategy
    pool_size: int
    variations: _containers.RepeatedScalarFieldContainer[str]
    hard_keywords: _containers.RepeatedScalarFieldContainer[str]
    hyde_passage: str
    hyde_mode: HydeMode
    planner: str
    searched_query: str
    def __init__(self, strategy: _Optional[_Union[Strategy, str]] = ..., pool_size: _Optional[int] = ..., variations: _Optional[_Iterable[str]] = ..., hard_keywords: _Optional[_Iterable[str]] = ..., hyde_passage: _Optional[str] = ..., hyde_mode: _Optional[_Union[HydeMode, str]] = ..., planner: _Optional[str] = ..., searched_query: _Optional[str] = ...) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("plan", "fallback_reason", "fallback_message")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    plan: Plan
    fallback_reason: str
    fallback_message: str
    def __init__(self, plan: _Optional[_Union[Plan, _Mapping]] = ..., fallback_reason: _Optional[str] = ..., fallback_message: _Optional[str] = ...) -> None: ...

class HydeRequest(_message.Message):
    __slots__ = ("query",)
    QUERY_FIELD_NUMBER: _ClassVar[int]
    query: str
    def __init__(self, query: _Optional[str] = ...) -> None: ...

class HydeResponse(_message.Message):
    __slots__ = ("passage",)
    PASSAGE_FIELD_NUMBER: _ClassVar[int]
    passage: str
    def __init__(self, passage: _Optional[str] = ...) -> None: ...
