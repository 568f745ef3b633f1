"""Downstream (deadline, retries, breaker, request id) against real servers on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from meshkit.core.errors import ServiceError, invalid_argument, unavailable
from meshkit.core.logs import REQUEST_ID_HEADER, current_request_id, request_id_var
from meshkit.rpc.client import ClientPolicy, Downstream, DownstreamError, check_health, remaining_budget
from meshkit.rpc.interceptors import deadline_var
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc

REQUEST = embedder_pb2.EmbedRequest(texts=["q"])
FAST = ClientPolicy(
    timeout_s=2.0, retry_attempts=3, retry_backoff_s=0.01, breaker_fail_max=3, breaker_reset_s=0.3
)

_targets = iter(range(1_000_000))

Client = Downstream[embedder_pb2_grpc.EmbedderServiceStub]


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., Client]]:
    clients: list[Client] = []

    def make(address: str, policy: ClientPolicy = FAST) -> Client:
        # A fresh target name per client: breaker and metric labels stay per test.
        client = Downstream(
            f"target-{next(_targets)}", address, embedder_pb2_grpc.EmbedderServiceStub, policy
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def failing_first(n: int, error: Callable[[], ServiceError]) -> Any:
    """A handler that raises ``error()`` on its first ``n`` calls, then echoes."""
    calls = 0

    async def behavior(request: embedder_pb2.EmbedRequest, context: Any) -> embedder_pb2.EmbedResponse:
        nonlocal calls
        calls += 1
        if calls <= n:
            raise error()
        return embedder_pb2.EmbedResponse(model="recovered")

    return behavior


def always(error: Callable[[], ServiceError]) -> Any:
    return failing_first(10**9, error)


def down() -> ServiceError:
    return unavailable("downstream warming up")


def client_calls(target: str, code: str) -> float:
    labels = {"target": target, "method": "Embed", "code": code}
    return REGISTRY.get_sample_value("ragmesh_client_calls_total", labels) or 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_call_returns_the_reply(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    client = connect(served.address)
    reply = await client.call(client.stub.Embed, REQUEST, idempotent=True)
    assert reply.model == "q"
    assert client_calls(client.target, "OK") == 1


async def test_idempotent_call_retries_unavailable_until_recovered(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    served.fake.behavior = failing_first(2, down)
    client = connect(served.address)
    started = time.monotonic()
    reply = await client.call(client.stub.Embed, REQUEST, idempotent=True)
    elapsed = time.monotonic() - started
    assert reply.model == "recovered"
    assert served.fake.calls == 3
    # Backoff follows the policy (10 ms first), not a fixed second of jitter.
    assert elapsed < 0.5
    retries = {"target": client.target, "method": "Embed"}
    assert REGISTRY.get_sample_value("ragmesh_client_retries_total", retries) == 2


async def test_idempotent_call_gives_up_after_its_attempts(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    served.fake.behavior = always(down)
    client = connect(
        served.address, ClientPolicy(retry_attempts=2, retry_backoff_s=0.01, breaker_fail_max=10)
    )
    with pytest.raises(DownstreamError) as exc:
        await client.call(client.stub.Embed, REQUEST, idempotent=True)
    assert exc.value.reason == "unavailable"
    assert exc.value.code == grpc.StatusCode.UNAVAILABLE
    assert exc.value.message == "downstream warming up"
    assert exc.value.target == client.target
    assert served.fake.calls == 2


async def test_non_idempotent_call_is_not_retried(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    served.fake.behavior = failing_first(1, down)
    client = connect(served.address)
    with pytest.raises(DownstreamError) as exc:
        await client.call(client.stub.Embed, REQUEST)
    assert exc.value.reason == "unavailable"
    assert served.fake.calls == 1


async def test_rejection_is_not_retried_and_spares_the_breaker(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    served.fake.behavior = always(lambda: invalid_argument("texts[0] is empty"))
    client = connect(served.address)
    for _ in range(FAST.breaker_fail_max + 2):
        with pytest.raises(DownstreamError) as exc:
            await client.call(client.stub.Embed, REQUEST, idempotent=True)
        assert exc.value.reason == "rejected"
        assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert exc.value.message == "texts[0] is empty"
    assert served.fake.calls == FAST.breaker_fail_max + 2
    assert client.breaker_state == "closed"


async def test_internal_error_counts_against_the_breaker(start_fake: Any, connect: Any) -> None:
    served = await start_fake()

    async def crash(request: Any, context: Any) -> Any:
        raise RuntimeError("bug")

    served.fake.behavior = crash
    client = connect(served.address)
    with pytest.raises(DownstreamError) as exc:
        await client.call(client.stub.Embed, REQUEST, idempotent=True)
    assert exc.value.reason == "error"
    assert exc.value.code == grpc.StatusCode.INTERNAL
    assert served.fake.calls == 1  # INTERNAL is not retried: the same request would fail again
    assert client.breaker.fail_counter == 1


async def test_breaker_opens_then_lets_a_trial_through_and_closes(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    served.fake.behavior = always(down)
    client = connect(served.address)
    for _ in range(FAST.breaker_fail_max):
        with pytest.raises(DownstreamError) as exc:
            await client.call(client.stub.Embed, REQUEST)
        # Calls that reached the downstream report what it said.
        assert exc.value.reason == "unavailable"
    assert client.breaker_state == "open"
    assert REGISTRY.get_sample_value("ragmesh_breaker_open", {"target": client.target}) == 1

    for idempotent in (False, True, True):
        with pytest.raises(DownstreamError) as exc:
            await client.call(client.stub.Embed, REQUEST, idempotent=idempotent)
        assert exc.value.reason == "breaker_open"
        assert exc.value.code == grpc.StatusCode.UNAVAILABLE
    assert served.fake.calls == FAST.breaker_fail_max
    assert client_calls(client.target, "BREAKER_OPEN") == 3

    served.fake.behavior = None
    await asyncio.sleep(FAST.breaker_reset_s + 0.05)
    reply = await client.call(client.stub.Embed, REQUEST)
    assert reply.model == "q"
    assert client.breaker_state == "closed"
    assert REGISTRY.get_sample_value("ragmesh_breaker_open", {"target": client.target}) == 0
    assert served.fake.calls == FAST.breaker_fail_max + 1


async def test_failed_trial_reopens_the_breaker(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    served.fake.behavior = always(down)
    client = connect(served.address)
    for _ in range(FAST.breaker_fail_max):
        with pytest.raises(DownstreamError):
            await client.call(client.stub.Embed, REQUEST)
    await asyncio.sleep(FAST.breaker_reset_s + 0.05)
    with pytest.raises(DownstreamError):
        await client.call(client.stub.Embed, REQUEST)  # the trial: reaches the server, fails
    assert served.fake.calls == FAST.breaker_fail_max + 1
    assert client.breaker_state == "open"
    with pytest.raises(DownstreamError) as exc:
        await client.call(client.stub.Embed, REQUEST)
    assert exc.value.reason == "breaker_open"
    assert served.fake.calls == FAST.breaker_fail_max + 1


async def test_outgoing_deadline_is_cut_to_the_inbound_one(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    client = connect(served.address, ClientPolicy(timeout_s=30.0))
    inbound = time.monotonic() + 0.8
    token = deadline_var.set(inbound)
    try:
        await client.call(client.stub.Embed, REQUEST)
    finally:
        deadline_var.reset(token)
    seen = served.fake.seen[-1]
    assert seen.deadline is not None and seen.deadline <= inbound
    assert seen.time_remaining is not None and seen.time_remaining <= 0.8


async def test_explicit_timeout_shorter_than_inbound_deadline_wins(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    client = connect(served.address)
    token = deadline_var.set(time.monotonic() + 20)
    try:
        await client.call(client.stub.Embed, REQUEST, timeout=3.0)
    finally:
        deadline_var.reset(token)
    remaining = served.fake.seen[-1].time_remaining
    # The server reads its deadline against a clock it caches per batch of work, so under load
    # it may see a few milliseconds more than was sent; what matters is 3 s, not the inbound 20 s.
    assert remaining is not None and remaining <= 3.0 + 0.25


def test_remaining_budget() -> None:
    assert remaining_budget(3.0) == 3.0
    token = deadline_var.set(time.monotonic() + 1.0)
    try:
        assert 0.9 < remaining_budget(3.0) < 1.0
        assert 0.9 < remaining_budget(None) < 1.0
        assert remaining_budget(0.2) == 0.2
    finally:
        deadline_var.reset(token)


async def test_slow_downstream_fails_with_deadline_within_the_budget(start_fake: Any, connect: Any) -> None:
    served = await start_fake()

    async def slow(request: Any, context: Any) -> Any:
        await asyncio.sleep(2.0)
        return embedder_pb2.EmbedResponse()

    served.fake.behavior = slow
    client = connect(served.address, ClientPolicy(timeout_s=30.0, retry_backoff_s=0.01))
    started = time.monotonic()
    token = deadline_var.set(started + 0.3)
    try:
        with pytest.raises(DownstreamError) as exc:
            await client.call(client.stub.Embed, REQUEST, idempotent=True)
    finally:
        deadline_var.reset(token)
    assert exc.value.reason == "deadline"
    assert exc.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 0.5
    assert served.fake.calls == 1


async def test_expired_inbound_deadline_fails_without_calling(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    client = connect(served.address)
    token = deadline_var.set(time.monotonic() - 0.01)
    try:
        with pytest.raises(DownstreamError) as exc:
            await client.call(client.stub.Embed, REQUEST, idempotent=True)
    finally:
        deadline_var.reset(token)
    assert exc.value.reason == "deadline"
    assert served.fake.calls == 0


async def test_retries_stop_at_the_deadline(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    served.fake.behavior = always(down)
    policy = ClientPolicy(timeout_s=0.3, retry_attempts=1000, retry_backoff_s=0.05, breaker_fail_max=10**6)
    client = connect(served.address, policy)
    started = time.monotonic()
    with pytest.raises(DownstreamError) as exc:
        await client.call(client.stub.Embed, REQUEST, idempotent=True)
    assert exc.value.reason in ("unavailable", "deadline")
    assert time.monotonic() - started < 0.6


async def test_two_hops_share_request_id_and_deadline(start_fake: Any, connect: Any) -> None:
    """client -> A -> B: A's handler calls B through Downstream, as services do."""
    b = await start_fake()
    to_b = connect(b.address, ClientPolicy(timeout_s=30.0))

    async def forward(request: embedder_pb2.EmbedRequest, context: Any) -> embedder_pb2.EmbedResponse:
        reply = await to_b.call(to_b.stub.Embed, request, idempotent=True)
        return embedder_pb2.EmbedResponse(model=f"via-a:{reply.model}:{current_request_id()}")

    a = await start_fake()
    a.fake.behavior = forward
    to_a = connect(a.address)
    token = request_id_var.set("rid-two-hops")
    try:
        # The grpc-timeout header rounds up (1 ms steps under 1 s, 10 ms under 10 s): the
        # client's margin must cover that for B's deadline to stay inside A's.
        reply = await to_a.call(to_a.stub.Embed, REQUEST, timeout=0.9)
    finally:
        request_id_var.reset(token)
    assert reply.model == "via-a:q:rid-two-hops"
    seen_a, seen_b = a.fake.seen[-1], b.fake.seen[-1]
    assert seen_a.request_id == seen_b.request_id == "rid-two-hops"
    assert seen_a.deadline is not None and seen_b.deadline is not None
    assert seen_b.deadline <= seen_a.deadline
    assert seen_b.time_remaining is not None and seen_b.time_remaining <= 0.9


async def test_two_hops_slow_leaf_surfaces_within_the_callers_budget(start_fake: Any, connect: Any) -> None:
    b = await start_fake()

    async def slow(request: Any, context: Any) -> Any:
        await asyncio.sleep(2.0)
        return embedder_pb2.EmbedResponse()

    b.fake.behavior = slow
    to_b = connect(b.address, ClientPolicy(timeout_s=30.0))
    reasons: list[str] = []
    time_left_in_a: list[float] = []

    async def forward(request: embedder_pb2.EmbedRequest, context: Any) -> embedder_pb2.EmbedResponse:
        try:
            await to_b.call(to_b.stub.Embed, request, idempotent=True)
        except DownstreamError as exc:
            reasons.append(exc.reason)
            time_left_in_a.append((deadline_var.get() or 0.0) - time.monotonic())
            return embedder_pb2.EmbedResponse(model="degraded")
        return embedder_pb2.EmbedResponse(model="full")

    a = await start_fake()
    a.fake.behavior = forward
    to_a = connect(a.address)
    started = time.monotonic()
    reply = await to_a.call(to_a.stub.Embed, REQUEST, timeout=0.4)
    # A answers (degraded) before its own deadline because B's call was cut to it.
    assert reply.model == "degraded"
    assert reasons == ["deadline"]
    # B's failure reached A with time to spare for A's own answer.
    assert time_left_in_a[0] > 0
    assert time.monotonic() - started < 0.6


async def test_request_id_is_sent_even_without_inbound_one(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    client = connect(served.address)
    assert current_request_id() == ""
    await client.call(client.stub.Embed, REQUEST)
    assert served.fake.seen[-1].request_id


async def test_unreachable_downstream_is_unavailable(connect: Any) -> None:
    port = free_port()
    client = connect(f"127.0.0.1:{port}", ClientPolicy(timeout_s=1.0, retry_backoff_s=0.01))
    with pytest.raises(DownstreamError) as exc:
        await client.call(client.stub.Embed, REQUEST, idempotent=True)
    assert exc.value.reason in ("unavailable", "deadline")
    # The message can reach the gateway's callers: it says what happened, not where.
    assert exc.value.message in ("could not reach the service", "no answer before the deadline")
    assert str(port) not in str(exc.value)


async def test_a_downstream_handlers_own_message_is_kept(start_fake: Any, connect: Any) -> None:
    served = await start_fake()
    served.fake.behavior = always(down)
    client = connect(served.address, ClientPolicy(retry_attempts=1))
    with pytest.raises(DownstreamError) as exc:
        await client.call(client.stub.Embed, REQUEST)
    assert (exc.value.reason, exc.value.message) == ("unavailable", "downstream warming up")


async def test_check_health_on_a_dead_port_is_unreachable() -> None:
    assert await check_health(f"127.0.0.1:{free_port()}", timeout=0.5) == "UNREACHABLE"


async def test_check_health_of_a_live_service(start_fake: Any) -> None:
    served = await start_fake()
    assert await check_health(served.address, "ragmesh.embedder.v1.EmbedderService") == "SERVING"


def test_request_id_header_name() -> None:
    # Every hop (and grpcurl users) rely on this exact, lowercase key.
    assert REQUEST_ID_HEADER == "x-request-id"
