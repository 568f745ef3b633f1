"""The planner with an LLM (a fake one), through a real gRPC server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from grpc import aio

from meshkit.llm.factory import LLMError
from meshkit.rpc.server import start_service
from meshkit.settings import PlannerSettings
from ragmesh.planner.v1 import planner_pb2 as pb
from ragmesh.planner.v1 import planner_pb2_grpc
from services.planner.servicer import build_spec

from .conftest import FakeLLM

SETTINGS = PlannerSettings(
    port=0,
    log_format="text",
    planner_mode="llm",
    planner_hyde_mode="supplement",
    planner_max_query_chars=200,
    planner_max_keywords=3,
)
QUERY = "What does the retry_budget setting control?"
PASSAGE = "The retry_budget setting caps how many retries a client may send. It protects busy servers."
PLAN_REPLY = json.dumps(
    {
        "strategy": "precise",
        "variations": ["purpose of the retry_budget option"],
        "keywords": ["retry_budget"],
        "hyde": PASSAGE,
    }
)


@asynccontextmanager
async def planner(
    llm: FakeLLM | None, settings: PlannerSettings = SETTINGS
) -> AsyncIterator[planner_pb2_grpc.PlannerServiceStub]:
    running = await start_service(build_spec(settings, llm=llm), settings)
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield planner_pb2_grpc.PlannerServiceStub(channel)
    finally:
        await running.stop(1.0)


async def test_llm_plan_with_fusion() -> None:
    llm = FakeLLM(PLAN_REPLY)
    async with planner(llm) as stub:
        reply = await stub.Plan(pb.PlanRequest(query=QUERY, hyde_mode=pb.HYDE_MODE_FUSION))
    plan = reply.plan
    assert plan.planner == "llm" and reply.fallback_reason == "" and reply.fallback_message == ""
    assert list(plan.variations)[:2] == [QUERY, "purpose of the retry_budget option"]
    assert list(plan.hard_keywords) == ["retry_budget"]
    assert (plan.hyde_mode, plan.hyde_passage) == (pb.HYDE_MODE_FUSION, PASSAGE)
    assert (plan.strategy, plan.pool_size) == (pb.STRATEGY_PRECISE, 50)


async def test_the_server_default_mode_applies() -> None:
    async with planner(FakeLLM(PLAN_REPLY)) as stub:
        reply = await stub.Plan(pb.PlanRequest(query=QUERY))
    assert (reply.plan.hyde_mode, reply.plan.hyde_passage) == (pb.HYDE_MODE_SUPPLEMENT, "")


async def test_a_failed_llm_plan_falls_back_and_says_why() -> None:
    llm = FakeLLM(LLMError("unavailable", "connection refused"))
    async with planner(llm) as stub:
        reply = await stub.Plan(pb.PlanRequest(query=QUERY, hyde_mode=pb.HYDE_MODE_FUSION))
    assert reply.plan.planner == "deterministic"
    assert (reply.fallback_reason, reply.fallback_message) == ("unavailable", "connection refused")
    assert (reply.plan.hyde_mode, reply.plan.hyde_passage) == (pb.HYDE_MODE_OFF, "")
    assert reply.plan.variations[0] == QUERY


async def test_garbage_output_falls_back() -> None:
    async with planner(FakeLLM("Sure! Here is your plan: strategy precise")) as stub:
        reply = await stub.Plan(pb.PlanRequest(query=QUERY))
    assert (reply.plan.planner, reply.fallback_reason) == ("deterministic", "invalid_output")


async def test_hyde() -> None:
    llm = FakeLLM(chat_reply=PASSAGE + " A third sentence.")
    async with planner(llm) as stub:
        reply = await stub.Hyde(pb.HydeRequest(query=QUERY))
    assert reply.passage == PASSAGE
    assert llm.calls[0].timeout == SETTINGS.planner_llm_timeout_s


@pytest.mark.parametrize(
    "chat_reply",
    [
        LLMError("unavailable", "connection refused"),
        LLMError("deadline", "no answer before the deadline"),
        LLMError("breaker_open", "circuit breaker open"),
        "   ",
    ],
)
async def test_hyde_with_the_llm_failing_is_unavailable(chat_reply: str | LLMError) -> None:
    async with planner(FakeLLM(chat_reply=chat_reply)) as stub:
        with pytest.raises(aio.AioRpcError) as caught:
            await stub.Hyde(pb.HydeRequest(query=QUERY))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_hyde_without_an_llm_is_a_failed_precondition() -> None:
    settings = SETTINGS.model_copy(update={"planner_mode": "deterministic", "planner_hyde_mode": "off"})
    async with planner(None, settings) as stub:
        with pytest.raises(aio.AioRpcError) as caught:
            await stub.Hyde(pb.HydeRequest(query=QUERY))
        plan = (await stub.Plan(pb.PlanRequest(query=QUERY, hyde_mode=pb.HYDE_MODE_FUSION))).plan
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no LLM" in (caught.value.details() or "")
    assert plan.hyde_mode == pb.HYDE_MODE_OFF


@pytest.mark.parametrize(("query", "message"), [("", "query is empty"), ("x" * 201, "limit is 200")])
async def test_hyde_validates_the_query(query: str, message: str) -> None:
    llm = FakeLLM(chat_reply=PASSAGE)
    async with planner(llm) as stub:
        with pytest.raises(aio.AioRpcError) as caught:
            await stub.Hyde(pb.HydeRequest(query=query))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (caught.value.details() or "")
    assert llm.calls == []


async def test_settings_that_ask_for_an_llm_build_one_and_close_it() -> None:
    (close,) = build_spec(SETTINGS).on_stop
    await close()
    deterministic = SETTINGS.model_copy(update={"planner_mode": "deterministic", "planner_hyde_mode": "off"})
    assert list(build_spec(deterministic).on_stop) == []
