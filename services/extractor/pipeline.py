"""One Extract request end to end: map (LLM or extractive), dedup, gate, cap, budget."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from meshkit.llm.factory import LLM
from meshkit.settings import ExtractorSettings
from services.extractor.extractive import Embed, best_sentences
from services.extractor.facts import EMBEDDER_UNAVAILABLE, NO_FACTS, Fact, Issue, Job, Outcome, Source
from services.extractor.llmguard import LLMGuard
from services.extractor.mapreduce import BatchResult, gate, map_passages, summarise_to_fit
from services.extractor.metrics import FALLBACKS
from services.extractor.selection import dedup, drop_to_fit, total_tokens

log = logging.getLogger("ragmesh.extractor")


class Extractor:
    """Holds the LLM and the embedder; each ``extract`` call has its own LLMGuard."""

    def __init__(self, settings: ExtractorSettings, llm: LLM, embed: Embed) -> None:
        self._settings = settings
        self._llm = llm
        self._embed = embed

    async def extract(self, job: Job) -> Outcome:
        if job.mode == "extractive":
            facts, issues = await self._sentences(job.query, job.sources, batch=0)
            outcome = Outcome(self._dedup(facts), "extractive", issues=issues)
        else:
            outcome = await self._with_llm(job)
        outcome.facts = drop_to_fit(outcome.facts[: job.max_facts], job.budget_tokens)
        return outcome

    async def _sentences(
        self, query: str, sources: Sequence[Source], batch: int
    ) -> tuple[list[Fact], list[Issue]]:
        """Extractive facts; a down embedder costs precision (lexical scoring), never the request."""
        facts, embedder_error = await best_sentences(
            query, sources, self._settings.extractor_sentences_per_passage, self._embed
        )
        if not embedder_error:
            return facts, []
        FALLBACKS.labels("embedder").inc()
        log.warning("embedder unavailable, scoring sentences lexically", extra={"error": embedder_error})
        return facts, [Issue(batch, EMBEDDER_UNAVAILABLE, f"lexical sentence scoring: {embedder_error}")]

    def _dedup(self, facts: Sequence[Fact]) -> list[Fact]:
        settings = self._settings
        return dedup(facts, settings.extractor_facts_per_source, settings.extractor_sentences_per_passage)

    async def _with_llm(self, job: Job) -> Outcome:
        settings = self._settings
        guard = LLMGuard(self._llm, settings.llm_timeout_s)
        batches = await map_passages(job.query, job.sources, job.batch_size, guard, settings)
        facts = [f for b in batches for f in b.facts]
        issues = [i for b in batches for i in b.issues]
        failed = [b for b in batches if b.fallback]
        for batch in failed:
            FALLBACKS.labels(batch.fallback_reason).inc()
        fallback = [s for b in failed for s in b.fallback]
        if not facts and not fallback:
            # The model found nothing in any passage. A tiny model says so far more often than
            # the reranked evidence deserves, so the passages' best sentences stand in and the
            # narrator's support checks judge them.
            FALLBACKS.labels(NO_FACTS).inc()
            issues.append(Issue(0, NO_FACTS, "the LLM wrote no fact; the passages answer extractively"))
            fallback = list(job.sources)
        if fallback:
            extra, extra_issues = await self._sentences(
                job.query, fallback, batch=failed[0].index if failed else 0
            )
            facts += extra
            issues += extra_issues
        facts = self._dedup(facts)
        gated_out = 0
        if settings.extractor_relevance_gate:
            gated, gate_issues = await gate(job.query, facts, guard, settings)
            gated_out = len(facts) - len(gated)
            facts, issues = gated, issues + gate_issues
        facts = facts[: job.max_facts]
        rounds = 0
        if total_tokens(facts) > job.budget_tokens:
            facts, rounds, summary_issues = await summarise_to_fit(
                job.query, facts, job.budget_tokens, guard, settings
            )
            issues += summary_issues
        return Outcome(
            facts,
            "llm" if any(b.used_llm for b in batches) else "extractive",
            degraded_reason=_degraded_reason(guard, batches, failed),
            issues=issues,
            llm_calls=guard.calls,
            gated_out=gated_out,
            summary_rounds=rounds,
        )


def _degraded_reason(guard: LLMGuard, batches: Sequence[BatchResult], failed: Sequence[BatchResult]) -> str:
    """Why the LLM did not do all the work, as "<reason>: <detail>" (the reason an LLMError's):
    it was given up, or some batches failed."""
    if guard.down_reason:
        return guard.down_reason
    if failed:
        first = failed[0].issues[0].message if failed[0].issues else failed[0].fallback_reason
        reason = failed[0].fallback_reason or "error"
        return f"{reason}: {len(failed)} of {len(batches)} batches answered extractively ({first})"
    return ""
