"""The extractive answer's choice of facts: which facts an answer states when no model writes it
(the narrator's extractive mode and fallback, the gateway's answer when the narrator is down).
One rule for all of them, so an answer reads the same whoever had to write it."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol, TypeVar

from meshkit.text.answering import strip_citations


class FactLike(Protocol):
    """A fact: its text, the source it cites, its score (higher is better)."""

    @property
    def text(self) -> str: ...

    @property
    def source(self) -> Hashable: ...

    @property
    def score(self) -> float: ...


F = TypeVar("F", bound=FactLike)


def _key(text: str) -> str:
    return " ".join(strip_citations(text).lower().split())


def best_facts(facts: Sequence[F], count: int) -> list[F]:
    """Up to ``count`` facts, best score first (the caller's order breaks ties): one per source
    while distinct sources remain, then the next best; repeated texts count once. Returned as a
    text reads: each source's facts together, sources by their best fact, a source's facts in
    the caller's order (the gateway sends a passage's sentences in the passage's order)."""
    ranked = sorted(range(len(facts)), key=lambda i: -facts[i].score)
    chosen: list[int] = []
    seen_texts: set[str] = set()
    seen_sources: set[Hashable] = set()
    for distinct_only in (True, False):
        for i in ranked:
            fact = facts[i]
            key = _key(fact.text)
            if len(chosen) == count or not key or key in seen_texts:
                continue
            if distinct_only and fact.source in seen_sources:
                continue
            chosen.append(i)
            seen_texts.add(key)
            seen_sources.add(fact.source)
    rank = {i: position for position, i in enumerate(ranked)}
    source_rank: dict[Hashable, int] = {}
    for i in sorted(chosen, key=rank.__getitem__):
        source_rank.setdefault(facts[i].source, len(source_rank))
    return [facts[i] for i in sorted(chosen, key=lambda i: (source_rank[facts[i].source], i))]
