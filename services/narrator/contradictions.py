"""Disagreements between the sources an answer cites, reported apart rather than averaged out:
one structured LLM call over the cited facts. Best effort: any failure means none reported."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from pydantic import BaseModel, Field

from meshkit.llm.factory import LLM, LLMError, Messages
from meshkit.llm.replies import extract_json, validate_items
from services.narrator.compose import source_lines
from services.narrator.model import Contradiction, Fact, Source

log = logging.getLogger("ragmesh.narrator")

# Bounded so greedy decoding of a small model cannot loop until max_tokens.
MAX_CONTRADICTIONS = 3
MAX_DESCRIPTION_CHARS = 200
MAX_TOKENS = 200
INSTRUCTIONS = (
    "You compare numbered sources. List the pairs of sources that state conflicting facts, "
    "with one short line describing the conflict. Reply in JSON. "
    'If no sources conflict, reply {"contradictions": []}.'
)


class ContradictionItem(BaseModel):
    source_a: int
    source_b: int
    description: str = Field(min_length=1, max_length=MAX_DESCRIPTION_CHARS)


class ContradictionReport(BaseModel):
    contradictions: list[ContradictionItem] = Field(default_factory=list, max_length=MAX_CONTRADICTIONS)


def build_messages(query: str, sources: Sequence[Source], facts: Sequence[Fact]) -> Messages:
    body = "\n".join(["Sources:", *source_lines(sources, facts), "", f"Question: {query.strip()}"])
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": body}]


def keep_valid(items: Sequence[ContradictionItem], cited: Collection[int]) -> list[Contradiction]:
    """Entries naming two different cited sources with a description, each pair once, at most
    MAX_CONTRADICTIONS."""
    found: list[Contradiction] = []
    pairs: set[tuple[int, int]] = set()
    for item in items:
        pair = (min(item.source_a, item.source_b), max(item.source_a, item.source_b))
        description = " ".join(item.description.split())
        if pair[0] == pair[1] or not set(pair) <= set(cited) or not description or pair in pairs:
            continue
        pairs.add(pair)
        found.append(Contradiction(description, pair))
    return found[:MAX_CONTRADICTIONS]


def salvage(raw: str | None) -> list[ContradictionItem]:
    """The well-formed entries of a reply that failed validation as a whole (one bad entry, or
    too many): the rest are still worth reporting."""
    try:
        value: Any = extract_json(raw or "")
    except ValueError:
        return []
    entries = value.get("contradictions") if isinstance(value, dict) else value
    if not isinstance(entries, list):
        return []
    valid, bad = validate_items(entries, ContradictionItem)
    if bad:
        log.info("ignored malformed contradiction entries", extra={"entries": bad})
    return valid


async def find_contradictions(
    llm: LLM,
    query: str,
    sources: Sequence[Source],
    facts: Sequence[Fact],
    cited: Collection[int],
    *,
    timeout: float,
) -> list[Contradiction]:
    """Contradictions among the ``cited`` sources' facts; [] when the call fails."""
    cited_facts = [f for f in facts if f.source in cited]
    messages = build_messages(query, sources, cited_facts)
    try:
        report = await llm.structured(messages, ContradictionReport, max_tokens=MAX_TOKENS, timeout=timeout)
        items = report.contradictions
    except LLMError as exc:
        if exc.reason != "invalid_output":
            log.warning("contradiction check failed", extra={"reason": exc.reason, "error": exc.message})
            return []
        items = salvage(exc.raw)
    except Exception:
        # Reporting disagreements is extra: a bug here must not cost the caller the answer.
        log.exception("contradiction check failed")
        return []
    return keep_valid(items, cited)
