"""What a planner takes and gives, free of protobuf so planners are plain, testable Python.

The servicer validates requests and maps these to and from the wire. Every planner
(deterministic, LLM) implements ``Planner``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class Strategy(enum.Enum):
    PRECISE = "precise"
    EXHAUSTIVE = "exhaustive"


class HydeMode(enum.Enum):
    OFF = "off"
    FUSION = "fusion"
    SUPPLEMENT = "supplement"


@dataclass(frozen=True)
class Turn:
    """An earlier turn of the conversation."""

    user: bool  # False: the assistant's
    content: str


@dataclass(frozen=True)
class PlanInput:
    """A validated request."""

    query: str  # non-blank, within the length limit
    strategy: Strategy | None  # None: the planner decides
    max_variations: int  # >= 1, the caller's wish or the server default
    # The servicer passes the mode resolved against the server default and the LLM's presence
    # (see ``hyde.py``); None reads as off.
    hyde_mode: HydeMode | None
    # Earlier turns, oldest first, within the servicer's limits.
    history: tuple[Turn, ...] = ()


@dataclass(frozen=True)
class Fallback:
    """Why the LLM planner's plan was replaced by the deterministic one."""

    reason: str  # an LLMError reason: unavailable, deadline, breaker_open, error, invalid_output
    message: str


@dataclass(frozen=True)
class RetrievalPlan:
    strategy: Strategy
    pool_size: int
    # The searched query first: the request's query, or a follow-up's standalone rewrite.
    variations: tuple[str, ...]
    hard_keywords: tuple[str, ...]
    hyde_passage: str
    hyde_mode: HydeMode  # what the plan actually does, not what was asked
    planner: str
    fallback: Fallback | None = None  # set when an LLM plan was wanted but could not be had

    @property
    def searched_query(self) -> str:
        return self.variations[0]


class Planner(Protocol):
    # Reported in Plan.planner: "deterministic" or "llm".
    name: str

    async def plan(self, request: PlanInput) -> RetrievalPlan: ...
