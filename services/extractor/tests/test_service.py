from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from grpc import aio

from meshkit.llm.factory import LLMError
from meshkit.rpc.server import RunningService, start_service
from ragmesh.extractor.v1 import extractor_pb2, extractor_pb2_grpc
from services.extractor.servicer import build_spec
from services.extractor.tests.conftest import Call, FakeEmbed, FakeLLM, echo_map, make_settings

MAX_PASSAGES = 6
MAX_PASSAGE_CHARS = 500
MAX_QUERY_CHARS = 100
MAX_BATCH = 4


@dataclass
class Server:
    running: RunningService
    llm: FakeLLM
    embed: FakeEmbed
    stub: extractor_pb2_grpc.ExtractorServiceStub
    channel: aio.Channel


async def serve(llm: FakeLLM | None = None, embed: FakeEmbed | None = None, **overrides: Any) -> Server:
    settings = make_settings(
        extractor_max_passages=MAX_PASSAGES,
        extractor_max_passage_chars=MAX_PASSAGE_CHARS,
        extractor_max_query_chars=MAX_QUERY_CHARS,
        extractor_max_batch_size=MAX_BATCH,
        extractor_batch_size=2,
        **overrides,
    )
    llm = llm or FakeLLM()
    embed = embed or FakeEmbed()
    spec, _servicer = build_spec(settings, llm=llm, embed=embed)
    running = await start_service(spec, settings)
    channel = aio.insecure_channel(f"127.0.0.1:{running.port}")
    return Server(running, llm, embed, extractor_pb2_grpc.ExtractorServiceStub(channel), channel)


async def shut(server: Server) -> None:
    await server.channel.close(None)
    await server.running.stop(1.0)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    started = await serve()
    yield started
    await shut(started)


def passage(i: int, text: str | None = None, **fields: Any) -> extractor_pb2.Passage:
    values: dict[str, Any] = {
        "id": f"c{i}",
        "doc_id": f"doc{i}",
        "title": f"Doc {i}",
        "text": text if text is not None else f"The Eiffel Tower fact number {i} is about iron.",
    }
    return extractor_pb2.Passage(**{**values, **fields})


def request(n: int = 3, **fields: Any) -> extractor_pb2.ExtractRequest:
    values: dict[str, Any] = {
        "query": "What is the Eiffel Tower made of?",
        "passages": [passage(i) for i in range(n)],
    }
    return extractor_pb2.ExtractRequest(**{**values, **fields})


async def test_llm_mode_end_to_end(server: Server) -> None:
    reply = await server.stub.Extract(request(5, max_facts=4))
    assert reply.mode == extractor_pb2.EXTRACTION_MODE_LLM
    assert [f.passage_id for f in reply.facts] == ["c0", "c1", "c2", "c3"]
    assert all(f.origin == extractor_pb2.FACT_ORIGIN_LLM for f in reply.facts)
    assert reply.facts[0].doc_id == "doc0" and reply.facts[0].score > reply.facts[1].score
    assert reply.llm_calls == 3  # batches of the server default 2
    assert not reply.degraded_reason and not reply.issues


async def test_extractive_mode_needs_no_llm(server: Server) -> None:
    calls = len(server.llm.calls)
    reply = await server.stub.Extract(request(2, mode=extractor_pb2.EXTRACTION_MODE_EXTRACTIVE))
    assert reply.mode == extractor_pb2.EXTRACTION_MODE_EXTRACTIVE
    assert {f.origin for f in reply.facts} == {extractor_pb2.FACT_ORIGIN_EXTRACTIVE}
    assert len(server.llm.calls) == calls and reply.llm_calls == 0


async def test_issues_and_degradation_reach_the_caller() -> None:
    def script(call: Call) -> str | Exception:
        if "number 0" in call.prompt:
            return json.dumps({"facts": [{"passage": 1, "fact": ""}, {"passage": 2, "fact": "Iron."}]})
        return LLMError("unavailable", "connection refused")

    served = await serve(FakeLLM(script), FakeEmbed(down=True))
    try:
        reply = await served.stub.Extract(request(4))
    finally:
        await shut(served)
    assert reply.mode == extractor_pb2.EXTRACTION_MODE_LLM
    assert reply.degraded_reason == "unavailable: llm connection refused"
    origins = {f.passage_id: f.origin for f in reply.facts}
    assert origins["c0"] == extractor_pb2.FACT_ORIGIN_SNIPPET
    assert origins["c1"] == extractor_pb2.FACT_ORIGIN_LLM
    assert origins["c2"] == origins["c3"] == extractor_pb2.FACT_ORIGIN_EXTRACTIVE
    kinds = sorted((i.batch, i.kind) for i in reply.issues)
    assert kinds == [(0, "malformed_entry"), (1, "batch_failed"), (1, "embedder_unavailable")]


async def test_slow_llm_degrades_within_the_callers_deadline() -> None:
    served = await serve(FakeLLM(delay_s=30.0), llm_timeout_s=30.0)
    try:
        started = time.monotonic()
        reply = await served.stub.Extract(request(4), timeout=1.5)
        elapsed = time.monotonic() - started
    finally:
        await shut(served)
    assert elapsed < 1.5
    assert reply.mode == extractor_pb2.EXTRACTION_MODE_EXTRACTIVE
    assert reply.degraded_reason.startswith("deadline: ")
    assert len(reply.facts) == 4 and reply.llm_calls == 1


async def test_gate_and_batch_size_through_the_wire() -> None:
    def script(call: Call) -> str:
        return json.dumps({"relevant": [1]}) if call.purpose == "gate" else echo_map(call)

    served = await serve(FakeLLM(script), extractor_relevance_gate=True)
    try:
        reply = await served.stub.Extract(request(6, batch_size=3))
    finally:
        await shut(served)
    assert len(served.llm.by_purpose("map")) == 2
    assert reply.gated_out == 2 and len(reply.facts) == 4


def bad(**fields: Any) -> extractor_pb2.ExtractRequest:
    return request(**fields)


VALIDATION_CASES = [
    (bad(query="  "), grpc.StatusCode.INVALID_ARGUMENT, "query is empty"),
    (bad(query="q" * (MAX_QUERY_CHARS + 1)), grpc.StatusCode.RESOURCE_EXHAUSTED, "query has"),
    (extractor_pb2.ExtractRequest(query="q"), grpc.StatusCode.INVALID_ARGUMENT, "at least one passage"),
    (bad(n=MAX_PASSAGES + 1), grpc.StatusCode.RESOURCE_EXHAUSTED, "passages in one call"),
    (bad(passages=[passage(0, id="")]), grpc.StatusCode.INVALID_ARGUMENT, "passages[0].id"),
    (bad(passages=[passage(0), passage(1, id="c0")]), grpc.StatusCode.INVALID_ARGUMENT, "is repeated"),
    (bad(passages=[passage(0, text=" ")]), grpc.StatusCode.INVALID_ARGUMENT, "passages[0].text is empty"),
    (
        bad(passages=[passage(0, text="x" * (MAX_PASSAGE_CHARS + 1))]),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "passages[0].text has",
    ),
    (bad(passages=[passage(0, score=float("nan"))]), grpc.StatusCode.INVALID_ARGUMENT, "finite"),
    (bad(mode=7), grpc.StatusCode.INVALID_ARGUMENT, "not a known ExtractionMode"),
    (bad(batch_size=MAX_BATCH + 1), grpc.StatusCode.RESOURCE_EXHAUSTED, "batch_size"),
]


@pytest.mark.parametrize(("req", "code", "message"), VALIDATION_CASES)
async def test_validation(
    server: Server, req: extractor_pb2.ExtractRequest, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(aio.AioRpcError) as caught:
        await server.stub.Extract(req)
    assert caught.value.code() == code
    assert message in (caught.value.details() or "")
