"""The answer prompt: instructions, the facts under their numbered sources, recent chat
history and the question. Kept short: the local model has about 2000 tokens per request."""

from __future__ import annotations

from collections.abc import Sequence

from meshkit.llm.factory import Messages
from meshkit.text.answering import strip_citations
from services.narrator.model import Fact, Role, Source, Turn
from services.narrator.verify import NOT_FOUND_MARKER

INSTRUCTIONS = (
    "You answer questions using only the facts in the numbered sources you are given. "
    "End every sentence with the number of the source it comes from, like [1] or [1, 3]. "
    "Cite only those numbers, and add nothing the facts do not say. "
    f"If the facts do not answer the question, reply exactly {NOT_FOUND_MARKER} and nothing else."
)
# One worked exchange before the real one: small models copy a shown format far more reliably
# than they follow a described one (SmolLM2-135M answered "No" to the instructions alone, and a
# cited sentence after this example).
EXAMPLE_USER = (
    "Sources:\n[1] Tea trial: Green tea lowered systolic blood pressure in adults\n"
    "[2] Coffee review: Coffee raised blood pressure for a few hours\n\n"
    "Question: Does green tea lower blood pressure?"
)
EXAMPLE_ANSWER = "Yes. Green tea lowered systolic blood pressure in adults [1]."
# A history turn cut to fit is worth showing only if this much of it fits.
MIN_TURN_CHARS = 80
ELLIPSIS = "\u2026"
_SPEAKERS = {Role.USER: "User", Role.ASSISTANT: "Assistant"}


def prompt_facts(facts: Sequence[Fact], budget_chars: int) -> list[Fact]:
    """The best facts (by score; the caller's order breaks ties) whose texts fit ``budget_chars``,
    in the caller's order. The best one is cut to fit when even it alone does not."""
    ranked = sorted(range(len(facts)), key=lambda i: -facts[i].score)
    chosen: dict[int, Fact] = {}
    used = 0
    for i in ranked:
        fact = facts[i]
        if used + len(fact.text) <= budget_chars:
            chosen[i] = fact
            used += len(fact.text)
        elif not chosen:
            chosen[i] = Fact(fact.text[:budget_chars].rstrip() + ELLIPSIS, fact.source, fact.score)
            used = budget_chars
    return [chosen[i] for i in sorted(chosen)]


def source_lines(sources: Sequence[Source], facts: Sequence[Fact]) -> list[str]:
    """ "[n] title: fact; fact" for each source with facts, by number. Markers inside the facts
    ("as shown in [12]") are taken out so the model sees no numbers but the sources'."""
    grouped: dict[int, list[str]] = {}
    for fact in facts:
        grouped.setdefault(fact.source, []).append(strip_citations(fact.text).rstrip(" ;."))
    lines = []
    for number in sorted(grouped):
        source = sources[number - 1]
        label = source.title.strip() or source.doc_id.strip()
        text = "; ".join(grouped[number])
        lines.append(f"[{number}] {label}: {text}" if label else f"[{number}] {text}")
    return lines


def recent_history(history: Sequence[Turn], budget_chars: int) -> list[Turn]:
    """The most recent turns that fit ``budget_chars`` (oldest first), citation markers out since
    they number other sources. The first turn that does not fit is cut to the room left, when
    that is enough to say something."""
    kept: list[Turn] = []
    left = budget_chars
    for turn in reversed(history):
        content = strip_citations(turn.content).strip()
        if len(content) <= left:
            kept.append(Turn(turn.role, content))
            left -= len(content)
            continue
        if left >= MIN_TURN_CHARS:
            kept.append(Turn(turn.role, content[: left - 1].rstrip() + ELLIPSIS))
        break
    return kept[::-1]


def build_messages(
    query: str,
    sources: Sequence[Source],
    facts: Sequence[Fact],
    history: Sequence[Turn],
    *,
    fact_chars: int,
    history_chars: int,
) -> Messages:
    """The chat messages of one answer call."""
    parts = ["Sources:", *source_lines(sources, prompt_facts(facts, fact_chars))]
    turns = recent_history(history, history_chars)
    if turns:
        parts += ["", "Conversation so far:", *(f"{_SPEAKERS[t.role]}: {t.content}" for t in turns)]
    parts += ["", f"Question: {query.strip()}"]
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": EXAMPLE_USER},
        {"role": "assistant", "content": EXAMPLE_ANSWER},
        {"role": "user", "content": "\n".join(parts)},
    ]
