"""The rule-based planner: same query, same plan, no model and no network. A follow-up in a
conversation is planned as its standalone rewrite (``followup.py``).

It never writes a HyDE passage (that needs a language model), so its plans report HyDE as off;
when an LLM is configured, ``hyde.WithHyde`` adds the passage or mode the request asked for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services.planner.followup import standalone_query
from services.planner.keywords import extract_keywords, identifiers
from services.planner.plan import HydeMode, PlanInput, RetrievalPlan, Strategy
from services.planner.strategy import choose_strategy
from services.planner.text import quoted_phrases, tokens, without_quoted
from services.planner.variations import make_variations

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolSizes:
    precise: int
    exhaustive: int

    def for_strategy(self, strategy: Strategy) -> int:
        return self.precise if strategy is Strategy.PRECISE else self.exhaustive


class DeterministicPlanner:
    name = "deterministic"

    def __init__(self, pools: PoolSizes, max_keywords: int) -> None:
        self.pools = pools
        self.max_keywords = max_keywords

    async def plan(self, request: PlanInput) -> RetrievalPlan:
        # Linear passes over a bounded query and history (about a millisecond): cheaper than a thread hop.
        return self.plan_sync(request)

    def plan_sync(self, request: PlanInput) -> RetrievalPlan:
        query = standalone_query(request.query, request.history)
        keywords = extract_keywords(query, self.max_keywords)
        # The question as asked says how broad it is; a rewrite keeps only its topic words.
        strategy = request.strategy or self.choose_strategy(request.query)
        return RetrievalPlan(
            strategy=strategy,
            pool_size=self.pools.for_strategy(strategy),
            variations=tuple(make_variations(query, request.max_variations)),
            hard_keywords=tuple(keywords),
            hyde_passage="",
            hyde_mode=HydeMode.OFF,
            planner=self.name,
        )

    @staticmethod
    def choose_strategy(query: str) -> Strategy:
        choice = choose_strategy(query, has_specific_terms=_has_specific_terms(query))
        log.debug("strategy chosen", extra={"strategy": choice.strategy.value, "reasons": choice.reasons})
        return choice.strategy


def _has_specific_terms(query: str) -> bool:
    """Quoted phrases or identifiers (not mere names or acronyms) mark a targeted question."""
    return bool(quoted_phrases(query) or identifiers(tokens(without_quoted(query))))
