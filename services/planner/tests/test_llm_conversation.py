"""The LLM planner in a conversation, with a scripted model: its condensed question is searched
when it holds up, anything else falls back to the deterministic rewrite with a reported
reason; exhaustive questions are decomposed into a bounded number of sub-queries."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from meshkit.llm.factory import LLMError
from services.planner.deterministic import DeterministicPlanner, PoolSizes
from services.planner.llm import MAX_QUESTION_CHARS, MAX_SUB_QUERIES, PROMPT_TURN_CHARS, LLMPlanner
from services.planner.plan import HydeMode, PlanInput, Strategy, Turn

from .conftest import FakeLLM

DETERMINISTIC = DeterministicPlanner(PoolSizes(precise=50, exhaustive=80), max_keywords=4)
HISTORY = (
    Turn(user=True, content="How is the production cluster configured?"),
    Turn(user=False, content="It runs five nodes behind a load balancer [1]."),
)
FOLLOW_UP = "and for the staging cluster?"
CONDENSED = "How is the staging cluster configured?"


def planner(llm: FakeLLM) -> LLMPlanner:
    return LLMPlanner(llm, DETERMINISTIC, max_keywords=4, timeout_s=6.5)


def reply(**fields: Any) -> str:
    return json.dumps({"strategy": "precise", "variations": [], "keywords": [], **fields})


def request(
    query: str = FOLLOW_UP,
    history: tuple[Turn, ...] = HISTORY,
    max_variations: int = 3,
    strategy: Strategy | None = None,
) -> PlanInput:
    return PlanInput(query, strategy, max_variations, HydeMode.OFF, history)


def schema_fields(llm: FakeLLM) -> dict[str, Any]:
    schema = llm.calls[0].schema
    assert schema is not None
    properties: dict[str, Any] = schema.model_json_schema()["properties"]
    return properties


async def test_the_condensed_question_is_searched() -> None:
    llm = FakeLLM(reply(question=f"  {CONDENSED} ", variations=["staging cluster configuration"]))
    plan = await planner(llm).plan(request())
    assert plan.fallback is None and plan.planner == "llm"
    assert plan.searched_query == CONDENSED
    assert plan.variations == (CONDENSED, "staging cluster configuration", "the staging cluster configured")
    (call,) = llm.calls
    # The conversation is in the prompt, before the question; the question field comes first.
    assert "User: How is the production cluster configured?" in call.prompt
    assert "Assistant: It runs five nodes" in call.prompt
    assert call.prompt.index("Conversation:") < call.prompt.index(f"Question: {FOLLOW_UP}")
    fields = schema_fields(llm)
    assert next(iter(fields)) == "question"
    assert fields["question"]["maxLength"] == MAX_QUESTION_CHARS


async def test_the_prompt_holds_only_the_last_turns_cut_short() -> None:
    history = tuple(Turn(user=i % 2 == 0, content=f"turn{i} " + "y" * 5000) for i in range(20))
    llm = FakeLLM(reply(question="and for the staging cluster in turn18?"))
    await planner(llm).plan(request(history=history))
    prompt = llm.calls[0].prompt
    assert "turn15" not in prompt and "turn16" in prompt and "turn19" in prompt
    assert len(prompt) < 4 * (PROMPT_TURN_CHARS + 20) + 800


async def test_no_user_turn_asks_for_no_condensed_question() -> None:
    llm = FakeLLM(reply())
    plan = await planner(llm).plan(request(history=(Turn(user=False, content="Hello!"),)))
    assert "question" not in schema_fields(llm)
    assert "Conversation:" not in llm.calls[0].prompt
    assert plan.searched_query == FOLLOW_UP


@pytest.mark.parametrize(
    ("question", "why"),
    [
        ("", "no standalone question"),
        ("   ", "no standalone question"),
        ("How is the production cluster configured?", "lost 1 word"),  # dropped "staging"
        ("staging cluster " * 10, "repeats itself"),
        ("How is the staging cluster configured " + "and tuned " * 40 + "?", "over 300 characters"),
    ],
)
async def test_an_unusable_condensed_question_falls_back_to_the_rules(question: str, why: str) -> None:
    plan = await planner(FakeLLM(reply(question=question))).plan(request())
    assert plan.fallback is not None
    assert plan.fallback.reason == "invalid_output" and why in plan.fallback.message
    expected = DETERMINISTIC.plan_sync(request())
    assert plan == dataclasses.replace(expected, fallback=plan.fallback)
    assert plan.searched_query == "staging cluster configured"


@pytest.mark.parametrize(
    "model_reply",
    ["Sure! The standalone question is: how is staging configured", LLMError("deadline", "too slow")],
)
async def test_a_failed_call_gives_the_deterministic_rewrite(model_reply: str | LLMError) -> None:
    plan = await planner(FakeLLM(model_reply)).plan(request())
    assert plan.fallback is not None
    assert plan.searched_query == "staging cluster configured"


async def test_an_exhaustive_question_is_decomposed_into_sub_queries() -> None:
    query = "Compare the retry policies of the Go and Java clients"
    llm = FakeLLM(
        reply(
            strategy="exhaustive",
            sub_queries=[
                "Go client retry policy",
                "Java client retry policy",
                "Go client retry policy",  # a repeat
                "unrelated words entirely",  # off topic
                "Python client retry policy",
                "Rust client retry policy",  # past the bound
            ],
            variations=["retry policies Go versus Java"],
        )
    )
    plan = await planner(llm).plan(request(query, history=(), max_variations=8))
    assert plan.strategy is Strategy.EXHAUSTIVE
    # The sub-queries right after the question, then the model's rewrites.
    assert plan.variations[:5] == (
        query,
        "Go client retry policy",
        "Java client retry policy",
        "Python client retry policy",
        "retry policies Go versus Java",
    )
    assert "Rust client retry policy" not in plan.variations
    assert schema_fields(llm)["sub_queries"]["maxItems"] == MAX_SUB_QUERIES
    assert "sub_queries =" in llm.calls[0].prompt


@pytest.mark.parametrize(
    ("query", "max_variations", "wanted"),
    [
        ("Which load balancers support HTTP/2 health checks?", 3, 2),
        ("List all the environment variables the gateway reads", 8, MAX_SUB_QUERIES),
        ("Who wrote the retry module?", 3, 0),
        ("Compare the Go and Java clients", 1, 0),
    ],
)
async def test_sub_queries_are_asked_for_exhaustive_questions_only_and_bounded(
    query: str, max_variations: int, wanted: int
) -> None:
    llm = FakeLLM(reply())
    await planner(llm).plan(request(query, history=(), max_variations=max_variations))
    fields = schema_fields(llm)
    if wanted:
        assert fields["sub_queries"]["maxItems"] == wanted
    else:
        assert "sub_queries" not in fields


async def test_a_follow_up_can_be_condensed_and_decomposed() -> None:
    history = (Turn(user=True, content="Which clients support retries?"),)
    llm = FakeLLM(
        reply(
            question="Compare the retry support of the Go and Java clients",
            sub_queries=["Go client retries", "Java client retries"],
        )
    )
    plan = await planner(llm).plan(request("compare Go and Java", history=history, max_variations=3))
    assert plan.variations == (
        "Compare the retry support of the Go and Java clients",
        "Go client retries",
        "Java client retries",
    )
