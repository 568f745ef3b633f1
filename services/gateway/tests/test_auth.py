"""API keys, per-collection permissions, rate limits and the request-size limit on the real
gateway (fake downstreams), through a real channel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from meshkit.rpc.auth import digest_of
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.ingestion.v1 import ingestion_pb2
from services.gateway.servicer import ACCESS as GATEWAY_ACCESS
from services.gateway.tests.conftest import COLLECTION, Gateway, running_gateway
from services.ingestion.servicer import ACCESS as INGESTION_ACCESS

DOCS_KEY = "rmk_docs-reader-key"
LIMITED_KEY = "rmk_limited-key"
SEARCH = gateway_pb2.SearchRequest(collection=COLLECTION, query="what is a zx-81")


def bearer(key: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {key}"),)


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Gateway]:
    path = tmp_path / "keys.json"
    path.write_text(
        json.dumps(
            {
                "keys": [
                    {"name": "docs-reader", "sha256": digest_of(DOCS_KEY), "read": [COLLECTION]},
                    {
                        "name": "limited",
                        "sha256": digest_of(LIMITED_KEY),
                        "read": ["*"],
                        "rate": {"per_second": 0.5, "burst": 2},
                    },
                ]
            }
        )
    )
    async with running_gateway(api_keys_file=path, gateway_max_request_bytes=64 * 1024) as gateway:
        yield gateway


async def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code()


async def test_the_right_key_searches_its_collection(guarded: Gateway) -> None:
    reply = await guarded.stub.Search(SEARCH, metadata=bearer(DOCS_KEY), timeout=5)
    assert reply.results
    reply = await guarded.stub.Search(SEARCH, metadata=(("x-api-key", DOCS_KEY),), timeout=5)
    assert reply.results


async def test_missing_or_wrong_keys_are_unauthenticated(guarded: Gateway) -> None:
    for metadata in ((), bearer("rmk_not-a-key"), (("authorization", "Basic abc"),)):
        with pytest.raises(aio.AioRpcError) as err:
            await guarded.stub.Search(SEARCH, metadata=metadata, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "rmk_not-a-key" not in (err.value.details() or "")
    # Nothing reached the downstreams.
    assert not guarded.fakes.calls


async def test_a_foreign_collection_is_permission_denied(guarded: Gateway) -> None:
    foreign = gateway_pb2.SearchRequest(collection="hr", query="salaries")
    with pytest.raises(aio.AioRpcError) as err:
        await guarded.stub.Search(foreign, metadata=bearer(DOCS_KEY), timeout=5)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'docs-reader'" in (err.value.details() or "") and "'hr'" in (err.value.details() or "")
    ask = gateway_pb2.AskRequest(collection="hr", query="salaries")
    assert await code_of(guarded.stub.Ask(ask, metadata=bearer(DOCS_KEY), timeout=5)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    stream = guarded.stub.AskStream(
        gateway_pb2.AskStreamRequest(request=ask), metadata=bearer(DOCS_KEY), timeout=5
    )
    with pytest.raises(aio.AioRpcError) as err:
        async for _ in stream:
            pass
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_over_the_rate_is_resource_exhausted(guarded: Gateway) -> None:
    for _ in range(2):
        await guarded.stub.Search(SEARCH, metadata=bearer(LIMITED_KEY), timeout=5)
    with pytest.raises(aio.AioRpcError) as err:
        await guarded.stub.Search(SEARCH, metadata=bearer(LIMITED_KEY), timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry in" in (err.value.details() or "")
    # Another key is not slowed down by it.
    await guarded.stub.Search(SEARCH, metadata=bearer(DOCS_KEY), timeout=5)


async def test_health_and_reflection_stay_open(guarded: Gateway) -> None:
    reply = await health_pb2_grpc.HealthStub(guarded.channel).Check(
        health_pb2.HealthCheckRequest(), timeout=5
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(guarded.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    names = [
        service.name
        async for answer in reflection.ServerReflectionInfo(iter([request]), timeout=5)
        for service in answer.list_services_response.service
    ]
    assert "ragmesh.gateway.v1.GatewayService" in names


async def test_oversized_requests_are_refused_before_parsing(guarded: Gateway) -> None:
    big = gateway_pb2.SearchRequest(collection=COLLECTION, query="q", doc_ids=["d" * 200] * 400)
    assert big.ByteSize() > guarded.settings.gateway_max_request_bytes
    assert await code_of(guarded.stub.Search(big, metadata=bearer(DOCS_KEY), timeout=5)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )


def test_every_public_method_has_an_access_rule() -> None:
    gateway = gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"]
    ingestion = ingestion_pb2.DESCRIPTOR.services_by_name["IngestionService"]
    assert set(GATEWAY_ACCESS) == {m.name for m in gateway.methods}
    assert set(INGESTION_ACCESS) == {m.name for m in ingestion.methods}
    writes = {name for name, rule in INGESTION_ACCESS.items() if rule.action == "write"}
    assert writes == {
        "IngestDocuments",
        "DeleteDocuments",
        "ReplayDeadLetters",
        "ReindexCollection",
        "SetCollectionCalibration",
    }
    stream_request = gateway_pb2.AskStreamRequest(request=gateway_pb2.AskRequest(collection="c1"))
    assert GATEWAY_ACCESS["AskStream"].collection is not None
    assert GATEWAY_ACCESS["AskStream"].collection(stream_request) == "c1"
