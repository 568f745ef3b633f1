"""Distributed traces on the real mesh, started as ``ragmesh up --secure --trace-file PATH`` starts
it: API keys, mTLS with an identity per service, two index shards, two ingestion workers,
production timings. Every service appends its spans to the one file.

- one search is one trace: a single root (the gateway's Search), every other span's parent in the
  same trace, and spans from every stage it touched (gateway, embedder, both index shards, sparse,
  reranker);
- one ingest is one trace from the ingestion API through S3, the NATS publish, a worker's consume
  (its parent is the publish), the worker's S3 read and its calls to the stores.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshkit.core.logs import REQUEST_ID_HEADER
from meshkit.rpc.tracing import REQUEST_ID_ATTRIBUTE, read_spans
from ragmesh.gateway.v1 import gateway_pb2 as gw
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2 as ing
from ragmesh_cli.main import main
from ragmesh_cli.stack import Stack

from .meshclients import Mesh

pytestmark = pytest.mark.integration

COLLECTION = "traced"
SERVICES = "embedder,index,sparse,planner,reranker,ingestion,gateway,worker"
DOCS = [
    ("rotation.md", "# Rotating API keys\n\nTo rotate an API key, mint a new key with ragmesh keys new, "
     "move every client to it, then remove the old entry from the keys file."),
    ("limits.md", "# Request limits\n\nEvery server caps the calls it runs at once and refuses messages "
     "larger than its largest legal request with RESOURCE_EXHAUSTED."),
    ("shards.md", "# Shards\n\nThe index splits a collection over shards by chunk id; the gateway asks "
     "every shard and fuses what they return."),
]  # fmt: skip
Span = dict[str, Any]


@pytest.fixture(scope="module")
def traced_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    state_dir = tmp_path_factory.mktemp("traced")
    trace_file = state_dir / "spans.jsonl"
    state = ["--state-dir", str(state_dir)]
    try:
        up = ["up", "--secure", "--services", SERVICES, "--index-shards", "2", "--workers", "2"]
        assert main([*state, *up, "--trace-file", str(trace_file)]) == 0
        yield Stack.load(state_dir), trace_file
    finally:
        main([*state, "down"])


async def spans_of_trace(trace_file: Path, request_id: str, done: Any, timeout: float = 30.0) -> list[Span]:
    """The spans of the trace that holds ``request_id``, once ``done(spans)`` says all arrived
    (each process exports within about a second)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = read_spans(trace_file)
        traces = {s["trace_id"] for s in spans if s["attributes"].get(REQUEST_ID_ATTRIBUTE) == request_id}
        assert len(traces) <= 1, f"request {request_id} is in {len(traces)} traces"
        mine = [s for s in spans if s["trace_id"] in traces]
        if mine and done(mine):
            return mine
        if time.monotonic() > deadline:
            names = sorted({f"{s['service']}:{s['name']}" for s in mine})
            raise AssertionError(f"trace of {request_id} incomplete after {timeout}s: {names}")
        await asyncio.sleep(0.5)


def assert_one_tree(spans: list[Span]) -> Span:
    """One root, and every other span's parent is a span of the same trace; returns the root."""
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if s["parent_id"] is None]
    assert len(roots) == 1, [f"{s['service']}:{s['name']}" for s in roots]
    orphans = [f"{s['service']}:{s['name']}" for s in spans if s["parent_id"] and s["parent_id"] not in ids]
    assert not orphans, f"spans whose parent is not in the trace: {orphans}"
    return roots[0]


def parent_of(span: Span, spans: list[Span]) -> Span:
    return next(s for s in spans if s["span_id"] == span["parent_id"])


def servers(spans: list[Span], service: str) -> list[Span]:
    return [s for s in spans if s["service"] == service and s["kind"] == "SERVER"]


async def test_one_search_is_one_trace_over_every_stage_it_touched(traced_stack: tuple[Stack, Path]) -> None:
    stack, trace_file = traced_stack
    mesh = Mesh(stack)
    try:
        await mesh.ingest(COLLECTION, DOCS)
        await mesh.wait_settled(COLLECTION, [name for name, _ in DOCS])
        gateway = gateway_pb2_grpc.GatewayServiceStub(mesh.channel("gateway"))
        request = gw.SearchRequest(collection=COLLECTION, query="how do I rotate an API key?", rerank=True)
        found = await gateway.Search(request, timeout=30, metadata=((REQUEST_ID_HEADER, "rid-search-1"),))
    finally:
        await mesh.close()
    assert found.results and found.results[0].doc_id == "rotation.md", found
    assert not found.degradations, found.degradations
    stages = {"gateway", "embedder", "index", "sparse", "reranker"}

    def complete(spans: list[Span]) -> bool:
        index_processes = {s["instance"] for s in servers(spans, "index")}
        return stages <= {s["service"] for s in spans} and len(index_processes) == 2

    spans = await spans_of_trace(trace_file, "rid-search-1", complete)
    root = assert_one_tree(spans)
    assert (root["service"], root["name"], root["kind"]) == ("gateway", "gateway/Search", "SERVER")
    for stage in stages - {"gateway"}:
        for span in servers(spans, stage):
            # Each stage's server span is the child of the gateway's call to it.
            caller = parent_of(span, spans)
            assert (caller["service"], caller["kind"]) == ("gateway", "CLIENT"), (span["name"], caller)
            assert caller["attributes"]["rpc.method"] == span["name"].rsplit("/", 1)[1]
            assert span["attributes"][REQUEST_ID_ATTRIBUTE] == "rid-search-1"
            assert span["status"] != "ERROR", span
    assert {s["service"] for s in spans} <= stages | {"planner"}


async def test_an_ingest_trace_follows_the_document_through_nats_to_a_worker(
    traced_stack: tuple[Stack, Path],
) -> None:
    stack, trace_file = traced_stack
    mesh = Mesh(stack)
    doc = ("traced-ingest.md", "# Traced\n\nThis page travels from the API through NATS to a worker.")
    try:
        reply = await mesh.ingestion.IngestDocuments(
            _request(doc), timeout=30, metadata=((REQUEST_ID_HEADER, "rid-ingest-1"),)
        )
        assert len(reply.results) == 1
        await mesh.wait_settled(COLLECTION, [doc[0]])
    finally:
        await mesh.close()

    def complete(spans: list[Span]) -> bool:
        consumed = [s for s in spans if s["kind"] == "CONSUMER"]
        return bool(consumed) and {"index", "sparse"} <= {s["service"] for s in spans}

    spans = await spans_of_trace(trace_file, "rid-ingest-1", complete)
    root = assert_one_tree(spans)
    assert root["name"].endswith("/IngestDocuments") and root["kind"] == "SERVER"
    api = root["service"]
    put = next(s for s in spans if s["name"] == "s3.PutObject")
    publish = next(s for s in spans if s["kind"] == "PRODUCER")
    assert put["service"] == api and parent_of(put, spans) is not None
    assert publish["service"] == api and publish["attributes"]["messaging.system"] == "nats"
    consume = next(s for s in spans if s["kind"] == "CONSUMER")
    assert consume["service"] == "ingestion-worker"
    assert consume["parent_id"] == publish["span_id"]
    assert consume["attributes"]["ragmesh.outcome"] == "ok"
    get = next(s for s in spans if s["name"] == "s3.GetObject")
    assert get["service"] == "ingestion-worker" and get["parent_id"] == consume["span_id"]
    assert get["attributes"]["aws.s3.key"] == put["attributes"]["aws.s3.key"]
    # The worker's calls to the embedder and the stores are in the document's trace too.
    worker_calls = {
        s["attributes"].get("ragmesh.target") for s in spans if s["service"] == "ingestion-worker"
    }
    assert {"embedder", "sparse"} <= worker_calls, worker_calls
    assert any(str(target).startswith("index") for target in worker_calls), worker_calls


def _request(doc: tuple[str, str]) -> ing.IngestDocumentsRequest:
    name, text = doc
    document = ing.Document(doc_id=name, content=text.encode(), format=ing.DOCUMENT_FORMAT_MARKDOWN)
    return ing.IngestDocumentsRequest(collection=COLLECTION, documents=[document])
