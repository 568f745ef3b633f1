"""Balancing a replica list by calls in flight (meshkit.rpc.balancer): the picking rules on fake
channels with a fake clock, then Downstream over real servers on 127.0.0.1:0 (a slow replica gets
fewer calls, a failing one is ejected until probed back, retries move to another replica)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest
from grpc import aio
from prometheus_client import REGISTRY

from meshkit.core.errors import unavailable
from meshkit.rpc.balancer import Balancer, BalancerConfig, Replica
from meshkit.rpc.client import ClientPolicy, Downstream, DownstreamError
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc

from .conftest import StartFake, unique_name

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
READY = grpc.ChannelConnectivity.READY
REQUEST = embedder_pb2.EmbedRequest(texts=["q"])
CONFIG = BalancerConfig(base_ejection_s=1.0, max_ejection_s=8.0)


class FakeChannel:
    def __init__(self) -> None:
        self.state = READY
        self.kicked = 0

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        self.kicked += int(try_to_connect)
        return self.state


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def balancer(n: int, config: BalancerConfig = CONFIG) -> tuple[Balancer, list[Replica], Clock]:
    target = unique_name("balance")
    replicas = [Replica(target, i, f"127.0.0.1:{5000 + i}", FakeChannel(), None) for i in range(n)]
    clock = Clock()
    return Balancer(target, replicas, config, clock), replicas, clock


def call(b: Balancer, code: grpc.StatusCode = OK, latency: float = 0.01) -> Replica:
    """One whole call: picked, started, finished."""
    replica = b.pick()
    b.started(replica)
    b.finished(replica, code, latency)
    return replica


def sample(name: str, target: str, replica: Replica, **labels: str) -> float:
    found = REGISTRY.get_sample_value(name, {"target": target, "replica": replica.address, **labels})
    return found or 0.0


# ---------------------------------------------------------------------------- picking


def test_the_replica_with_fewest_calls_in_flight_is_picked() -> None:
    b, (r0, r1, r2), _ = balancer(3)
    for replica in (r0, r0, r1):
        b.started(replica)
    assert b.pick() is r2
    b.started(r2)
    b.started(r2)
    assert b.pick() is r1  # 1 in flight against 2 and 2
    b.finished(r0, OK, 0.01)
    b.finished(r0, OK, 0.01)
    assert b.pick() is r0


def test_ties_are_taken_in_turn() -> None:
    b, replicas, _ = balancer(3)
    assert [call(b).index for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    # Among the least loaded only: a busy replica is passed over, the turn goes on.
    b.started(replicas[1])
    assert [call(b).index for _ in range(4)] == [2, 0, 2, 0]


def test_a_replica_whose_channel_is_down_is_skipped_and_asked_to_reconnect() -> None:
    b, (r0, r1), _ = balancer(2)
    r0.channel.state = grpc.ChannelConnectivity.TRANSIENT_FAILURE
    assert {call(b).index for _ in range(6)} == {1}
    assert r0.channel.kicked >= 6
    # Not ready yet (connecting) while another is: still skipped; ready again: back in turn.
    r0.channel.state = grpc.ChannelConnectivity.CONNECTING
    assert call(b) is r1
    r0.channel.state = READY
    assert {call(b).index for _ in range(4)} == {0, 1}


def test_with_no_replica_ready_connecting_ones_are_used_then_any() -> None:
    b, (r0, r1), _ = balancer(2)
    r0.channel.state = grpc.ChannelConnectivity.TRANSIENT_FAILURE
    r1.channel.state = grpc.ChannelConnectivity.IDLE
    assert call(b) is r1
    r1.channel.state = grpc.ChannelConnectivity.TRANSIENT_FAILURE
    assert {call(b).index for _ in range(4)} == {0, 1}  # every replica down: the call fails fast


def test_a_retry_goes_to_a_replica_not_tried_yet() -> None:
    b, (r0, r1, r2), _ = balancer(3)
    b.started(r1)
    b.started(r1)
    assert b.pick(tried=[r0]) is r2
    assert b.pick(tried=[r0, r2]) is r1  # busier, but not tried
    assert b.pick(tried=[r0, r1, r2]) in (r0, r2)  # all tried: the least loaded again
    r2.channel.state = grpc.ChannelConnectivity.TRANSIENT_FAILURE
    assert b.pick(tried=[r0, r1]) is r0  # a tried replica that works before an untried one that is down


def test_a_slow_replica_that_answers_is_picked_before_a_dead_one() -> None:
    b, (slow, dead), clock = balancer(2)
    for _ in range(CONFIG.min_samples):
        call_on(b, dead, OK, 0.01)
        call_on(b, slow, OK, 0.5)
    assert slow.state == "ejected" and slow.ejected_for == "latency"
    dead.channel.state = grpc.ChannelConnectivity.TRANSIENT_FAILURE
    # The only replica taking calls is down: the slow one, connected, answers instead.
    assert b.pick() is slow
    assert b.others_ready(dead) and not b.others_ready(slow)
    # One ejected for failing is no stand-in.
    clock.now += CONFIG.max_ejection_s + 1
    b.pick()
    for _ in range(CONFIG.eject_after_failures):
        call_on(b, slow, UNAVAILABLE)
    assert slow.ejected_for == "failures" and not b.others_ready(dead)


def call_on(b: Balancer, replica: Replica, code: grpc.StatusCode, latency: float = 0.01) -> None:
    b.started(replica)
    b.finished(replica, code, latency)


# ---------------------------------------------------------------------------- ejection


def test_consecutive_failures_eject_a_replica_until_its_probe_answers() -> None:
    b, (r0, _r1, _r2), clock = balancer(3)
    b.started(r0)
    b.finished(r0, UNAVAILABLE, 0.001)
    b.started(r0)
    b.finished(r0, OK, 0.01)  # a success in between: failures must be in a row
    for _ in range(CONFIG.eject_after_failures):
        b.started(r0)
        b.finished(r0, UNAVAILABLE, 0.001)
    assert r0.state == "ejected"
    assert sample("ragmesh_client_replica_ejected", b.target, r0) == 1
    assert sample("ragmesh_client_replica_ejections_total", b.target, r0, reason="failures") == 1
    assert {call(b).index for _ in range(20)} == {1, 2}
    clock.now += CONFIG.base_ejection_s
    probe = b.pick()
    assert probe is r0 and r0.state == "probing"
    b.started(r0)
    # One probe at a time: while it is out, the others take the calls.
    assert {call(b).index for _ in range(6)} == {1, 2}
    b.finished(r0, OK, 0.01)
    assert r0.state == "healthy"
    assert sample("ragmesh_client_replica_ejected", b.target, r0) == 0
    assert 0 in {call(b).index for _ in range(3)}


def test_a_failed_probe_ejects_again_for_longer() -> None:
    b, (r0, _r1, _r2), clock = balancer(3)
    for _ in range(CONFIG.eject_after_failures):
        b.started(r0)
        b.finished(r0, grpc.StatusCode.DEADLINE_EXCEEDED, 1.0)
    clock.now += CONFIG.base_ejection_s
    assert b.pick() is r0
    b.started(r0)
    b.finished(r0, UNAVAILABLE, 0.001)  # one failure is enough on probation
    assert r0.state == "ejected"
    assert r0.ejected_until == pytest.approx(clock.now + 2 * CONFIG.base_ejection_s)
    clock.now += CONFIG.base_ejection_s
    assert 0 not in {call(b).index for _ in range(6)}
    clock.now += CONFIG.base_ejection_s
    assert b.pick() is r0


def test_a_replica_far_slower_than_the_others_is_ejected() -> None:
    b, (r0, r1, r2), clock = balancer(3)
    for _ in range(CONFIG.min_samples):
        for replica, latency in ((r0, 0.5), (r1, 0.02), (r2, 0.03)):
            b.started(replica)
            b.finished(replica, OK, latency)
    assert r0.state == "ejected"
    assert (r1.state, r2.state) == ("healthy", "healthy")
    assert sample("ragmesh_client_replica_ejections_total", b.target, r0, reason="latency") == 1
    # Probed back: a probe still far slower ejects it again; one in line brings it back.
    clock.now += CONFIG.base_ejection_s
    assert b.pick(tried=[r1, r2]) is r0
    b.started(r0)
    b.finished(r0, OK, 0.4)
    assert r0.state == "ejected"
    clock.now += 2 * CONFIG.base_ejection_s
    assert b.pick(tried=[r1, r2]) is r0
    b.started(r0)
    b.finished(r0, OK, 0.04)
    assert r0.state == "healthy"


def test_small_latency_differences_eject_nobody() -> None:
    b, replicas, _ = balancer(2)
    for _ in range(20):
        for replica, latency in zip(replicas, (0.004, 0.001), strict=True):
            b.started(replica)
            b.finished(replica, OK, latency)  # 4x, but only 3 ms apart
    assert [r.state for r in replicas] == ["healthy", "healthy"]


def test_at_most_half_of_the_replicas_are_ejected() -> None:
    b, replicas, _ = balancer(2)
    for _ in range(10):
        for replica in replicas:
            b.started(replica)
            b.finished(replica, UNAVAILABLE, 0.001)
    assert sorted(r.state for r in replicas) == ["ejected", "healthy"]
    b4, replicas4, _ = balancer(4)
    for _ in range(10):
        for replica in replicas4:
            b4.started(replica)
            b4.finished(replica, UNAVAILABLE, 0.001)
    assert sorted(r.state for r in replicas4) == ["ejected", "ejected", "healthy", "healthy"]


def test_refusals_of_the_request_do_not_count_against_a_replica() -> None:
    b, (r0, _r1), _ = balancer(2)
    for _ in range(10):
        b.started(r0)
        b.finished(r0, grpc.StatusCode.INVALID_ARGUMENT, 0.001)
    assert r0.state == "healthy" and r0.in_flight == 0


def test_a_cancelled_probe_leaves_the_replica_on_probation() -> None:
    b, (r0, r1), clock = balancer(2)
    for _ in range(CONFIG.eject_after_failures):
        b.started(r0)
        b.finished(r0, UNAVAILABLE, 0.001)
    clock.now += CONFIG.base_ejection_s
    assert b.pick(tried=[r1]) is r0
    b.started(r0)
    b.finished(r0, grpc.StatusCode.CANCELLED, None)
    assert r0.state == "probing"
    b.started(r0)
    b.finished(r0, grpc.StatusCode.NOT_FOUND, 0.01)  # answered: back
    assert r0.state == "healthy"


# ---------------------------------------------------------------------------- real servers


def sleeping(seconds: float, error: bool = False) -> Any:
    async def behavior(request: embedder_pb2.EmbedRequest, context: Any) -> embedder_pb2.EmbedResponse:
        await asyncio.sleep(seconds)
        if error:
            raise unavailable("replica unwell")
        return embedder_pb2.EmbedResponse(model="ok")

    return behavior


async def connected(client: Downstream[Any]) -> None:
    """Until every replica's channel is READY."""
    assert client.balancer is not None
    for _ in range(200):
        if all(r.connectivity() == READY for r in client.balancer.replicas):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the replicas' channels did not connect")


def client_of(*addresses: str, policy: ClientPolicy | None = None) -> Downstream[Any]:
    policy = policy or ClientPolicy(
        timeout_s=5.0, retry_attempts=3, retry_backoff_s=0.01, breaker_fail_max=100
    )
    return Downstream(
        unique_name("replicas"), ",".join(addresses), embedder_pb2_grpc.EmbedderServiceStub, policy
    )


async def test_only_a_list_of_ip_literals_is_balanced_by_the_client() -> None:
    stub = embedder_pb2_grpc.EmbedderServiceStub
    clients = [
        Downstream("one", "127.0.0.1:5001", stub),
        Downstream("name", "reranker:50057", stub),
        Downstream("dns", "dns:///reranker-headless:50057", stub),
        Downstream("explicit", "ipv4:127.0.0.1:5001,127.0.0.1:5002", stub),
        Downstream("list", "127.0.0.1:5001, 127.0.0.1:5002", stub),
    ]
    try:
        assert [c.balancer is None for c in clients] == [True, True, True, True, False]
        balanced = clients[-1].balancer
        assert balanced is not None
        assert [r.address for r in balanced.replicas] == ["127.0.0.1:5001", "127.0.0.1:5002"]
    finally:
        for c in clients:
            await c.close()


async def test_a_slow_replica_gets_fewer_calls(start_fake: StartFake) -> None:
    fast_a, fast_b, slow = await start_fake(), await start_fake(), await start_fake()
    fast_a.fake.behavior = fast_b.fake.behavior = sleeping(0.005)
    slow.fake.behavior = sleeping(0.2)
    client = client_of(fast_a.address, fast_b.address, slow.address)
    try:

        async def worker() -> None:
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                await client.call(client.stub.Embed, REQUEST, idempotent=True)

        await asyncio.gather(*(worker() for _ in range(6)))
    finally:
        await client.close()
    fast = min(fast_a.fake.calls, fast_b.fake.calls)
    # Round-robin would give it a third; it gets a small fraction of what a fast one gets.
    assert slow.fake.calls * 5 < fast, (fast_a.fake.calls, fast_b.fake.calls, slow.fake.calls)
    balancer = client.balancer
    assert balancer is not None
    assert all(r.in_flight == 0 for r in balancer.replicas)
    for replica in balancer.replicas:
        assert sample("ragmesh_client_replica_in_flight", client.target, replica) == 0


async def test_retries_move_to_another_replica(start_fake: StartFake) -> None:
    bad, good = await start_fake(), await start_fake()
    bad.fake.behavior = sleeping(0.0, error=True)
    client = client_of(bad.address, good.address)
    try:
        for _ in range(6):
            before = bad.fake.calls
            reply = await client.call(client.stub.Embed, REQUEST, idempotent=True)
            assert reply.model == "q"
            assert bad.fake.calls - before <= 1  # never the same replica twice in one call
        assert good.fake.calls == 6
        # A call that is not idempotent gets one attempt, on the replica picked.
        balancer = client.balancer
        assert balancer is not None
        assert balancer.replicas[0].state == "ejected"
    finally:
        await client.close()


async def test_an_ejected_replica_gets_no_calls_until_probed_back(start_fake: StartFake) -> None:
    flaky, steady = await start_fake(), await start_fake()
    flaky.fake.behavior = sleeping(0.0, error=True)
    policy = ClientPolicy(
        timeout_s=5.0,
        retry_attempts=3,
        retry_backoff_s=0.01,
        breaker_fail_max=100,
        balancing=BalancerConfig(base_ejection_s=0.6),
    )
    client = client_of(flaky.address, steady.address, policy=policy)
    try:
        while flaky.fake.calls < BalancerConfig().eject_after_failures:
            await client.call(client.stub.Embed, REQUEST, idempotent=True)
        ejected_at = flaky.fake.calls
        flaky.fake.behavior = None  # healthy again, but nobody knows yet
        started = time.monotonic()
        while time.monotonic() - started < 0.4:
            await client.call(client.stub.Embed, REQUEST, idempotent=True)
        assert flaky.fake.calls == ejected_at
        await asyncio.sleep(0.3)
        for _ in range(10):
            await client.call(client.stub.Embed, REQUEST, idempotent=True)
        # Probed, answered, back in turn: about half of the calls.
        assert flaky.fake.calls - ejected_at >= 4
    finally:
        await client.close()


async def test_a_callable_that_is_no_stub_method_is_sent_as_given(start_fake: StartFake) -> None:
    served = await start_fake()
    client = client_of(served.address, served.address)

    async def method(request: Any, timeout: float, metadata: Any) -> str:
        return "as given"

    try:
        assert await client.call(method, REQUEST) == "as given"
        assert served.fake.calls == 0
    finally:
        await client.close()


class Deltas(narrator_pb2_grpc.NarratorServiceServicer):
    def __init__(self) -> None:
        self.streams = 0

    async def NarrateStream(self, request: Any, context: aio.ServicerContext) -> Any:
        self.streams += 1
        for word in ("one", "two"):
            await asyncio.sleep(0.05)
            yield narrator_pb2.NarrateStreamResponse(delta=word)


async def test_streams_are_spread_by_streams_open(start_fake: StartFake) -> None:
    servicers = [Deltas(), Deltas()]
    served = [
        await start_fake(
            name=unique_name("narrator"),
            extra=lambda server, s=s: narrator_pb2_grpc.add_NarratorServiceServicer_to_server(s, server),
        )
        for s in servicers
    ]
    client = Downstream(
        unique_name("narrators"),
        ",".join(s.address for s in served),
        narrator_pb2_grpc.NarratorServiceStub,
        ClientPolicy(timeout_s=5.0),
    )
    request = narrator_pb2.NarrateStreamRequest(request=narrator_pb2.NarrateRequest(query="q"))

    async def read() -> list[str]:
        return [m.delta async for m in client.stream(client.stub.NarrateStream, request)]

    try:
        await connected(client)
        assert await asyncio.gather(*(read() for _ in range(6))) == [["one", "two"]] * 6
        assert [s.streams for s in servicers] == [3, 3]
        stream = client.stream(client.stub.NarrateStream, request)
        assert (await anext(stream)).delta == "one"
        await stream.aclose()  # closed early: no longer in flight
        balancer = client.balancer
        assert balancer is not None
        assert [r.in_flight for r in balancer.replicas] == [0, 0]
    finally:
        await client.close()


async def test_one_failing_replica_does_not_open_the_tiers_breaker(start_fake: StartFake) -> None:
    bad, good = await start_fake(), await start_fake()
    # As when a replica is killed: the calls in flight on it all fail together.
    bad.fake.behavior = sleeping(0.05, error=True)
    good.fake.behavior = sleeping(0.1)
    policy = ClientPolicy(timeout_s=5.0, retry_attempts=1, retry_backoff_s=0.01, breaker_fail_max=2)
    client = client_of(bad.address, good.address, policy=policy)
    try:
        await connected(client)
        outcomes = await asyncio.gather(
            *(client.call(client.stub.Embed, REQUEST) for _ in range(8)), return_exceptions=True
        )
        failures = [o for o in outcomes if isinstance(o, DownstreamError)]
        assert len(failures) >= 2, outcomes
        assert {f.reason for f in failures} == {"unavailable"}  # the replica's answer
        assert client.breaker_state == "closed"
        # Once no other replica is ready, failures count again: the breaker opens.
        good.fake.behavior = sleeping(0.0, error=True)
        reasons = set()
        for _ in range(8):
            with pytest.raises(DownstreamError) as raised:
                await client.call(client.stub.Embed, REQUEST)
            reasons.add(raised.value.reason)
        assert "breaker_open" in reasons
    finally:
        await client.close()
