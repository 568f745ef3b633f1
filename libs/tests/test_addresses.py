"""Replicas of a stage behind one Downstream: address settings turned into gRPC targets, and
calls spread round-robin over two real servers, going on when one of them stops."""

from __future__ import annotations

import pytest

from meshkit.rpc.addresses import grpc_target
from meshkit.rpc.client import ClientPolicy, Downstream
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc

from .conftest import StartFake, unique_name


@pytest.mark.parametrize(
    ("address", "target"),
    [
        ("127.0.0.1:5001", "127.0.0.1:5001"),
        (" reranker:50057 ", "reranker:50057"),
        ("127.0.0.1:5001,127.0.0.1:5002", "ipv4:127.0.0.1:5001,127.0.0.1:5002"),
        ("127.0.0.1:5001, 127.0.0.1:5002,", "ipv4:127.0.0.1:5001,127.0.0.1:5002"),
        ("[::1]:5001,[::1]:5002", "ipv6:[::1]:5001,[::1]:5002"),
        ("dns:///reranker-headless:50057", "dns:///reranker-headless:50057"),
        ("ipv4:10.0.0.1:1,10.0.0.2:1", "ipv4:10.0.0.1:1,10.0.0.2:1"),
        ("unix:/tmp/reranker.sock", "unix:/tmp/reranker.sock"),
    ],
)
def test_grpc_target(address: str, target: str) -> None:
    assert grpc_target(address) == target


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("", "empty address"),
        (" , ", "empty address"),
        ("127.0.0.1", "not host:port"),
        ("127.0.0.1:50x", "not host:port"),
        ("a:1,b:2", "one DNS name"),
        ("127.0.0.1:1,[::1]:2", "one family"),
    ],
)
def test_grpc_target_refuses(address: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        grpc_target(address)


def test_index_shards_take_replicas_separated_by_bars() -> None:
    settings = MeshSettings(index_addresses="127.0.0.1:1|127.0.0.1:2, 127.0.0.1:3,dns:///shard-2:50052")
    assert settings.index_address_list() == ["127.0.0.1:1,127.0.0.1:2", "127.0.0.1:3", "dns:///shard-2:50052"]
    assert grpc_target(settings.index_address_list()[0]) == "ipv4:127.0.0.1:1,127.0.0.1:2"


async def test_calls_spread_over_replicas_and_survive_one_stopping(start_fake: StartFake) -> None:
    first, second = await start_fake(), await start_fake()
    policy = ClientPolicy(timeout_s=2.0, retry_attempts=3, retry_backoff_s=0.01, breaker_fail_max=50)
    client = Downstream(
        unique_name("replicas"),
        f"{first.address},{second.address}",
        embedder_pb2_grpc.EmbedderServiceStub,
        policy,
    )
    request = embedder_pb2.EmbedRequest(texts=["q"])
    try:
        # The channel is ready with one connection up; the other may follow a moment later.
        for _ in range(200):
            await client.call(client.stub.Embed, request, idempotent=True)
            if first.fake.calls and second.fake.calls:
                break
        before = first.fake.calls, second.fake.calls
        for _ in range(40):
            await client.call(client.stub.Embed, request, idempotent=True)
        # Round-robin over both: each gets every other call.
        assert first.fake.calls - before[0] == 20 and second.fake.calls - before[1] == 20

        await first.running.stop(0)
        stopped_at, second_at = first.fake.calls, second.fake.calls
        for _ in range(20):
            reply = await client.call(client.stub.Embed, request, idempotent=True)
            assert reply.model == "q"
        assert first.fake.calls == stopped_at
        assert second.fake.calls == second_at + 20
    finally:
        await client.close()
