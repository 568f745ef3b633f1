"""Requests that do not decode, through real channels to a real grpc.aio server started as the
services start (meshkit.rpc.server): INVALID_ARGUMENT in our words, never grpc's UNKNOWN with a
Python class name, for business methods (unary and streamed answers), health and reflection."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message as protobuf_message
from grpc import aio
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from meshkit.core.logs import REQUEST_ID_HEADER, request_id_var
from meshkit.rpc.auth import READ, Rule, digest_of, new_api_key
from meshkit.rpc.decoding import Undecodable, decode_problem, message_type_of, safe_deserializer
from ragmesh.embedder.v1 import embedder_pb2
from ragmesh_cli.procutil import free_ports

from .conftest import StartFake

EMBED = "/ragmesh.embedder.v1.EmbedderService/Embed"
STREAM = "/test.Streams/Count"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
# Field 1 of EmbedRequest (repeated string texts), two bytes that are no UTF-8.
BAD_UTF8 = b"\x0a\x02\xff\xfe"
# Field 1 announces 80 bytes and two follow.
TRUNCATED = b"\x0a\x50ab"
UTF8_PROBLEM = "a string field holds invalid UTF-8"
MALFORMED = "the message is malformed"
# What grpc's own answer to a deserializer's exception carried: none of it may reach a caller.
INTERNALS = ("DecodeError", "<class", "Unexpected", "Error parsing", "google.protobuf", "ragmesh.embedder")


def add_count_service(server: aio.Server) -> None:
    """A server-streaming method with a protobuf request (EmbedRequest: one answer per text)."""

    async def count(request: embedder_pb2.EmbedRequest, context: aio.ServicerContext) -> AsyncIterator[Any]:
        for text in request.texts:
            yield embedder_pb2.EmbedResponse(model=text)

    handler = grpc.method_handlers_generic_handler(
        "test.Streams",
        {
            "Count": grpc.unary_stream_rpc_method_handler(
                count,
                request_deserializer=embedder_pb2.EmbedRequest.FromString,
                response_serializer=embedder_pb2.EmbedResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))


def assert_ours(exc: aio.AioRpcError, message_type: str, problem: str) -> None:
    details = exc.details() or ""
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), details)
    assert details == f"the request is not a valid {message_type} message: {problem}"
    for internal in INTERNALS:
        assert internal not in details


async def raw_unary(address: str, path: str, payload: bytes, **kwargs: Any) -> Any:
    async with aio.insecure_channel(address) as channel:
        return await channel.unary_unary(path, None, None)(payload, timeout=5, **kwargs)


async def raw_stream(address: str, path: str, payload: bytes) -> list[bytes]:
    async with aio.insecure_channel(address) as channel:
        return [item async for item in channel.unary_stream(path, None, None)(payload, timeout=5)]


def count(name: str, method: str, code: str) -> float:
    labels = {"service": name, "method": method, "code": code}
    return REGISTRY.get_sample_value("ragmesh_rpc_requests_total", labels) or 0.0


# --- unit: the deserializer wrapper ---------------------------------------------------------


def test_the_wrapped_deserializer_returns_a_marker_in_our_words() -> None:
    deserialize = safe_deserializer(embedder_pb2.EmbedRequest.FromString, "Embed")
    assert deserialize is not None
    assert deserialize(embedder_pb2.EmbedRequest(texts=["a"]).SerializeToString()).texts == ["a"]
    marker = deserialize(BAD_UTF8)
    assert isinstance(marker, Undecodable)
    assert marker.caller_message == f"the request is not a valid EmbedRequest message: {UTF8_PROBLEM}"
    # The parser's own words are kept, for the log.
    assert "DecodeError" in marker.detail
    assert decode_problem(protobuf_message.DecodeError("Wire format was corrupt")) == MALFORMED
    assert decode_problem(RecursionError("maximum recursion depth exceeded")).endswith("too deeply")


def test_raw_byte_handlers_keep_no_deserializer_and_other_callables_are_named_by_method() -> None:
    assert safe_deserializer(None, "Count") is None
    assert message_type_of(lambda data: data, "Count") == "Count request"


# --- through a real server --------------------------------------------------------------------


@pytest.mark.parametrize(("payload", "problem"), [(BAD_UTF8, UTF8_PROBLEM), (TRUNCATED, MALFORMED)])
async def test_an_undecodable_unary_request_is_invalid_argument(
    start_fake: StartFake, payload: bytes, problem: str
) -> None:
    served = await start_fake()
    with pytest.raises(aio.AioRpcError) as err:
        await raw_unary(served.address, EMBED, payload, metadata=((REQUEST_ID_HEADER, "rid-undecodable"),))
    assert_ours(err.value, "EmbedRequest", problem)
    assert served.fake.calls == 0  # the servicer never saw it
    trailers: Any = err.value.trailing_metadata() or ()
    assert (REQUEST_ID_HEADER, "rid-undecodable") in [tuple(item) for item in trailers]


async def test_the_access_log_and_metrics_record_invalid_argument(
    start_fake: StartFake, caplog: pytest.LogCaptureFixture
) -> None:
    served = await start_fake()
    with caplog.at_level(logging.INFO, logger="meshkit.rpc"), pytest.raises(aio.AioRpcError):
        await raw_unary(served.address, EMBED, BAD_UTF8, metadata=((REQUEST_ID_HEADER, "rid-logged"),))
    assert count(served.name, "Embed", "INVALID_ARGUMENT") == 1
    assert count(served.name, "Embed", "UNKNOWN") == 0
    access = [r for r in caplog.records if r.getMessage() == "rpc" and getattr(r, "method", "") == "Embed"]
    assert [getattr(r, "code", "") for r in access] == ["INVALID_ARGUMENT"]
    # The parser's text is in the log, next to the request id, and nowhere else.
    (detail,) = [r for r in caplog.records if r.getMessage() == "undecodable request"]
    assert "DecodeError" in getattr(detail, "detail", "")
    assert getattr(detail, "message_type", "") == "EmbedRequest"


async def test_the_request_id_tags_the_undecodable_log_line(start_fake: StartFake) -> None:
    seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "undecodable request":
                seen.append(request_id_var.get())

    handler = Capture()
    logging.getLogger("meshkit.rpc").addHandler(handler)
    try:
        served = await start_fake()
        with pytest.raises(aio.AioRpcError):
            await raw_unary(served.address, EMBED, TRUNCATED, metadata=((REQUEST_ID_HEADER, "rid-tag"),))
    finally:
        logging.getLogger("meshkit.rpc").removeHandler(handler)
    assert seen == ["rid-tag"]


async def test_an_undecodable_request_to_a_streaming_method_is_invalid_argument(
    start_fake: StartFake,
) -> None:
    served = await start_fake(extra=add_count_service)
    good = embedder_pb2.EmbedRequest(texts=["a", "b"]).SerializeToString()
    assert len(await raw_stream(served.address, STREAM, good)) == 2
    with pytest.raises(aio.AioRpcError) as err:
        await raw_stream(served.address, STREAM, BAD_UTF8)
    assert_ours(err.value, "EmbedRequest", UTF8_PROBLEM)
    assert count(served.name, "Count", "INVALID_ARGUMENT") == 1


async def test_an_undecodable_request_is_refused_before_the_api_key_check(
    start_fake: StartFake, tmp_path: Path
) -> None:
    """With API keys on, garbage is refused as garbage, like an oversized message: nothing
    reads it, and the answer says nothing the public contract does not."""
    keys = tmp_path / "keys.json"
    entry = {"name": "reader", "sha256": digest_of(new_api_key()), "read": ["*"], "write": []}
    keys.write_text(json.dumps({"keys": [entry]}))
    served = await start_fake(access={"Embed": Rule(READ)}, api_keys_file=keys)
    with pytest.raises(aio.AioRpcError) as err:
        await raw_unary(served.address, EMBED, BAD_UTF8)
    assert_ours(err.value, "EmbedRequest", UTF8_PROBLEM)
    # The guard is on: a well-formed request without a key is refused by it.
    with pytest.raises(aio.AioRpcError) as err:
        await raw_unary(served.address, EMBED, embedder_pb2.EmbedRequest(texts=["a"]).SerializeToString())
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_health_answers_undecodable_requests_with_invalid_argument(start_fake: StartFake) -> None:
    served = await start_fake()
    with pytest.raises(aio.AioRpcError) as err:
        await raw_unary(served.address, HEALTH_CHECK, BAD_UTF8)
    assert_ours(err.value, "HealthCheckRequest", UTF8_PROBLEM)
    with pytest.raises(aio.AioRpcError) as err:
        await raw_stream(served.address, HEALTH_WATCH, TRUNCATED)
    assert_ours(err.value, "HealthCheckRequest", MALFORMED)
    # Well-formed probes are served as before.
    ok = health_pb2.HealthCheckRequest(service="").SerializeToString()
    reply = health_pb2.HealthCheckResponse.FromString(await raw_unary(served.address, HEALTH_CHECK, ok))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_the_health_only_port_answers_undecodable_probes_with_invalid_argument(
    start_fake: StartFake,
) -> None:
    (health_port,) = free_ports(1)
    await start_fake(health_port=health_port)
    with pytest.raises(aio.AioRpcError) as err:
        await raw_unary(f"127.0.0.1:{health_port}", HEALTH_CHECK, BAD_UTF8)
    assert_ours(err.value, "HealthCheckRequest", UTF8_PROBLEM)


async def test_reflection_answers_undecodable_requests_with_invalid_argument(start_fake: StartFake) -> None:
    served = await start_fake()
    async with aio.insecure_channel(served.address) as channel:
        method = channel.stream_stream(REFLECTION, None, None)
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in method(iter([TRUNCATED]), timeout=5):
                pass
    assert_ours(err.value, "ServerReflectionRequest", MALFORMED)


# --- property: random bytes never reach UNKNOWN or INTERNAL -----------------------------------

# What a request of random bytes may be answered: decoded and served (OK), refused as malformed
# (INVALID_ARGUMENT), or, for health, a service name it does not know (NOT_FOUND).
ACCEPTABLE = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


def _code_of(channel: grpc.Channel, path: str, payload: bytes, streamed: bool) -> grpc.StatusCode:
    try:
        if streamed:
            list(channel.unary_stream(path, None, None)(payload, timeout=10))
        else:
            channel.unary_unary(path, None, None)(payload, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_random_bytes_are_never_unknown_or_internal(start_fake: StartFake) -> None:
    served = await start_fake(extra=add_count_service)
    codes: list[grpc.StatusCode] = []

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        payload=st.one_of(
            st.binary(max_size=256),
            # Well-formed framing around random content: the cases past the wire format.
            st.binary(max_size=120).map(lambda b: b"\x0a" + bytes([len(b)]) + b),
        ),
        path=st.sampled_from([(EMBED, False), (STREAM, True), (HEALTH_CHECK, False)]),
    )
    def property_holds(payload: bytes, path: tuple[str, bool]) -> None:
        code = _code_of(channel, path[0], payload, path[1])
        codes.append(code)
        assert code in ACCEPTABLE, (code, payload)

    # The blocking client runs in a thread, so this loop stays free to serve.
    with grpc.insecure_channel(served.address) as channel:
        await asyncio.to_thread(property_holds)
    assert grpc.StatusCode.INVALID_ARGUMENT in codes and grpc.StatusCode.OK in codes
