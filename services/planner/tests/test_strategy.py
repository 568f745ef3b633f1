from __future__ import annotations

import pytest

from services.planner.deterministic import DeterministicPlanner, PoolSizes
from services.planner.plan import HydeMode, PlanInput, Strategy
from services.planner.strategy import choose_strategy

PLANNER = DeterministicPlanner(PoolSizes(precise=50, exhaustive=80), max_keywords=8)


def auto(query: str) -> Strategy:
    return PLANNER.plan_sync(PlanInput(query, None, 3, None)).strategy


@pytest.mark.parametrize(
    "query",
    [
        "Give me an overview of Kubernetes networking",
        "Summarize my notes on the migration",
        "Compare PostgreSQL and MySQL for analytics workloads",
        "What is the history of CRISPR gene editing?",
        "What are the side effects of metformin?",
        "List all the errors mentioned in the deploy notes",
        "What's the difference between TCP and UDP?",
        "pros and cons of microservices",
        "What types of cells express IL-6?",
        "Tell me about the relationship between sleep, diet, exercise and mental health, and how they "
        "interact over a lifetime",
        "Why did the rollout stall? Who approved it? What was rolled back?",
    ],
)
def test_broad_asks_are_exhaustive(query: str) -> None:
    assert auto(query) is Strategy.EXHAUSTIVE


@pytest.mark.parametrize(
    "query",
    [
        "What is the role of the immune system?",
        "Who wrote the ingestion worker?",
        "When was version 2 released?",
        "How many replicas does the index run?",
        "Is CVE-2024-1234 fixed?",
        "Why do I get ERR_CONN_RESET after upgrading to v2.3.1?",
        'Where is "connection reset by peer" logged?',
        "All hematopoietic stem cells segregate their chromosomes randomly.",
        "Ly6C hi monocytes have a lower inflammatory capacity compared to their Ly6C lo counterparts.",
        "Explain what p53 does",
        "List comprehension in Python",
    ],
)
def test_targeted_asks_are_precise(query: str) -> None:
    assert auto(query) is Strategy.PRECISE


def test_a_long_query_alone_is_not_enough_for_exhaustive() -> None:
    query = " ".join(["word"] * 40)
    assert choose_strategy(query, has_specific_terms=False).strategy is Strategy.PRECISE


def test_reasons_explain_the_choice() -> None:
    choice = choose_strategy("Summarize the incident", has_specific_terms=False)
    assert choice.reasons == ("cue:summarize",)


def test_requested_strategy_overrides_and_sets_the_pool() -> None:
    broad = "Give me an overview of Kubernetes networking"
    plan = PLANNER.plan_sync(PlanInput(broad, Strategy.PRECISE, 3, None))
    assert (plan.strategy, plan.pool_size) == (Strategy.PRECISE, 50)
    plan = PLANNER.plan_sync(PlanInput("Is p53 a tumour suppressor?", Strategy.EXHAUSTIVE, 3, None))
    assert (plan.strategy, plan.pool_size) == (Strategy.EXHAUSTIVE, 80)


def test_pool_sizes_follow_the_strategy() -> None:
    assert PLANNER.plan_sync(PlanInput("Who wrote it?", None, 3, None)).pool_size == 50
    assert PLANNER.plan_sync(PlanInput("Summarize the outage", None, 3, None)).pool_size == 80


def test_without_a_model_hyde_is_off_whatever_was_asked() -> None:
    plan = PLANNER.plan_sync(PlanInput("What is p53?", None, 3, HydeMode.FUSION))
    assert plan.hyde_mode is HydeMode.OFF
    assert plan.hyde_passage == ""
    assert plan.planner == "deterministic"


async def test_async_plan_matches_sync_plan() -> None:
    request = PlanInput("How does IL-6 affect p53?", None, 3, None)
    assert await PLANNER.plan(request) == PLANNER.plan_sync(request)
