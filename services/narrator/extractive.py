"""The extractive answer: the best facts themselves, each a sentence citing its source. Needs no
model and always cites validly, so it is the answer whenever the LLM's is unusable."""

from __future__ import annotations

from collections.abc import Sequence

from meshkit.text.answering import NO_EVIDENCE_REASON
from meshkit.text.extractive import best_facts
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
