"""The narrator's own types, free of protobuf: what a request carries and what an answer holds.

Source numbers are 1-based positions in the request's sources, the numbers the answer cites."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from meshkit.text.answering import not_found_text

MODEL_NOT_FOUND_REASON = "the retrieved passages do not answer this question"


class SupportCheck(StrEnum):
    """The strongest check a sentence passed (narrator.v1.SupportCheck)."""

    LEXICAL = "lexical"
    QUOTED = "quoted"


class Mode(StrEnum):
    LLM = "llm"
    EXTRACTIVE = "extractive"


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"


class RejectReason(StrEnum):
    UNCITED = "uncited"
    UNKNOWN_SOURCE = "unknown_source"
    UNSUPPORTED = "unsupported"
    # The same sentence again (small models loop).
    REPEATED = "repeated"
    # A phrase looping in it or across sentences, or the sentence a looping reply was cut in
    # (degenerate generation, see degenerate.py).
    DEGENERATE = "degenerate"


@dataclass(frozen=True)
class Source:
    id: str
    doc_id: str
    title: str
    snippet: str


@dataclass(frozen=True)
class Fact:
    text: str
    # 1-based position of its source in the request.
    source: int
    score: float


@dataclass(frozen=True)
class Turn:
    role: Role
    content: str


@dataclass(frozen=True)
class NarrationInput:
    query: str
    sources: list[Source]
    # Best first, as the caller ranked them.
    facts: list[Fact]
    # Oldest first.
    history: list[Turn]
    mode: Mode
    max_tokens: int


@dataclass(frozen=True)
class Sentence:
    text: str
    sources: tuple[int, ...]
    check: SupportCheck = SupportCheck.LEXICAL
    # LEXICAL: share of the sentence's content words its cited facts hold; None for QUOTED.
    support: float | None = None


@dataclass(frozen=True)
class Rejection:
    text: str
    reason: RejectReason


@dataclass(frozen=True)
class Contradiction:
    description: str
    sources: tuple[int, ...]


@dataclass(frozen=True)
class Answer:
    text: str
    sentences: list[Sentence]
    mode: Mode
    answered: bool
    contradictions: list[Contradiction] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    # "<reason>: <message>" when the LLM's answer was not used; empty otherwise.
    degraded_reason: str = ""

    @property
    def cited(self) -> list[int]:
        """The source numbers the answer cites, ascending."""
        return sorted({n for sentence in self.sentences for n in sentence.sources})


def not_found_answer(reason: str, mode: Mode, rejected: list[Rejection] | None = None) -> Answer:
    return Answer(
        text=not_found_text(reason), sentences=[], mode=mode, answered=False, rejected=rejected or []
    )
