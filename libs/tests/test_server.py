"""The server bootstrap and interceptor, through real channels to a real grpc.aio server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from meshkit.core.errors import (
    ServiceError,
    failed_precondition,
    invalid_argument,
    not_found,
    resource_exhausted,
)
from meshkit.core.logs import REQUEST_ID_HEADER
from meshkit.rpc.client import check_health
from meshkit.rpc.server import request_limit
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc

EMBEDDER_SERVICE = "ragmesh.embedder.v1.EmbedderService"
REQUEST = embedder_pb2.EmbedRequest(texts=["hello", "world"])


def stub_for(served: Any) -> tuple[aio.Channel, embedder_pb2_grpc.EmbedderServiceStub]:
    channel = aio.insecure_channel(served.address)
    return channel, embedder_pb2_grpc.EmbedderServiceStub(channel)


def trailer(metadata: Any, key: str) -> str | None:
    for k, v in metadata or ():
        if k == key:
            return str(v)
    return None


async def test_handler_runs_and_replies(start_fake: Any) -> None:
    served = await start_fake()
    async with aio.insecure_channel(served.address) as channel:
        reply = await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(REQUEST, timeout=5)
    assert reply.model == "hello|world"
    assert served.fake.calls == 1


async def test_unimplemented_method_is_unimplemented_not_internal(start_fake: Any) -> None:
    served = await start_fake()  # the fake implements Embed only
    async with aio.insecure_channel(served.address) as channel:
        with pytest.raises(aio.AioRpcError) as err:
            await embedder_pb2_grpc.EmbedderServiceStub(channel).GetModelInfo(
                embedder_pb2.GetModelInfoRequest(), timeout=5
            )
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_client_request_id_reaches_handler_and_comes_back(start_fake: Any) -> None:
    served = await start_fake()
    async with aio.insecure_channel(served.address) as channel:
        call = embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(
            REQUEST, timeout=5, metadata=((REQUEST_ID_HEADER, "rid-from-client"),)
        )
        await call
        trailing = await call.trailing_metadata()
    assert served.fake.seen[-1].request_id == "rid-from-client"
    assert trailer(trailing, REQUEST_ID_HEADER) == "rid-from-client"


async def test_request_id_is_generated_when_absent(start_fake: Any) -> None:
    served = await start_fake()
    async with aio.insecure_channel(served.address) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        ids = []
        for _ in range(2):
            call = stub.Embed(REQUEST, timeout=5)
            await call
            ids.append(trailer(await call.trailing_metadata(), REQUEST_ID_HEADER))
    seen = [s.request_id for s in served.fake.seen]
    assert all(seen)
    assert ids == seen
    assert seen[0] != seen[1]


async def test_oversized_request_id_is_truncated(start_fake: Any) -> None:
    served = await start_fake()
    async with aio.insecure_channel(served.address) as channel:
        await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(
            REQUEST, timeout=5, metadata=((REQUEST_ID_HEADER, "r" * 5000),)
        )
    assert served.fake.seen[-1].request_id == "r" * 64


@pytest.mark.parametrize(
    "error",
    [
        invalid_argument("texts[0] is empty"),
        not_found("collection 'x' does not exist"),
        resource_exhausted("too many texts: 300 > 256"),
        failed_precondition("model not loaded"),
    ],
)
async def test_service_error_reaches_client_as_status(start_fake: Any, error: ServiceError) -> None:
    served = await start_fake()

    async def fail(request: Any, context: Any) -> Any:
        raise error

    served.fake.behavior = fail
    async with aio.insecure_channel(served.address) as channel:
        call = embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(
            REQUEST, timeout=5, metadata=((REQUEST_ID_HEADER, "rid-err"),)
        )
        with pytest.raises(aio.AioRpcError) as exc:
            await call
    assert exc.value.code() == error.code
    assert exc.value.details() == error.message
    # The request id also comes back on failures, so a caller can quote it.
    assert trailer(exc.value.trailing_metadata(), REQUEST_ID_HEADER) == "rid-err"


async def test_unexpected_exception_is_internal_with_request_id(start_fake: Any) -> None:
    served = await start_fake()

    async def crash(request: Any, context: Any) -> Any:
        raise KeyError("missing-thing")

    served.fake.behavior = crash
    async with aio.insecure_channel(served.address) as channel:
        with pytest.raises(aio.AioRpcError) as exc:
            await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(
                REQUEST, timeout=5, metadata=((REQUEST_ID_HEADER, "rid-crash-42"),)
            )
    assert exc.value.code() == grpc.StatusCode.INTERNAL
    assert "rid-crash-42" in (exc.value.details() or "")


async def test_internal_errors_carry_no_internals(start_fake: Any) -> None:
    served = await start_fake()

    async def crash(request: Any, context: Any) -> Any:
        raise RuntimeError("password=hunter2 at /srv/ragmesh/secret.db")

    served.fake.behavior = crash
    async with aio.insecure_channel(served.address) as channel:
        with pytest.raises(aio.AioRpcError) as exc:
            await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(
                REQUEST, timeout=5, metadata=((REQUEST_ID_HEADER, "rid-leak"),)
            )
    details = exc.value.details() or ""
    assert exc.value.code() == grpc.StatusCode.INTERNAL
    assert details == "internal error (request id rid-leak); the service logged the details under this id"
    for internal in ("hunter2", "secret.db", "RuntimeError"):
        assert internal not in details


async def test_unexpected_exception_without_client_id_names_the_generated_one(start_fake: Any) -> None:
    served = await start_fake()

    async def crash(request: Any, context: Any) -> Any:
        raise RuntimeError("boom")

    served.fake.behavior = crash
    async with aio.insecure_channel(served.address) as channel:
        with pytest.raises(aio.AioRpcError) as exc:
            await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(REQUEST, timeout=5)
    generated = served.fake.seen[-1].request_id
    assert generated
    assert generated in (exc.value.details() or "")


async def test_timeout_in_handler_becomes_deadline_exceeded(start_fake: Any) -> None:
    served = await start_fake()

    async def slow_inner(request: Any, context: Any) -> Any:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)
        raise AssertionError("unreachable")

    served.fake.behavior = slow_inner
    async with aio.insecure_channel(served.address) as channel:
        with pytest.raises(aio.AioRpcError) as exc:
            await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(REQUEST, timeout=5)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_handler_sees_the_callers_deadline(start_fake: Any) -> None:
    served = await start_fake()
    async with aio.insecure_channel(served.address) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        before = time.monotonic()
        await stub.Embed(REQUEST, timeout=10.0)
        after = time.monotonic()
        await stub.Embed(REQUEST)
    with_deadline, without_deadline = served.fake.seen
    # Loose lower bounds: on a loaded machine the call may take seconds to reach the handler.
    assert with_deadline.deadline is not None
    # The wire carries the timeout, not the instant: the server's clock reads it on arrival
    # (a little slack above the 10 s).
    assert before + 5 < with_deadline.deadline <= after + 10.5
    assert with_deadline.time_remaining is not None and 5 < with_deadline.time_remaining <= 10.5
    assert without_deadline.deadline is None


async def test_health_serving_after_start_and_gone_after_stop(start_fake: Any) -> None:
    served = await start_fake()
    assert await check_health(served.address) == "SERVING"
    assert await check_health(served.address, EMBEDDER_SERVICE) == "SERVING"
    assert await check_health(served.address, "no.such.Service") == "NOT_FOUND"
    await served.running.stop(0.5)
    assert await check_health(served.address, EMBEDDER_SERVICE, timeout=0.5) in ("NOT_SERVING", "UNREACHABLE")


async def test_health_answers_directly_on_the_grpc_health_api(start_fake: Any) -> None:
    served = await start_fake()
    async with aio.insecure_channel(served.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=EMBEDDER_SERVICE), timeout=2
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_service(start_fake: Any) -> None:
    served = await start_fake()
    async with aio.insecure_channel(served.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        names: list[str] = []
        async for reply in stub.ServerReflectionInfo(iter([request]), timeout=5):
            names.extend(s.name for s in reply.list_services_response.service)
    assert EMBEDDER_SERVICE in names
    assert "grpc.health.v1.Health" in names


async def test_graceful_stop_drains_in_flight_and_refuses_new_calls(start_fake: Any) -> None:
    served = await start_fake()
    started = asyncio.Event()

    async def slow(request: Any, context: Any) -> Any:
        started.set()
        await asyncio.sleep(0.4)
        return embedder_pb2.EmbedResponse(model="drained")

    served.fake.behavior = slow
    async with aio.insecure_channel(served.address) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        in_flight = asyncio.ensure_future(stub.Embed(REQUEST, timeout=5))
        await asyncio.wait_for(started.wait(), 5)
        stopping = asyncio.ensure_future(served.running.stop(3.0))
        await asyncio.sleep(0.05)
        assert await check_health(served.address, EMBEDDER_SERVICE, timeout=0.5) != "SERVING"
        async with aio.insecure_channel(served.address) as fresh:
            with pytest.raises(aio.AioRpcError) as refused:
                await embedder_pb2_grpc.EmbedderServiceStub(fresh).Embed(REQUEST, timeout=1)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        reply = await in_flight
        await stopping
    assert reply.model == "drained"
    assert served.fake.calls == 1


async def test_rpc_metrics_count_calls_by_code(start_fake: Any) -> None:
    served = await start_fake()
    outcomes = iter([None, None, invalid_argument("bad"), KeyError("bug")])

    async def scripted(request: Any, context: Any) -> Any:
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome
        return embedder_pb2.EmbedResponse()

    served.fake.behavior = scripted
    async with aio.insecure_channel(served.address) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        for _ in range(4):
            with contextlib.suppress(aio.AioRpcError):
                await stub.Embed(REQUEST, timeout=5)
        await check_health(served.address)

    def count(code: str) -> float:
        labels = {"service": served.name, "method": "Embed", "code": code}
        return REGISTRY.get_sample_value("ragmesh_rpc_requests_total", labels) or 0.0

    assert count("OK") == 2
    assert count("INVALID_ARGUMENT") == 1
    assert count("INTERNAL") == 1
    assert REGISTRY.get_sample_value("ragmesh_rpc_in_flight", {"service": served.name}) == 0
    assert (
        REGISTRY.get_sample_value(
            "ragmesh_rpc_latency_seconds_count", {"service": served.name, "method": "Embed"}
        )
        == 4
    )
    # Health probes are not business traffic.
    health = {"service": served.name, "method": "Check", "code": "OK"}
    assert REGISTRY.get_sample_value("ragmesh_rpc_requests_total", health) is None


def add_stream_service(server: aio.Server) -> None:
    async def count(request: bytes, context: aio.ServicerContext) -> AsyncIterator[bytes]:
        n = int(request.decode())
        for i in range(n):
            yield str(i).encode()
        if n == 2:
            raise invalid_argument("stopped after two")

    handler = grpc.method_handlers_generic_handler(
        "test.Stream", {"Count": grpc.unary_stream_rpc_method_handler(count)}
    )
    server.add_generic_rpc_handlers((handler,))


async def test_stream_handlers_are_wrapped_too(start_fake: Any) -> None:
    served = await start_fake(extra=add_stream_service)
    async with aio.insecure_channel(served.address) as channel:
        method = channel.unary_stream("/test.Stream/Count", None, None)
        items = [item async for item in method(b"3", timeout=5)]
        assert items == [b"0", b"1", b"2"]
        got: list[bytes] = []
        with pytest.raises(aio.AioRpcError) as exc:
            async for item in method(b"2", timeout=5):
                got.append(item)
    assert got == [b"0", b"1"]
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert exc.value.details() == "stopped after two"
    ok = {"service": served.name, "method": "Count", "code": "OK"}
    assert REGISTRY.get_sample_value("ragmesh_rpc_requests_total", ok) == 1


async def test_concurrent_calls_beyond_the_cap_are_refused_at_once(start_fake: Any) -> None:
    served = await start_fake(max_concurrent_rpcs=2)
    release, entered = asyncio.Event(), asyncio.Semaphore(0)

    async def held(request: Any, context: Any) -> Any:
        entered.release()
        await release.wait()
        return embedder_pb2.EmbedResponse(model="done")

    served.fake.behavior = held
    async with aio.insecure_channel(served.address) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        holding = [asyncio.ensure_future(stub.Embed(REQUEST, timeout=10)) for _ in range(2)]
        for _ in holding:
            await asyncio.wait_for(entered.acquire(), 5)
        started = time.monotonic()
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.Embed(REQUEST, timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.monotonic() - started < 2.0  # refused, not queued until a slot frees
        release.set()
        assert [r.model for r in await asyncio.gather(*holding)] == ["done", "done"]
        # Slots free again once the held calls are done.
        assert (await stub.Embed(REQUEST, timeout=10)).model == "done"


async def test_the_mesh_wide_setting_overrides_the_services_cap(start_fake: Any) -> None:
    served = await start_fake(max_concurrent_rpcs=100, max_concurrent_rpcs_setting=1)
    release, entered = asyncio.Event(), asyncio.Event()

    async def held(request: Any, context: Any) -> Any:
        entered.set()
        await release.wait()
        return embedder_pb2.EmbedResponse()

    served.fake.behavior = held
    async with aio.insecure_channel(served.address) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        first = asyncio.ensure_future(stub.Embed(REQUEST, timeout=10))
        await asyncio.wait_for(entered.wait(), 5)
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.Embed(REQUEST, timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        release.set()
        await first


async def test_a_service_accepts_no_message_beyond_its_own_limit(start_fake: Any) -> None:
    served = await start_fake(max_request_bytes=4096)
    async with aio.insecure_channel(served.address) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        assert (await stub.Embed(embedder_pb2.EmbedRequest(texts=["x" * 3000]), timeout=5)).model
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.Embed(embedder_pb2.EmbedRequest(texts=["x" * 5000]), timeout=5)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert served.fake.calls == 1


def test_request_limits_never_exceed_the_mesh_wide_one() -> None:
    settings = MeshSettings(max_message_bytes=1000)
    assert request_limit(settings, 0) == 1000
    assert request_limit(settings, 500) == 500
    assert request_limit(settings, 5000) == 1000
