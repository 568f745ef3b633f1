"""The extractive answer: the best facts themselves, each a sentence citing its source. Needs no
model and always cites validly, so it is the answer whenever the LLM's is unusable."""

from __future__ import annotations

from collections.abc import Sequence

from meshkit.answering import NO_EVIDENCE_REASON, strip_citations
from services.narrator.model import (
    Answer,
    Fact,
    Mode,
    Rejection,
    Sentence,
    SupportCheck,
    not_found_answer,
)
from services.narrator.verify import with_citation


def best_facts(facts: Sequence[Fact], count: int) -> list[Fact]:
    """Up to ``count`` facts, best score first (the caller's order breaks ties): one per source
    while distinct sources remain, then the next best; repeated texts count once."""
    ranked = sorted(range(len(facts)), key=lambda i: -facts[i].score)
    chosen: list[int] = []
    seen_texts: set[str] = set()
    seen_sources: set[int] = set()
    for distinct_only in (True, False):
        for i in ranked:
            fact = facts[i]
            key = " ".join(strip_citations(fact.text).lower().split())
            if len(chosen) == count or not key or key in seen_texts:
                continue
            if distinct_only and fact.source in seen_sources:
                continue
            chosen.append(i)
            seen_texts.add(key)
            seen_sources.add(fact.source)
    rank = {i: position for position, i in enumerate(ranked)}
    # Read as a text: each source's facts together, sources by their best fact, and a source's
    # facts in the caller's order (the gateway sends a passage's sentences in the passage's order).
    source_rank: dict[int, int] = {}
    for i in sorted(chosen, key=rank.__getitem__):
        source_rank.setdefault(facts[i].source, len(source_rank))
    return [facts[i] for i in sorted(chosen, key=lambda i: (source_rank[facts[i].source], i))]


def extractive_answer(
    facts: Sequence[Fact],
    count: int,
    *,
    degraded_reason: str = "",
    rejected: list[Rejection] | None = None,
) -> Answer:
    """The answer stating the best facts (not found when no fact says anything)."""
    # Each sentence is a fact, whole: its cited source's facts hold all of its words.
    sentences = [
        Sentence(with_citation(f.text, [f.source]), (f.source,), SupportCheck.LEXICAL, 1.0)
        for f in best_facts(facts, count)
    ]
    if not sentences:
        return not_found_answer(NO_EVIDENCE_REASON, Mode.EXTRACTIVE, rejected)
    return Answer(
        text=" ".join(s.text for s in sentences),
        sentences=sentences,
        mode=Mode.EXTRACTIVE,
        answered=True,
        rejected=rejected or [],
        degraded_reason=degraded_reason,
    )
