"""The extractor's working types, independent of the wire format (servicer.py converts)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ragmesh.extractor.v1 import extractor_pb2

Mode = Literal["llm", "extractive"]

# Fact origins, as the contract numbers them.
LLM = extractor_pb2.FACT_ORIGIN_LLM
EXTRACTIVE = extractor_pb2.FACT_ORIGIN_EXTRACTIVE
SNIPPET = extractor_pb2.FACT_ORIGIN_SNIPPET
SUMMARY = extractor_pb2.FACT_ORIGIN_SUMMARY

ORIGIN_NAMES = {LLM: "llm", EXTRACTIVE: "extractive", SNIPPET: "snippet", SUMMARY: "summary"}

# Issue kinds (ExtractIssue.kind).
MALFORMED_ENTRY = "malformed_entry"
UNKNOWN_PASSAGE = "unknown_passage"
# A fact its passage does not hold, moved to the batch passage that does, or dropped.
REATTRIBUTED = "reattributed"
UNGROUNDED = "ungrounded"
# A "fact" that only restates a passage's title (small models copy the first line they see).
TITLE_ONLY = "title_only"
BATCH_FAILED = "batch_failed"
GATE_FAILED = "gate_failed"
SUMMARY_FAILED = "summary_failed"
EMBEDDER_UNAVAILABLE = "embedder_unavailable"
NO_FACTS = "no_facts"


@dataclass(frozen=True)
class Source:
    """One passage of the request; ``index`` is its position (0 = best) and ``score`` is never
    missing (see resolve_scores)."""

    index: int
    id: str
    doc_id: str
    title: str
    text: str
    score: float

    @property
    def source_key(self) -> str:
        # A passage without a document is its own source.
        return self.doc_id or f"passage:{self.id}"


@dataclass(frozen=True)
class Fact:
    text: str
    source: Source
    origin: extractor_pb2.FactOrigin
    score: float


@dataclass(frozen=True)
class Issue:
    batch: int
    kind: str
    message: str


@dataclass(frozen=True)
class Job:
    """A validated request with every default resolved."""

    query: str
    sources: Sequence[Source]
    mode: Mode
    max_facts: int
    batch_size: int
    budget_tokens: int


@dataclass
class Outcome:
    facts: list[Fact]
    mode: Mode
    degraded_reason: str = ""
    issues: list[Issue] = field(default_factory=list)
    llm_calls: int = 0
    gated_out: int = 0
    summary_rounds: int = 0


def resolve_scores(scores: Sequence[float | None]) -> list[float]:
    """Every passage's score. Passages come best first, so a missing score is derived from the
    rank: 1 - i/n when no passage has one, and below every given score otherwise (an unscored
    passage has not earned a place above a scored one), still falling with the rank."""
    n = len(scores)
    given = [s for s in scores if s is not None and math.isfinite(s)]
    floor = min(given) - 1.0 if given else 1.0
    return [s if s is not None and math.isfinite(s) else floor - i / n for i, s in enumerate(scores)]
