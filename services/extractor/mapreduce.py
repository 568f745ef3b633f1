"""The LLM steps: map (facts from batches of passages), the relevance gate, and the
recursive summarisation that fits the facts into the context budget.

Every step degrades instead of failing: a malformed entry is skipped (its passage falls back
to a raw snippet), a failed batch falls back to extractive facts (the caller runs them), a
failed gate keeps every fact and a failed summary keeps the facts it was given."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from meshkit.llm.factory import LLMError
from meshkit.llm.replies import validate_items
from meshkit.settings import ExtractorSettings
from meshkit.text.answering import content_words, coverage, estimate_tokens
from services.extractor.extractive import MAX_FACT_CHARS, clip, snippet
from services.extractor.facts import (
    BATCH_FAILED,
    GATE_FAILED,
    LLM,
    MALFORMED_ENTRY,
    REATTRIBUTED,
    SNIPPET,
    SUMMARY,
    SUMMARY_FAILED,
    TITLE_ONLY,
    UNGROUNDED,
    UNKNOWN_PASSAGE,
    Fact,
    Issue,
    Source,
)
from services.extractor.llmguard import LLMGuard, LLMSkipped
from services.extractor.prompts import (
    FactEntry,
    fact_list_schema,
    gate_messages,
    map_messages,
    number_list_schema,
    summary_messages,
)
from services.extractor.selection import gate_keep, ordered, total_tokens

T = TypeVar("T")

# Entries read from one reply beyond its list bound, for servers without guided decoding:
# enough to find the valid ones among a few bad, without reporting a runaway list entry by entry.
ENTRY_SLACK = 2
# Characters of a fact shown to the gate: enough to judge relevance.
GATE_FACT_CHARS = 200
# A fact must have this share of its content words in the passage it cites: small models tag
# a fact with the wrong passage number, and provenance is the point of a fact.
MIN_GROUNDING = 0.5
GATE_GROUP_FACTS = 30
SUMMARY_GROUP_FACTS = 10
# A number costs the gate's reply a few tokens; this bounds its completion.
GATE_TOKENS_BASE, GATE_TOKENS_PER_FACT = 16, 5
MAX_ISSUE_CHARS = 500


def _issue(batch: int, kind: str, message: str) -> Issue:
    return Issue(batch, kind, clip(message, MAX_ISSUE_CHARS))


async def _bounded(limit: int, jobs: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run ``jobs`` with at most ``limit`` in flight (the LLM server's parallel slots)."""
    slots = asyncio.Semaphore(limit)

    async def run(job: Callable[[], Awaitable[T]]) -> T:
        async with slots:
            return await job()

    return list(await asyncio.gather(*(run(job) for job in jobs)))


def group_by_chars(lengths: Sequence[int], limit_chars: int, max_items: int) -> list[list[int]]:
    """Consecutive indexes grouped so that each group's lengths add up to at most
    ``limit_chars`` (a longer item goes alone) with at most ``max_items`` per group."""
    groups: list[list[int]] = []
    used = 0
    for i, length in enumerate(lengths):
        if groups and len(groups[-1]) < max_items and used + length <= limit_chars:
            groups[-1].append(i)
            used += length
        else:
            groups.append([i])
            used = length
    return groups


@dataclass
class Entries:
    """What one reply's entries say: the first valid fact per cited number, the numbers whose
    entry was malformed, and the issues met."""

    facts: dict[int, str] = field(default_factory=dict)
    malformed: set[int] = field(default_factory=set)
    issues: list[Issue] = field(default_factory=list)


def _cited_number(entry: Any) -> int | None:
    """The number a malformed entry meant to cite, when it can be read at all."""
    if not isinstance(entry, dict):
        return None
    try:
        return int(entry.get("passage"))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None


def read_entries(raw: Sequence[Any], numbers: int, batch: int) -> Entries:
    """Validate ``raw`` entry by entry; numbers run 1..numbers."""
    out = Entries()
    limit = numbers + ENTRY_SLACK
    if len(raw) > limit:
        out.issues.append(
            _issue(batch, MALFORMED_ENTRY, f"{len(raw) - limit} entries past the first {limit} ignored")
        )
        raw = raw[:limit]
    valid, rejected = validate_items(raw, FactEntry)
    for index, reason in rejected:
        out.issues.append(_issue(batch, MALFORMED_ENTRY, f"entry {index}: {reason}"))
        number = _cited_number(raw[index])
        if number is not None and 1 <= number <= numbers:
            out.malformed.add(number)
    for entry in valid:
        if not 1 <= entry.passage <= numbers:
            out.issues.append(
                _issue(
                    batch, UNKNOWN_PASSAGE, f"entry cites passage {entry.passage}; the batch has 1..{numbers}"
                )
            )
            continue
        # One fact per passage per batch: the first wins, as the prompt asked.
        out.facts.setdefault(entry.passage, clip(entry.fact, MAX_FACT_CHARS))
    return out


# --- map ---


@dataclass
class BatchResult:
    index: int
    facts: list[Fact]
    issues: list[Issue]
    used_llm: bool
    # Passages to answer extractively, and why ("" when none): the LLMError reason, or
    # "skipped" when the LLM had been given up before this batch.
    fallback: list[Source]
    fallback_reason: str = ""


async def map_batch(
    index: int, batch: Sequence[Source], query: str, guard: LLMGuard, settings: ExtractorSettings
) -> BatchResult:
    chars_each = min(
        settings.extractor_passage_chars_in_prompt, settings.extractor_prompt_chars // len(batch)
    )
    try:
        reply = await guard.structured(
            map_messages(query, batch, chars_each),
            fact_list_schema(len(batch), len(batch)),
            purpose="map",
            max_tokens=settings.extractor_max_tokens,
        )
    except LLMSkipped:
        return BatchResult(index, [], [], False, list(batch), "skipped")
    except LLMError as exc:
        return BatchResult(index, [], [_issue(index, BATCH_FAILED, str(exc))], False, list(batch), exc.reason)
    entries = read_entries(reply.facts, len(batch), index)
    grounded, issues = ground(entries.facts, batch, index)
    entries.issues.extend(issues)
    facts = [Fact(text, batch[n - 1], LLM, batch[n - 1].score) for n, text in grounded.items()]
    # A passage whose entry was malformed still gives its evidence, raw.
    facts += [
        Fact(snippet(batch[n - 1], query), batch[n - 1], SNIPPET, batch[n - 1].score)
        for n in sorted(entries.malformed - entries.facts.keys())
    ]
    return BatchResult(index, facts, entries.issues, True, [])


def ground(facts: dict[int, str], batch: Sequence[Source], index: int) -> tuple[dict[int, str], list[Issue]]:
    """Each fact tied to a passage that holds it: kept where the model put it, moved to the
    batch passage holding most of its words (when that passage has no fact yet), or dropped;
    a fact that only restates a title is dropped (the citation shows the title anyway)."""
    kept: dict[int, str] = {}
    issues: list[Issue] = []
    titles = [content_words(source.title) for source in batch]
    for number, text in facts.items():
        words = content_words(text)
        if words and any(words <= title for title in titles):
            issues.append(_issue(index, TITLE_ONLY, f"fact for passage {number} only restates a title"))
            continue
        if coverage(text, batch[number - 1].text) >= MIN_GROUNDING:
            kept.setdefault(number, text)
            continue
        shares = [coverage(text, source.text) for source in batch]
        best = max(range(len(batch)), key=lambda i: shares[i]) + 1
        if shares[best - 1] >= MIN_GROUNDING and best not in kept and best not in facts:
            kept[best] = text
            issues.append(
                _issue(index, REATTRIBUTED, f"fact cited passage {number}, passage {best} holds it")
            )
        else:
            issues.append(
                _issue(index, UNGROUNDED, f"fact for passage {number} is in no passage: {text[:200]}")
            )
    return kept, issues


async def map_passages(
    query: str, sources: Sequence[Source], batch_size: int, guard: LLMGuard, settings: ExtractorSettings
) -> list[BatchResult]:
    """Every batch of ``batch_size`` passages mapped, at most extractor_llm_concurrency at once."""
    batches = [sources[i : i + batch_size] for i in range(0, len(sources), batch_size)]

    def job(index: int, batch: Sequence[Source]) -> Callable[[], Awaitable[BatchResult]]:
        return lambda: map_batch(index, batch, query, guard, settings)

    return await _bounded(settings.extractor_llm_concurrency, [job(i, b) for i, b in enumerate(batches)])


# --- relevance gate ---


def _numbers(raw: Sequence[Any], numbers: int) -> set[int]:
    """The valid fact numbers (1-based) in the gate's reply; anything else is ignored."""
    found: set[int] = set()
    for item in raw[: numbers + ENTRY_SLACK]:
        try:
            number = int(item)
        except (TypeError, ValueError, OverflowError):
            continue
        if 1 <= number <= numbers:
            found.add(number)
    return found


async def gate(
    query: str, facts: Sequence[Fact], guard: LLMGuard, settings: ExtractorSettings
) -> tuple[list[Fact], list[Issue]]:
    """The facts (best first) that bear on the question, by the seeds' keep-rules; all of them
    when the gate cannot run or fails."""
    if len(facts) < 2 or not guard.usable:
        return list(facts), []
    groups = group_by_chars(
        [min(len(f.text), GATE_FACT_CHARS) for f in facts], settings.extractor_prompt_chars, GATE_GROUP_FACTS
    )

    def job(group: list[int]) -> Callable[[], Awaitable[set[int] | Exception]]:
        async def judge() -> set[int] | Exception:
            try:
                reply = await guard.structured(
                    gate_messages(query, [facts[i].text for i in group], GATE_FACT_CHARS),
                    number_list_schema(len(group)),
                    purpose="gate",
                    max_tokens=min(
                        settings.extractor_max_tokens, GATE_TOKENS_BASE + GATE_TOKENS_PER_FACT * len(group)
                    ),
                )
            except (LLMError, LLMSkipped) as exc:
                return exc
            return {group[n - 1] for n in _numbers(reply.relevant, len(group))}

        return judge

    verdicts = await _bounded(settings.extractor_llm_concurrency, [job(g) for g in groups])
    failures = [v for v in verdicts if isinstance(v, Exception)]
    if failures:
        # A partial verdict would wrongly drop the unjudged facts: keep everything.
        return list(facts), [_issue(0, GATE_FAILED, str(failures[0]))]
    passed: set[int] = set()
    for verdict in verdicts:
        if isinstance(verdict, set):
            passed |= verdict
    return gate_keep(facts, passed), []


# --- summarisation ---


async def summarise_group(
    index: int, group: Sequence[Fact], query: str, guard: LLMGuard, settings: ExtractorSettings
) -> tuple[list[Fact], list[Issue]]:
    """The group's facts condensed to one shorter SUMMARY fact per passage; a passage keeps its
    facts when the model skipped it or did not make them shorter."""
    sources: list[Source] = []
    for fact in group:
        if fact.source not in sources:
            sources.append(fact.source)
    number = {source.index: n for n, source in enumerate(sources, start=1)}
    try:
        reply = await guard.structured(
            summary_messages(query, [(number[f.source.index], f.text) for f in group], MAX_FACT_CHARS),
            fact_list_schema(len(sources), len(sources)),
            purpose="summary",
            max_tokens=settings.extractor_max_tokens,
        )
    except LLMSkipped:
        return list(group), []
    except LLMError as exc:
        return list(group), [_issue(index, SUMMARY_FAILED, str(exc))]
    entries = read_entries(reply.facts, len(sources), index)
    if not entries.facts:
        return list(group), [*entries.issues, _issue(index, SUMMARY_FAILED, "no usable entry in the summary")]
    out: list[Fact] = []
    for n, source in enumerate(sources, start=1):
        own = [f for f in group if f.source is source]
        summary = entries.facts.get(n)
        if summary is not None and estimate_tokens(summary) < total_tokens(own):
            out.append(Fact(summary, source, SUMMARY, max(f.score for f in own)))
        else:
            out.extend(own)
    return out, entries.issues


async def summarise_to_fit(
    query: str, facts: Sequence[Fact], budget_tokens: int, guard: LLMGuard, settings: ExtractorSettings
) -> tuple[list[Fact], int, list[Issue]]:
    """Facts summarised round after round until they fit ``budget_tokens``, the rounds run
    out, a round saves nothing or the LLM is given up; returns (facts, rounds, issues). What
    still does not fit is the caller's to drop."""
    current = ordered(facts)
    rounds = 0
    issues: list[Issue] = []
    while (
        total_tokens(current) > budget_tokens
        and rounds < settings.extractor_max_summary_rounds
        and guard.usable
    ):
        rounds += 1
        groups = group_by_chars(
            [len(f.text) for f in current], settings.extractor_prompt_chars, SUMMARY_GROUP_FACTS
        )

        def job(index: int, group: list[Fact]) -> Callable[[], Awaitable[tuple[list[Fact], list[Issue]]]]:
            return lambda: summarise_group(index, group, query, guard, settings)

        results = await _bounded(
            settings.extractor_llm_concurrency,
            [job(i, [current[k] for k in g]) for i, g in enumerate(groups)],
        )
        condensed = ordered([f for group_facts, _ in results for f in group_facts])
        issues += [issue for _, group_issues in results for issue in group_issues]
        saved = total_tokens(current) - total_tokens(condensed)
        current = condensed
        if saved <= 0:
            break
    return current, rounds, issues
