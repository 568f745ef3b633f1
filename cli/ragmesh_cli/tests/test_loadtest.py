"""``ragmesh loadtest`` against tiny in-process gRPC servers: percentile math, the open-loop
scheduler (rate held, late starts and unsent requests counted), errors by status code, the JSON
report, and every target's requests built from a small fixture dataset."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2
from ragmesh.extractor.v1 import extractor_pb2
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.index.v1 import index_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from ragmesh.reranker.v1 import reranker_pb2
from ragmesh.sparse.v1 import sparse_pb2
from ragmesh_cli import loadtest, procutil
from ragmesh_cli.addresses import resolve_address
from ragmesh_cli.documents import InputError
from ragmesh_cli.loadtest import DriveOptions, RequestOptions
from ragmesh_cli.stack import STATE_FILE, STATE_VERSION

METHOD = "/test.Load/Call"
Handler = Callable[[bytes, grpc.ServicerContext], bytes]


class _Generic(grpc.GenericRpcHandler):
    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(self._handler)


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], str]]:
    """Start a threaded server answering every method with ``handler``; returns its address."""
    servers: list[grpc.Server] = []

    def start(handler: Handler) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers((_Generic(handler),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(None)


def _ok(request: bytes, context: grpc.ServicerContext) -> bytes:
    return b""


# ---------------------------------------------------------------------------- statistics


def test_scheduled_count() -> None:
    assert loadtest.scheduled_count(200.0, 1.0) == 200
    assert loadtest.scheduled_count(3.0, 1.0) == 3
    assert loadtest.scheduled_count(3.0, 1.1) == 4
    assert loadtest.scheduled_count(10.0, 0.0) == 0


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        DriveOptions(concurrency=2, rate=5.0).validate()
    with pytest.raises(ValueError, match="--duration"):
        DriveOptions(concurrency=2, duration_s=0).validate()


# ---------------------------------------------------------------------------- driving


async def test_open_loop_keeps_the_rate(serve: Callable[[Handler], str]) -> None:
    address = serve(_ok)
    opts = DriveOptions(rate=200.0, duration_s=1.0, warmup_s=0.2)
    report = await loadtest.drive(address, METHOD, [b""], opts)
    assert report["mode"] == "open"
    # Exactly the requests scheduled in the measured window, all sent and answered.
    assert report["requests"] == 200
    assert report["ok"] == 200
    assert report["unsent"] == 0
    assert report["achieved_rate_rps"] == pytest.approx(200.0)
    assert report["errors"] == {}


async def test_open_loop_counts_late_starts_and_measures_from_the_schedule(
    serve: Callable[[Handler], str],
) -> None:
    def slow(request: bytes, context: grpc.ServicerContext) -> bytes:
        time.sleep(0.03)
        return b""

    address = serve(slow)
    # One call at a time, 30 ms each, scheduled every 10 ms: the driver cannot keep up.
    opts = DriveOptions(rate=100.0, max_outstanding=1, duration_s=0.6)
    report = await loadtest.drive(address, METHOD, [b""], opts)
    assert report["requests"] + report["unsent"] == 60
    assert report["unsent"] > 20
    assert report["late_starts"] >= report["requests"] - 2
    assert report["achieved_rate_rps"] < 60.0
    # From the scheduled start: the wait for a slot counts, so latency grows past the service time.
    assert report["latency_ms"]["max"] > 100.0
    assert report["start_lag_ms"]["max"] > 60.0


async def test_errors_are_counted_by_status_code(serve: Callable[[Handler], str]) -> None:
    counter = itertools.count()
    lock = threading.Lock()

    def flaky(request: bytes, context: grpc.ServicerContext) -> bytes:
        with lock:
            n = next(counter)
        if n % 3 == 1:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
        if n % 3 == 2:
            context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        return b""

    address = serve(flaky)
    report = await loadtest.drive(address, METHOD, [b""], DriveOptions(concurrency=3, duration_s=0.5))
    errors = report["errors"]
    assert set(errors) == {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}
    assert report["ok"] + sum(errors.values()) == report["requests"]
    for count in (report["ok"], *errors.values()):
        assert abs(count - report["requests"] / 3) <= 3
    assert report["error_rate"] == pytest.approx(sum(errors.values()) / report["requests"], abs=1e-5)
    # Latency is over successful calls only.
    assert report["latency_ms"]["p50"] is not None


async def test_deadline_and_unreachable(serve: Callable[[Handler], str]) -> None:
    def stuck(request: bytes, context: grpc.ServicerContext) -> bytes:
        time.sleep(0.3)
        return b""

    address = serve(stuck)
    report = await loadtest.drive(
        address, METHOD, [b""], DriveOptions(concurrency=2, duration_s=0.2, timeout_s=0.05)
    )
    assert report["ok"] == 0
    assert set(report["errors"]) == {"DEADLINE_EXCEEDED"}
    assert report["latency_ms"]["p50"] is None
    closed = procutil.free_ports(1)[0]
    with pytest.raises(RuntimeError, match="not reachable"):
        await loadtest.drive(
            f"127.0.0.1:{closed}",
            METHOD,
            [b""],
            DriveOptions(concurrency=1, duration_s=0.1),
            connect_timeout_s=0.3,
        )


async def test_several_channels_and_progress_lines(
    serve: Callable[[Handler], str], capsys: pytest.CaptureFixture[str]
) -> None:
    address = serve(_ok)
    opts = DriveOptions(concurrency=4, duration_s=0.3, warmup_s=0.4, channels=3, progress_s=0.25)
    report = await loadtest.drive(address, METHOD, [b"a", b"b"], opts)
    assert report["channels"] == 3
    assert report["ok"] == report["requests"] > 0
    assert report["client_cpu_percent"] is not None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 2 and "warmup" in lines[0] and "ok/s" in lines[0]
    assert "measuring" in lines[-1]


# ---------------------------------------------------------------------------- requests


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "tiny"
    (root / "qrels").mkdir(parents=True)
    queries = [
        ("q1", "Vitamin D lowers the risk of fractures."),
        ("q2", "BRCA1 mutations raise breast cancer risk."),
        ("q3", "Aspirin prevents heart attacks."),
        ("q4", "An unjudged claim."),
    ]
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t, "metadata": {}}) + "\n" for q, t in queries)
    )
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td3\t1\n")
    docs = [
        (f"d{i}", f"Title {i}", f"Sentence one of document {i}. Sentence two says more. A third one.")
        for i in range(1, 9)
    ]
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x in docs)
    )
    return root


def _data(dataset: Path) -> loadtest.LoadData:
    return loadtest.load_data(dataset, "test", limit=0, seed=1)


def test_load_data_reads_judged_queries_and_pads_passages(dataset: Path) -> None:
    data = _data(dataset)
    assert sorted(data.queries) == sorted(
        [
            "Vitamin D lowers the risk of fractures.",
            "BRCA1 mutations raise breast cancer risk.",
            "Aspirin prevents heart attacks.",
        ]
    )
    i = data.queries.index("BRCA1 mutations raise breast cancer risk.")
    passages = data.passages(i, 4)
    assert passages[0].doc_id == "d2"
    assert len({p.doc_id for p in passages}) == 4
    assert data.passages(i, 4) == passages  # the same every run
    assert len(data.passages(i, 50)) == 8  # no more than the corpus holds
    assert len(loadtest.load_data(dataset, "test", limit=2, seed=1).queries) == 2


def _build(service: str, data: loadtest.LoadData, **overrides: Any) -> list[bytes]:
    target = loadtest.TARGETS[service]
    opts = RequestOptions(**{"collection": "tiny", "passages": target.default_passages, **overrides})
    return [m.SerializeToString() for m in target.build(data, opts)]


def test_every_target_builds_valid_requests(dataset: Path) -> None:
    data = _data(dataset)
    data.vectors = loadtest.random_unit_vectors(len(data.queries), 8, seed=3)
    queries = set(data.queries)

    (health,) = _build("health", data, health_service="ragmesh.reranker.v1.RerankerService")
    assert health_pb2.HealthCheckRequest.FromString(health).service == "ragmesh.reranker.v1.RerankerService"

    searches = [gateway_pb2.SearchRequest.FromString(b) for b in _build("gateway", data, rerank=False)]
    assert {s.query for s in searches} == queries
    assert all(s.collection == "tiny" and s.top_k == 10 and s.HasField("rerank") for s in searches)

    asks = [
        gateway_pb2.AskRequest.FromString(b)
        for b in _build("gateway-ask", data, answer_mode="extractive", strategy="precise")
    ]
    assert all(a.mode == gateway_pb2.ANSWER_MODE_EXTRACTIVE for a in asks)
    assert all(a.strategy == planner_pb2.STRATEGY_PRECISE for a in asks)

    embeds = [embedder_pb2.EmbedRequest.FromString(b) for b in _build("embedder", data, batch=2)]
    assert [len(e.texts) for e in embeds] == [2, 1]
    assert embeds[0].kind == embedder_pb2.TEXT_KIND_QUERY
    passages = [
        embedder_pb2.EmbedRequest.FromString(b)
        for b in _build("embedder", data, embed_kind="passage", batch=4)
    ]
    assert sum(len(p.texts) for p in passages) == 8 and passages[0].kind == embedder_pb2.TEXT_KIND_PASSAGE

    vectors = [index_pb2.SearchRequest.FromString(b) for b in _build("index", data)]
    assert all(len(v.vector.values) == 8 for v in vectors)
    assert math.isclose(sum(x * x for x in vectors[0].vector.values), 1.0, rel_tol=1e-5)

    bm25 = [sparse_pb2.SearchBm25Request.FromString(b) for b in _build("sparse", data)]
    assert {b.query for b in bm25} == queries
    exact = [sparse_pb2.SearchExactRequest.FromString(b) for b in _build("sparse-exact", data)]
    assert all(1 <= len(e.keywords) <= 2 for e in exact)
    assert any("BRCA1" in e.keywords for e in exact)

    plans = [planner_pb2.PlanRequest.FromString(b) for b in _build("planner", data)]
    assert {p.query for p in plans} == queries
    hydes = [planner_pb2.HydeRequest.FromString(b) for b in _build("planner-hyde", data)]
    assert {h.query for h in hydes} == queries

    reranks = [reranker_pb2.RerankRequest.FromString(b) for b in _build("reranker", data, passages=5)]
    assert all(len(r.passages) == 5 and len({p.id for p in r.passages}) == 5 for r in reranks)
    assert all(p.text.startswith("Title") for p in reranks[0].passages)

    extracts = [
        extractor_pb2.ExtractRequest.FromString(b) for b in _build("extractor", data, answer_mode="llm")
    ]
    assert all(len(e.passages) == 8 and e.mode == extractor_pb2.EXTRACTION_MODE_LLM for e in extracts)
    scores = [p.score for p in extracts[0].passages]
    assert scores == sorted(scores, reverse=True)

    narrations = [narrator_pb2.NarrateRequest.FromString(b) for b in _build("narrator", data)]
    for n in narrations:
        assert len(n.sources) == 5
        assert [f.source for f in n.facts] == [1, 2, 3, 4, 5]
        assert n.facts[0].text.startswith("Sentence one")


def test_hard_keywords_prefer_identifiers() -> None:
    assert loadtest.hard_keywords("BRCA1 mutations raise breast cancer risk.") == ["BRCA1", "mutations"]
    assert loadtest.hard_keywords("plain words only here") == ["plain", "words"]


def test_index_needs_vectors(dataset: Path) -> None:
    with pytest.raises(RuntimeError, match="query vectors"):
        _build("index", _data(dataset))


# ---------------------------------------------------------------------------- the command


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_json_report(serve: Callable[[Handler], str], dataset: Path, tmp_path: Path, capsys: Any) -> None:
    address = serve(_ok)
    args = _args(
        "reranker", "--address", address, "--dataset", str(dataset), "--concurrency", "2",
        "--duration", "0.3", "--warmup", "0", "--progress", "0", "--passages", "3", "--json",
    )  # fmt: skip
    assert asyncio.run(loadtest.run_loadtest(args, tmp_path)) == 0
    report = json.loads(capsys.readouterr().out)
    assert {
        "service", "address", "method", "mode", "concurrency", "target_rate", "channels", "duration_s",
        "warmup_s", "timeout_s", "requests", "ok", "errors", "error_rate", "throughput_rps",
        "achieved_rate_rps", "latency_ms", "client_cpu_percent", "distinct_requests",
    } <= set(report)  # fmt: skip
    assert set(report["latency_ms"]) == {"p50", "p95", "p99", "max", "mean"}
    assert report["service"] == "reranker" and report["method"].endswith("RerankerService/Rerank")
    assert report["distinct_requests"] == 3
    assert report["ok"] > 0


def test_human_report_for_an_open_loop(serve: Callable[[Handler], str], tmp_path: Path, capsys: Any) -> None:
    address = serve(_ok)
    args = _args("health", "--address", address, "--rate", "50", "--duration", "0.3", "--warmup", "0")
    assert asyncio.run(loadtest.run_loadtest(args, tmp_path)) == 0
    out = capsys.readouterr().out
    for word in ("throughput", "latency ms", "p99", "late starts", "client CPU", "open loop at 50"):
        assert word in out


def test_command_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--address"):
        asyncio.run(loadtest.run_loadtest(_args("health"), tmp_path))
    with pytest.raises(InputError, match="--dataset"):
        asyncio.run(loadtest.run_loadtest(_args("planner", "--address", "127.0.0.1:1"), tmp_path))
    with pytest.raises(ValueError, match="--concurrency"):
        asyncio.run(
            loadtest.run_loadtest(_args("health", "--address", "x:1", "--concurrency", "0"), tmp_path)
        )


async def test_index_vectors_come_from_the_embedder(serve: Callable[[Handler], str], dataset: Path) -> None:
    def embed(request: bytes, context: grpc.ServicerContext) -> bytes:
        texts = embedder_pb2.EmbedRequest.FromString(request).texts
        vectors = [common_pb2.Vector(values=[float(len(t)), 0.0]) for t in texts]
        return embedder_pb2.EmbedResponse(vectors=vectors).SerializeToString()

    embedder = serve(embed)
    args = _args("index", "--dataset", str(dataset), "--embedder-address", embedder, "--address", "unused:1")
    opts = loadtest.request_options(args, loadtest.TARGETS["index"])
    assert opts.collection == "tiny"
    requests = await loadtest.prepare_requests(args, "index", Path("."), opts)
    searches = [index_pb2.SearchRequest.FromString(b) for b in requests]
    assert sorted(s.vector.values[0] for s in searches) == sorted(
        float(len(q)) for q in _data(dataset).queries
    )


def test_addresses_env_beats_stack_json_beats_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("RAGMESH_RERANKER_ADDRESS", "RAGMESH_INDEX_ADDRESSES"):
        monkeypatch.delenv(var, raising=False)
    assert resolve_address("reranker", tmp_path) == "127.0.0.1:50057"
    assert resolve_address("index", tmp_path) == "127.0.0.1:50052"
    components = [
        {"name": "reranker", "kind": "reranker", "ports": {"main": 41001, "metrics": 1}},
        {"name": "index-0", "kind": "index", "ports": {"main": 41002, "metrics": 1}},
    ]
    procutil.write_json_atomic(tmp_path / STATE_FILE, {"version": STATE_VERSION, "components": components})
    assert resolve_address("reranker", tmp_path) == "127.0.0.1:41001"
    assert resolve_address("index", tmp_path) == "127.0.0.1:41002"
    monkeypatch.setenv("RAGMESH_INDEX_ADDRESSES", "shard0:1, shard1:2")
    assert resolve_address("index", tmp_path) == "shard0:1"
