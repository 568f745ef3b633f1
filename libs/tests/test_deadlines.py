"""Deadlines beyond what grpc can represent are clamped to MAX_DEADLINE_S, not failed.

A caller may send ``grpc-timeout: 99999999H`` (about 11,400 years). grpc's server accepts it,
but the rest of such a deadline handed to a downstream call through grpc's Python client
overflows its int64 nanoseconds since the epoch and the call expires at once, unsent: the
gateway answered DEADLINE_EXCEEDED ("no retrieval leg answered within the deadline") at once.
grpc's own clients never send such a header (C-core caps theirs at 27000H), so these tests send
it over a bare HTTP/2 connection (rawgrpc), to real servers started the way the services start.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc import aio

import services.gateway.tests.conftest as gateway_harness
from meshkit.rpc.client import Downstream, remaining_budget
from meshkit.rpc.interceptors import MAX_DEADLINE_S, clamp_deadline, deadline_var
from meshkit.rpc.server import RunningService
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.gateway.v1 import gateway_pb2

from . import rawgrpc
from .conftest import FakeEmbedder, StartFake

EMBED = "/ragmesh.embedder.v1.EmbedderService/Embed"
HUGE = {"grpc-timeout": "99999999H"}
REQUEST = embedder_pb2.EmbedRequest(texts=["a"])
# A call takes far less than this to reach a handler, even on a loaded machine.
SLACK_S = 60.0
# grpc sends a timeout in at most 8 digits of its unit, rounded up: a day's rest of a deadline
# (86,399.99 s) may arrive as 86,500 s. The receiving interceptor clamps it to a day again.
ENCODING_ROUND_UP_S = 200.0


def within_a_day(remaining: float | None) -> bool:
    return (
        remaining is not None and MAX_DEADLINE_S - SLACK_S < remaining <= MAX_DEADLINE_S + ENCODING_ROUND_UP_S
    )


def test_clamp_keeps_short_deadlines_and_none() -> None:
    assert clamp_deadline(None) is None
    assert clamp_deadline(5.0) == 5.0
    assert clamp_deadline(3.6e11) == MAX_DEADLINE_S


def test_an_explicit_timeout_beyond_a_day_is_cut_to_a_day() -> None:
    assert remaining_budget(3.6e11) == MAX_DEADLINE_S
    token = deadline_var.set(time.monotonic() + 3.6e11)
    try:
        assert remaining_budget(None) == MAX_DEADLINE_S
        assert remaining_budget(2.0) == 2.0
    finally:
        deadline_var.reset(token)


async def test_a_huge_deadline_is_served_under_a_day(start_fake: StartFake) -> None:
    served = await start_fake()
    reply = await rawgrpc.call(served.running.port, EMBED, REQUEST.SerializeToString(), HUGE)
    assert reply.code == grpc.StatusCode.OK, reply.details
    assert embedder_pb2.EmbedResponse.FromString(reply.messages[0]).model == "a"
    seen = served.fake.seen[-1]
    assert seen.deadline is not None
    assert within_a_day(seen.deadline - time.monotonic())


async def test_downstream_calls_get_the_clamped_rest(start_fake: StartFake) -> None:
    """A handler that gives a downstream call the rest of its deadline, as the gateway does."""
    downstream_served = await start_fake()
    client = Downstream("embedder", downstream_served.address, embedder_pb2_grpc.EmbedderServiceStub)

    async def forward(request: Any, context: aio.ServicerContext) -> Any:
        deadline = deadline_var.get()
        assert deadline is not None
        return await client.call(client.stub.Embed, request, timeout=deadline - time.monotonic())

    front = await start_fake(FakeEmbedder(behavior=forward))
    try:
        reply = await rawgrpc.call(front.running.port, EMBED, REQUEST.SerializeToString(), HUGE)
    finally:
        await client.close()
    assert reply.code == grpc.StatusCode.OK, reply.details
    assert embedder_pb2.EmbedResponse.FromString(reply.messages[0]).model == "a"
    assert within_a_day(downstream_served.fake.seen[-1].time_remaining)


async def test_a_downstream_call_given_a_huge_timeout_is_made_not_failed(start_fake: StartFake) -> None:
    served = await start_fake()
    client = Downstream("embedder", served.address, embedder_pb2_grpc.EmbedderServiceStub)
    try:
        reply = await client.call(client.stub.Embed, REQUEST, timeout=3.6e11)
    finally:
        await client.close()
    assert reply.model == "a"
    assert within_a_day(served.fake.seen[-1].time_remaining)


# --- through the gateway, whose legs and stages get shares of the caller's deadline ---------


@asynccontextmanager
async def gateway_on_port(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[gateway_harness.Gateway, int, list[float | None]]]:
    """The gateway's test harness (fake stages on real servers), with its port, and the time
    left of each call the fake stages received."""
    started: list[RunningService] = []
    real_start = gateway_harness.start_service

    async def recording_start(*args: Any) -> RunningService:
        running = await real_start(*args)
        started.append(running)
        return running

    monkeypatch.setattr(gateway_harness, "start_service", recording_start)
    async with gateway_harness.running_gateway() as gateway:
        remaining: list[float | None] = []
        real_act = gateway.fakes.act

        async def recording_act(key: str, request: Any, context: aio.ServicerContext) -> None:
            remaining.append(context.time_remaining())
            await real_act(key, request, context)

        monkeypatch.setattr(gateway.fakes, "act", recording_act)
        yield gateway, started[0].port, remaining


SEARCH = gateway_pb2.SearchRequest(collection=gateway_harness.COLLECTION, query="what is a zx-81")
ASK = gateway_pb2.AskRequest(collection=gateway_harness.COLLECTION, query="what is ZX-81?")


async def test_the_gateway_searches_under_a_huge_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    async with gateway_on_port(monkeypatch) as (_gateway, port, remaining):
        path = "/ragmesh.gateway.v1.GatewayService/Search"
        reply = await rawgrpc.call(port, path, SEARCH.SerializeToString(), HUGE)
    assert reply.code == grpc.StatusCode.OK, reply.details
    response = gateway_pb2.SearchResponse.FromString(reply.messages[0])
    assert response.results and not response.degradations
    assert remaining and all(r is not None and 0 < r <= MAX_DEADLINE_S for r in remaining)


async def test_the_gateway_answers_under_a_huge_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    async with gateway_on_port(monkeypatch) as (_gateway, port, remaining):
        ask = await rawgrpc.call(
            port, "/ragmesh.gateway.v1.GatewayService/Ask", ASK.SerializeToString(), HUGE
        )
        streamed = await rawgrpc.call(
            port,
            "/ragmesh.gateway.v1.GatewayService/AskStream",
            gateway_pb2.AskStreamRequest(request=ASK).SerializeToString(),
            HUGE,
        )
    assert ask.code == grpc.StatusCode.OK, ask.details
    assert gateway_pb2.AskResponse.FromString(ask.messages[0]).answer
    assert streamed.code == grpc.StatusCode.OK, streamed.details
    events = [gateway_pb2.AskStreamResponse.FromString(m) for m in streamed.messages]
    assert events[-1].answer.answer
    assert remaining and all(r is not None and 0 < r <= MAX_DEADLINE_S for r in remaining)
