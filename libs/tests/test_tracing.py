"""Traces across real gRPC hops on 127.0.0.1 (meshkit's interceptor, client and bootstrap), into
the JSON-lines exporter: parent links, request ids, status codes, and nothing at all when off."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from meshkit.core.errors import invalid_argument
from meshkit.core.logs import REQUEST_ID_HEADER, current_request_id, request_id_var
from meshkit.rpc import tracing
from meshkit.rpc.client import ClientPolicy, Downstream, DownstreamError
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc

from .conftest import FakeEmbedder, unique_name

REQUEST = embedder_pb2.EmbedRequest(texts=["q"])
POLICY = ClientPolicy(timeout_s=2.0, retry_attempts=1, breaker_fail_max=100)


@pytest.fixture
def trace_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "spans.jsonl"
    assert tracing.configure_tracing("unit", MeshSettings(trace_file=path))
    yield path
    tracing.shutdown_tracing()


def spans_of(path: Path) -> list[dict[str, Any]]:
    assert tracing.flush_tracing()
    return tracing.read_spans(path)


def downstream(name: str, address: str) -> Downstream[embedder_pb2_grpc.EmbedderServiceStub]:
    return Downstream(name, address, embedder_pb2_grpc.EmbedderServiceStub, POLICY)


class Relay(FakeEmbedder):
    """A stage that calls the next one, as the gateway calls the embedder."""

    def __init__(self, nxt: Downstream[embedder_pb2_grpc.EmbedderServiceStub]) -> None:
        super().__init__()
        self.next = nxt

    async def Embed(self, request: Any, context: aio.ServicerContext) -> Any:
        return await self.next.call(self.next.stub.Embed, request)


async def test_one_call_through_two_hops_is_one_trace_with_parent_links(
    trace_file: Path, start_fake: Any
) -> None:
    leaf = await start_fake(name=unique_name("leaf"))
    to_leaf = downstream("leaf", leaf.address)
    middle = await start_fake(Relay(to_leaf), name=unique_name("middle"))
    to_middle = downstream("middle", middle.address)
    token = request_id_var.set("rid-trace-1")
    try:
        reply = await to_middle.call(to_middle.stub.Embed, REQUEST)
    finally:
        request_id_var.reset(token)
    assert reply.model == "q"
    await asyncio.gather(to_leaf.close(), to_middle.close())

    spans = spans_of(trace_file)
    assert len({s["trace_id"] for s in spans}) == 1
    by_name = {s["name"]: s for s in spans}
    assert set(by_name) == {"middle/Embed", f"{middle.name}/Embed", "leaf/Embed", f"{leaf.name}/Embed"}
    root = by_name["middle/Embed"]
    assert root["parent_id"] is None and root["kind"] == "CLIENT"
    # client -> server -> client -> server, each the parent of the next.
    chain = [root, by_name[f"{middle.name}/Embed"], by_name["leaf/Embed"], by_name[f"{leaf.name}/Embed"]]
    for parent, child in itertools.pairwise(chain):
        assert child["parent_id"] == parent["span_id"], (parent["name"], child["name"])
    assert [s["kind"] for s in chain] == ["CLIENT", "SERVER", "CLIENT", "SERVER"]
    # The request id travels with the trace: every hop's span carries it.
    assert {s["attributes"][tracing.REQUEST_ID_ATTRIBUTE] for s in spans} == {"rid-trace-1"}
    assert all(s["attributes"]["rpc.grpc.status_code"] == 0 for s in chain[1::2])
    assert all(s["status"] == "UNSET" for s in spans)


async def test_a_failed_call_marks_both_sides_with_its_status(trace_file: Path, start_fake: Any) -> None:
    async def refuse(request: Any, context: Any) -> Any:
        raise invalid_argument("no texts like that")

    served = await start_fake(FakeEmbedder(behavior=refuse), name=unique_name("refuser"))
    client = downstream("refuser", served.address)
    with pytest.raises(DownstreamError):
        await client.call(client.stub.Embed, REQUEST)
    await client.close()

    spans = {s["kind"]: s for s in spans_of(trace_file)}
    code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    for kind in ("CLIENT", "SERVER"):
        assert spans[kind]["status"] == "ERROR"
        assert spans[kind]["attributes"]["rpc.grpc.status_code"] == code
    assert spans["SERVER"]["parent_id"] == spans["CLIENT"]["span_id"]


async def test_the_caller_trace_context_reaches_the_handler_as_metadata(
    trace_file: Path, start_fake: Any
) -> None:
    seen: list[dict[str, str]] = []

    async def record(request: Any, context: aio.ServicerContext) -> Any:
        seen.append({k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)})
        return embedder_pb2.EmbedResponse(model=current_request_id())

    served = await start_fake(FakeEmbedder(behavior=record))
    client = downstream("recorder", served.address)
    await client.call(client.stub.Embed, REQUEST)
    await client.close()
    client_span = next(s for s in spans_of(trace_file) if s["kind"] == "CLIENT")
    traceparent = seen[0]["traceparent"]
    assert traceparent.startswith(f"00-{client_span['trace_id']}-{client_span['span_id']}-")
    assert int(traceparent.rsplit("-", 1)[1], 16) & 1  # sampled
    assert REQUEST_ID_HEADER in seen[0]


async def test_off_by_default_sends_no_trace_context_and_writes_nothing(
    tmp_path: Path, start_fake: Any
) -> None:
    assert not tracing.configure_tracing("unit", MeshSettings())
    assert not tracing.enabled()
    seen: list[set[str]] = []

    async def record(request: Any, context: aio.ServicerContext) -> Any:
        seen.append({k for k, _v in context.invocation_metadata() or ()})
        return embedder_pb2.EmbedResponse(model="ok")

    served = await start_fake(FakeEmbedder(behavior=record))
    client = downstream("untraced", served.address)
    await client.call(client.stub.Embed, REQUEST)
    await client.close()
    assert "traceparent" not in seen[0]
    assert tracing.outgoing("x", tracing.CLIENT) is tracing.NO_SPAN
    assert tracing.start_server_span("svc", "M", ()) is None


def test_a_nats_message_carries_its_publisher_span_to_the_consumer(trace_file: Path) -> None:
    token = request_id_var.set("rid-ingest")
    try:
        with tracing.nats_publish("ingest.upsert.docs") as headers:
            message_headers = {"Nats-Msg-Id": "ev-1", **headers}
    finally:
        request_id_var.reset(token)
    consumed = tracing.start_consumer_span("ingest.upsert.docs", message_headers)
    with tracing.attached(consumed), tracing.outgoing("s3.GetObject", tracing.CLIENT):
        pass
    tracing.finish(consumed, outcome="ok")

    spans = {s["kind"]: s for s in spans_of(trace_file)}
    assert set(spans) == {"PRODUCER", "CONSUMER", "CLIENT"}
    assert spans["CONSUMER"]["parent_id"] == spans["PRODUCER"]["span_id"]
    assert spans["CLIENT"]["parent_id"] == spans["CONSUMER"]["span_id"]
    assert len({s["trace_id"] for s in spans.values()}) == 1
    assert spans["PRODUCER"]["attributes"][tracing.REQUEST_ID_ATTRIBUTE] == "rid-ingest"
    assert spans["CONSUMER"]["attributes"]["ragmesh.outcome"] == "ok"


def test_a_group_span_is_the_first_message_child_and_links_the_others(trace_file: Path) -> None:
    members = []
    for i in range(3):
        with tracing.nats_publish(f"ingest.upsert.c{i}") as headers:
            members.append(tracing.start_consumer_span(f"ingest.upsert.c{i}", dict(headers)))
    with tracing.grouped("ingest.index", members):
        pass
    for member in members:
        tracing.finish(member)
    spans = spans_of(trace_file)
    group = next(s for s in spans if s["name"] == "ingest.index")
    consumers = [s for s in spans if s["kind"] == "CONSUMER"]
    first = next(s for s in consumers if s["span_id"] == group["parent_id"])
    linked = {(link["trace_id"], link["span_id"]) for link in group["links"]}
    assert linked == {(s["trace_id"], s["span_id"]) for s in consumers if s is not first}


WRITER = """
import sys
from pathlib import Path
from meshkit.rpc import tracing
from meshkit.settings import MeshSettings
tracing.configure_tracing(sys.argv[2], MeshSettings(trace_file=Path(sys.argv[1])))
for i in range(int(sys.argv[3])):
    with tracing.outgoing(f"op-{i}", tracing.CLIENT, {"padding": "x" * 300}):
        pass
tracing.shutdown_tracing()
"""


def test_processes_sharing_a_file_never_tear_each_other_lines(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"proc-{n}", "3000"]) for n in range(3)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0]
    lines = path.read_text().splitlines()
    assert len(lines) == 9000
    spans = [json.loads(line) for line in lines]  # every line whole
    assert {s["service"] for s in spans} == {"proc-0", "proc-1", "proc-2"}


class Deltas(narrator_pb2_grpc.NarratorServiceServicer):
    async def NarrateStream(self, request: Any, context: aio.ServicerContext) -> Any:
        for word in ("one", "two", "three"):
            yield narrator_pb2.NarrateStreamResponse(delta=word)


async def test_a_server_stream_is_one_client_span_read_whole_or_closed_early(
    trace_file: Path, start_fake: Any
) -> None:
    served = await start_fake(
        name=unique_name("narrator"),
        extra=lambda server: narrator_pb2_grpc.add_NarratorServiceServicer_to_server(Deltas(), server),
    )
    client = Downstream("narrator", served.address, narrator_pb2_grpc.NarratorServiceStub, POLICY)
    request = narrator_pb2.NarrateStreamRequest(request=narrator_pb2.NarrateRequest(query="q"))
    whole = [m.delta async for m in client.stream(client.stub.NarrateStream, request)]
    assert whole == ["one", "two", "three"]
    stream = client.stream(client.stub.NarrateStream, request)
    assert (await anext(stream)).delta == "one"
    await stream.aclose()  # the reader stops after the first delta
    await client.close()

    # The server notices the early close on its own time: wait for both of its spans.
    server_name = f"{served.name}/NarrateStream"
    for _ in range(100):
        spans = spans_of(trace_file)
        if sum(s["name"] == server_name for s in spans) == 2:
            break
        await asyncio.sleep(0.05)
    calls = sorted((s for s in spans if s["kind"] == "CLIENT"), key=lambda s: s["start_ns"])
    assert [s["name"] for s in calls] == ["narrator/NarrateStream"] * 2
    assert [s["status"] for s in calls] == ["UNSET", "UNSET"]
    assert "ragmesh.closed_early" not in calls[0]["attributes"]
    assert calls[1]["attributes"]["ragmesh.closed_early"] is True
    served_spans = [s for s in spans if s["name"] == server_name]
    assert {s["parent_id"] for s in served_spans} == {c["span_id"] for c in calls}


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver, as an OpenTelemetry collector serves it."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def test_spans_reach_an_otlp_collector_over_grpc() -> None:
    collector = Collector()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert tracing.configure_tracing("otlp-unit", MeshSettings(otlp_endpoint=f"http://127.0.0.1:{port}"))
        token = request_id_var.set("rid-otlp")
        try:
            with tracing.rpc_call("embedder", "Embed"):
                pass
        finally:
            request_id_var.reset(token)
        assert tracing.flush_tracing()
    finally:
        tracing.shutdown_tracing()
        server.stop(0)
    resources = [rs for request in collector.requests for rs in request.resource_spans]
    services = {
        a.value.string_value for rs in resources for a in rs.resource.attributes if a.key == "service.name"
    }
    assert services == {"otlp-unit"}
    spans = [span for rs in resources for ss in rs.scope_spans for span in ss.spans]
    assert [span.name for span in spans] == ["embedder/Embed"]
    attributes = {a.key: a.value.string_value for a in spans[0].attributes}
    assert attributes[tracing.REQUEST_ID_ATTRIBUTE] == "rid-otlp"
