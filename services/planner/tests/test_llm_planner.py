from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from meshkit.llm.factory import LLMError
from services.planner.deterministic import DeterministicPlanner, PoolSizes
from services.planner.llm import MAX_VARIATION_CHARS, LLMPlanner
from services.planner.plan import HydeMode, PlanInput, Strategy

from .conftest import FakeLLM

DETERMINISTIC = DeterministicPlanner(PoolSizes(precise=50, exhaustive=80), max_keywords=4)
QUERY = "Why does the Payments API return ERR_CONN_RESET after upgrading to v2.3.1?"


def planner(llm: FakeLLM) -> LLMPlanner:
    return LLMPlanner(llm, DETERMINISTIC, max_keywords=4, timeout_s=6.5)


def reply(**fields: Any) -> str:
    return json.dumps({"strategy": "precise", "variations": [], "keywords": [], **fields})


def request(
    query: str = QUERY,
    strategy: Strategy | None = None,
    max_variations: int = 3,
    hyde: HydeMode | None = HydeMode.OFF,
) -> PlanInput:
    return PlanInput(query, strategy, max_variations, hyde)


async def test_the_model_plan_is_cleaned_up() -> None:
    llm = FakeLLM(
        reply(
            strategy=" Exhaustive ",
            variations=[
                # The query again.
                "why does the payments api return err_conn_reset after upgrading to v2.3.1",
                "",
                "x" * (MAX_VARIATION_CHARS + 1),
                "Payments API connection reset   after the v2.3.1 upgrade",
                "payments api connection reset after the v2.3.1 upgrade!",  # a repeat
                "the",  # no content word
                "ERR_CONN_RESET cause",
                "one more than asked for",
            ],
            keywords=["err conn reset", "payments api", "the", "Stripe", "ERR_CONN_RESET", "upgrading", "v2"],
        )
    )
    plan = await planner(llm).plan(request(max_variations=3))
    assert plan.planner == "llm" and plan.fallback is None
    assert (plan.strategy, plan.pool_size) == (Strategy.EXHAUSTIVE, 80)
    assert plan.variations == (
        QUERY,
        "Payments API connection reset after the v2.3.1 upgrade",
        "ERR_CONN_RESET cause",
    )
    # Identifiers first whatever the model says; then the model's in-query terms, in the query's
    # spelling; "Stripe" (not in the query), "the" and the partial "v2" are dropped; capped at 4.
    assert plan.hard_keywords == ("ERR_CONN_RESET", "v2.3.1", "Payments API", "upgrading")
    assert (plan.hyde_mode, plan.hyde_passage) == (HydeMode.OFF, "")


async def test_the_schema_and_prompt_are_bounded() -> None:
    llm = FakeLLM(reply())
    await planner(llm).plan(request(max_variations=3))
    (call,) = llm.calls
    assert call.kind == "structured" and call.timeout == 6.5
    assert call.max_tokens is not None and call.max_tokens <= 512
    assert call.schema is not None
    schema = call.schema.model_json_schema()
    assert schema["properties"]["variations"]["maxItems"] == 2
    assert schema["properties"]["variations"]["items"]["maxLength"] == MAX_VARIATION_CHARS
    assert schema["properties"]["keywords"]["maxItems"] == 4
    assert schema["properties"]["strategy"]["enum"] == ["precise", "exhaustive"]
    assert "hyde" not in schema["properties"]
    assert QUERY in call.prompt and "reworded, 2 ways" in call.prompt
    assert len(call.prompt) < 600


async def test_one_variation_asks_for_none() -> None:
    llm = FakeLLM(reply(variations=["ignored"]))
    plan = await planner(llm).plan(request(max_variations=1))
    assert plan.variations == (QUERY,)
    assert llm.calls[0].schema is not None
    assert "variations" not in llm.calls[0].schema.model_json_schema()["properties"]


async def test_deterministic_rewrites_fill_what_the_model_left() -> None:
    query = "What are the side effects of metformin?"
    plan = await planner(FakeLLM(reply())).plan(request(query, max_variations=3))
    assert plan.variations == tuple(DETERMINISTIC.plan_sync(request(query)).variations)


@pytest.mark.parametrize(
    ("query", "model", "expected"),
    [
        ("Give me an overview of Kubernetes networking", "precise", Strategy.EXHAUSTIVE),
        ("How did the team handle the outage last spring?", "exhaustive", Strategy.EXHAUSTIVE),
        ("Who wrote the retry module?", "precise", Strategy.PRECISE),
    ],
)
async def test_broad_when_the_model_or_the_rules_say_so(query: str, model: str, expected: Strategy) -> None:
    plan = await planner(FakeLLM(reply(strategy=model))).plan(request(query))
    assert plan.strategy is expected


async def test_a_fixed_strategy_wins_over_the_model() -> None:
    llm = FakeLLM(reply(strategy="exhaustive"))
    plan = await planner(llm).plan(request(strategy=Strategy.PRECISE))
    assert (plan.strategy, plan.pool_size) == (Strategy.PRECISE, 50)


@pytest.mark.parametrize(
    ("model_reply", "reason"),
    [
        ("I am sorry, I cannot plan that.", "invalid_output"),
        ('{"strategy": "broad", "variations": [], "keywords": []}', "invalid_output"),
        ('{"variations": ["a"]}', "invalid_output"),
        (LLMError("deadline", "no answer before the deadline"), "deadline"),
        (LLMError("breaker_open", "circuit breaker open"), "breaker_open"),
    ],
)
async def test_failures_give_the_deterministic_plan(model_reply: str | LLMError, reason: str) -> None:
    plan = await planner(FakeLLM(model_reply)).plan(request(hyde=HydeMode.FUSION))
    expected = DETERMINISTIC.plan_sync(request(hyde=HydeMode.FUSION))
    assert plan.fallback is not None and plan.fallback.reason == reason and plan.fallback.message
    assert plan == dataclasses.replace(expected, fallback=plan.fallback)


async def test_fusion_asks_for_a_passage_and_trims_it() -> None:
    llm = FakeLLM(
        reply(hyde="Answer: The reset comes from the proxy. It drops idle sockets. Upgrading fixes it.")
    )
    plan = await planner(llm).plan(request(hyde=HydeMode.FUSION))
    assert plan.hyde_passage == "The reset comes from the proxy. It drops idle sockets."
    assert plan.hyde_mode is HydeMode.FUSION
    (call,) = llm.calls
    assert call.schema is not None and "hyde" in call.schema.model_json_schema()["properties"]
    assert "hyde =" in call.prompt


async def test_echoed_instructions_are_dropped() -> None:
    query = "What are the side effects of metformin?"
    echo = reply(variations=["exhaustive", "overview"], keywords=["metformin"], hyde="a short answer")
    plan = await planner(FakeLLM(echo)).plan(request(query, hyde=HydeMode.FUSION))
    assert plan.variations == tuple(DETERMINISTIC.plan_sync(request(query)).variations)
    assert plan.hard_keywords == ("metformin",)
    assert (plan.hyde_mode, plan.hyde_passage) == (HydeMode.OFF, "")


@pytest.mark.parametrize("mode", [HydeMode.SUPPLEMENT, HydeMode.OFF, None])
async def test_other_modes_ask_for_no_passage(mode: HydeMode | None) -> None:
    llm = FakeLLM(reply(hyde="A passage the model wrote anyway."))
    plan = await planner(llm).plan(request(hyde=mode))
    assert plan.hyde_passage == ""
    assert llm.calls[0].schema is not None
    assert "hyde" not in llm.calls[0].schema.model_json_schema()["properties"]
    assert "hyde" not in llm.calls[0].prompt
