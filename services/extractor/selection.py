"""Pure rules over facts: order, dedup per source, the relevance gate's keep-rules, the cap
and the context budget's last resort (drop the lowest-scored)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from meshkit.text.answering import estimate_tokens, strip_citations
from services.extractor.facts import EXTRACTIVE, Fact

# Token sets this similar are one fact said twice (stopwords count: "is not" differs from "is").
NEAR_DUPLICATE_JACCARD = 0.9
# The seeds' gate rule: one pass among more than GATE_FEW facts is too strict a verdict to
# trust, so the GATE_FLOOR best facts are kept instead.
GATE_FEW = 3
GATE_FLOOR = 4
CHARS_PER_TOKEN = 4  # meshkit.text.answering.estimate_tokens' ratio


def ordered(facts: Sequence[Fact]) -> list[Fact]:
    """Best first: by score, then passage order (stable within a passage)."""
    return sorted(facts, key=lambda f: (-f.score, f.source.index))


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", strip_citations(text).lower())


def _near_duplicate(a: set[str], b: set[str]) -> bool:
    return bool(a and b) and len(a & b) / len(a | b) >= NEAR_DUPLICATE_JACCARD


def dedup(facts: Sequence[Fact], per_source: int, sentences_per_passage: int) -> list[Fact]:
    """Best first, identical or near-identical facts merged into the best-scored one, and at
    most ``per_source`` facts per document.

    Extractive facts are single sentences that stand for a passage together (the best
    ``sentences_per_passage`` of it), so a document may keep ``per_source`` passages' worth of
    them: per_source * sentences_per_passage. Counting them one by one against per_source
    (default 1) would cut each passage's evidence to its first sentence."""
    kept: list[Fact] = []
    seen_text: set[str] = set()
    seen_tokens: list[set[str]] = []
    per_doc: Counter[tuple[str, bool]] = Counter()
    for fact in ordered(facts):
        tokens = _tokens(fact.text)
        normal = " ".join(tokens)
        token_set = set(tokens)
        if normal in seen_text or any(_near_duplicate(token_set, other) for other in seen_tokens):
            continue
        extractive = fact.origin == EXTRACTIVE
        limit = per_source * sentences_per_passage if extractive else per_source
        key = (fact.source.source_key, extractive)
        if per_doc[key] >= limit:
            continue
        per_doc[key] += 1
        seen_text.add(normal)
        seen_tokens.append(token_set)
        kept.append(fact)
    return kept


def gate_keep(facts: Sequence[Fact], passed: set[int]) -> list[Fact]:
    """The seeds' keep-rules over the gate's verdict (indexes into ``facts``, best first): all
    when none passed (the gate, not the evidence, failed); when a single fact passed out of
    more than GATE_FEW, it and the best others up to GATE_FLOOR; otherwise those that passed."""
    if not passed:
        return list(facts)
    if len(passed) == 1 and len(facts) > GATE_FEW:
        (only,) = passed
        others = [i for i in range(len(facts)) if i != only][: GATE_FLOOR - 1]
        keep = {only, *others}
        return [f for i, f in enumerate(facts) if i in keep]
    return [f for i, f in enumerate(facts) if i in passed]


def total_tokens(facts: Sequence[Fact]) -> int:
    return sum(estimate_tokens(f.text) for f in facts)


def drop_to_fit(facts: Sequence[Fact], budget_tokens: int) -> list[Fact]:
    """Best first, the lowest-scored dropped until the rest fits ``budget_tokens``; the best
    fact always stays, cut to the budget when it alone is over it."""
    kept = ordered(facts)
    while len(kept) > 1 and total_tokens(kept) > budget_tokens:
        kept.pop()
    if kept and total_tokens(kept) > budget_tokens:
        best = kept[0]
        kept[0] = replace(best, text=best.text[: budget_tokens * CHARS_PER_TOKEN].rstrip())
    return kept
