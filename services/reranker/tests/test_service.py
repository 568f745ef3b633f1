from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from meshkit.domain.ids import sha256_file
from meshkit.inference.onnxrt import CPU_PROVIDER
from meshkit.rpc.server import RunningService, start_service
from meshkit.settings import RerankerSettings
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc
from services.reranker.model import MODEL_FILE, CrossEncoderModel
from services.reranker.servicer import RerankerServicer, build_spec
from services.reranker.tests.conftest import MAX_TOKENS, MODEL_NAME, ModelDirFactory

MAX_PASSAGES = 8
MAX_PASSAGE_CHARS = 600
MAX_QUERY_CHARS = 100
# Long enough that concurrent callers land in one window even on a busy machine.
WINDOW_MS = 20.0
DEFAULT_MIN_SCORE = -5.0
DEFAULT_FALLBACK = 20


@dataclass
class Server:
    running: RunningService
    servicer: RerankerServicer
    stub: reranker_pb2_grpc.RerankerServiceStub
    channel: aio.Channel


def service_settings(**overrides: float | int) -> RerankerSettings:
    return RerankerSettings(
        reranker_provider="cpu",
        log_format="text",
        port=0,
        reranker_max_passages=MAX_PASSAGES,
        reranker_max_passage_chars=MAX_PASSAGE_CHARS,
        reranker_max_query_chars=MAX_QUERY_CHARS,
        reranker_batch_window_ms=WINDOW_MS,
        reranker_min_score=DEFAULT_MIN_SCORE,
        reranker_fallback_count=DEFAULT_FALLBACK,
    ).model_copy(update=overrides)


async def serve(model: CrossEncoderModel, **overrides: float | int) -> Server:
    settings = service_settings(**overrides)
    spec, servicer = build_spec(settings, model)
    running = await start_service(spec, settings)
    channel = aio.insecure_channel(f"127.0.0.1:{running.port}")
    return Server(running, servicer, reranker_pb2_grpc.RerankerServiceStub(channel), channel)


async def shut(server: Server) -> None:
    await server.channel.close(None)
    await server.running.stop(1.0)


@pytest.fixture(scope="module")
async def server(cell_model: CrossEncoderModel) -> AsyncIterator[Server]:
    # No score cache: the tests count model runs and pairs scored across repeated requests.
    started = await serve(cell_model, reranker_score_cache_pairs=0)
    yield started
    await shut(started)


@pytest.fixture
def stub(server: Server) -> reranker_pb2_grpc.RerankerServiceStub:
    return server.stub


def request(
    query: str,
    texts: Sequence[str],
    *,
    top_n: int = 0,
    min_score: float | None = None,
    fallback_count: int | None = None,
) -> reranker_pb2.RerankRequest:
    passages = [reranker_pb2.Passage(id=f"p{i}", text=text) for i, text in enumerate(texts)]
    return reranker_pb2.RerankRequest(
        query=query, passages=passages, top_n=top_n, min_score=min_score, fallback_count=fallback_count
    )


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


# Scores under the cell-counting graph, query "cell" counting 1: 1, 3, 2, 3.
TEXTS = ["no match here", "cell and cell", "one cell", "cell then cell"]


async def test_health_is_serving(server: Server) -> None:
    health = health_pb2_grpc.HealthStub(server.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="ragmesh.reranker.v1.RerankerService"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_rerank_orders_by_score_and_echoes_the_passages(
    stub: reranker_pb2_grpc.RerankerServiceStub,
) -> None:
    pairs_before = counter("ragmesh_reranker_pairs_total")
    reply = await stub.Rerank(request("cell", TEXTS), timeout=10)
    assert [r.id for r in reply.results] == ["p1", "p3", "p2", "p0"]
    assert [r.input_index for r in reply.results] == [1, 3, 2, 0]
    assert [r.score for r in reply.results] == [3.0, 3.0, 2.0, 1.0]
    assert not any(r.truncated for r in reply.results)
    assert not reply.fallback
    assert reply.scored == len(TEXTS)
    assert reply.model == MODEL_NAME
    assert counter("ragmesh_reranker_pairs_total") - pairs_before == len(TEXTS)


async def test_long_passages_are_cut_and_flagged(stub: reranker_pb2_grpc.RerankerServiceStub) -> None:
    truncated_before = counter("ragmesh_reranker_truncated_total")
    long_text = "word " * (2 * MAX_TOKENS) + "cell"
    reply = await stub.Rerank(request("cell", ["cell here", long_text]), timeout=10)
    flags = {r.id: (r.truncated, r.score) for r in reply.results}
    # The long passage's match lies past the cut: only the query's own "cell" counts.
    assert flags == {"p0": (False, 2.0), "p1": (True, 1.0)}
    assert counter("ragmesh_reranker_truncated_total") - truncated_before == 1


async def test_top_n_cuts(stub: reranker_pb2_grpc.RerankerServiceStub) -> None:
    reply = await stub.Rerank(request("cell", TEXTS, top_n=2), timeout=10)
    assert [r.id for r in reply.results] == ["p1", "p3"]
    assert reply.scored == len(TEXTS)


async def test_min_score_per_request(stub: reranker_pb2_grpc.RerankerServiceStub) -> None:
    reply = await stub.Rerank(request("cell", TEXTS, min_score=2.0), timeout=10)
    assert [r.id for r in reply.results] == ["p1", "p3", "p2"]
    assert not reply.fallback


async def test_server_defaults_apply_when_unset(cell_model: CrossEncoderModel) -> None:
    started = await serve(cell_model, reranker_min_score=2.5, reranker_fallback_count=1)
    try:
        passing = await started.stub.Rerank(request("cell", TEXTS), timeout=10)
        failing = await started.stub.Rerank(request("x", TEXTS), timeout=10)
    finally:
        await shut(started)
    assert [r.id for r in passing.results] == ["p1", "p3"]
    assert not passing.fallback
    assert [(r.id, r.score) for r in failing.results] == [("p0", 0.0)]
    assert failing.fallback


async def test_nothing_passing_falls_back_to_request_order(
    stub: reranker_pb2_grpc.RerankerServiceStub,
) -> None:
    fallbacks_before = counter("ragmesh_reranker_fallback_total")
    reply = await stub.Rerank(request("cell", TEXTS, min_score=10.0, fallback_count=2), timeout=10)
    assert reply.fallback
    assert [(r.id, r.input_index, r.score) for r in reply.results] == [("p0", 0, 1.0), ("p1", 1, 3.0)]
    assert counter("ragmesh_reranker_fallback_total") - fallbacks_before == 1


async def test_fallback_uses_the_server_default_count(stub: reranker_pb2_grpc.RerankerServiceStub) -> None:
    reply = await stub.Rerank(request("cell", TEXTS, min_score=10.0), timeout=10)
    assert reply.fallback
    assert [r.id for r in reply.results] == ["p0", "p1", "p2", "p3"]  # default 20 capped by the passages


async def test_fallback_count_zero_returns_nothing(stub: reranker_pb2_grpc.RerankerServiceStub) -> None:
    reply = await stub.Rerank(request("cell", TEXTS, min_score=10.0, fallback_count=0), timeout=10)
    assert reply.fallback
    assert list(reply.results) == []
    assert reply.scored == len(TEXTS)


def passages(*pairs: tuple[str, str]) -> list[reranker_pb2.Passage]:
    return [reranker_pb2.Passage(id=i, text=t) for i, t in pairs]


@pytest.mark.parametrize(
    ("request_", "code", "fragment"),
    [
        (request("", ["a"]), grpc.StatusCode.INVALID_ARGUMENT, "query is empty"),
        (request("  \n", ["a"]), grpc.StatusCode.INVALID_ARGUMENT, "query is empty"),
        (request("q", []), grpc.StatusCode.INVALID_ARGUMENT, "at least one passage"),
        (
            reranker_pb2.RerankRequest(query="q", passages=passages(("a", "x"), ("", "y"))),
            grpc.StatusCode.INVALID_ARGUMENT,
            "passages[1].id",
        ),
        (
            reranker_pb2.RerankRequest(query="q", passages=passages(("a", "x"), ("b", "y"), ("a", "z"))),
            grpc.StatusCode.INVALID_ARGUMENT,
            "passages[2].id 'a' is repeated",
        ),
        (
            reranker_pb2.RerankRequest(query="q", passages=passages(("a", "x"), ("b", " \t"))),
            grpc.StatusCode.INVALID_ARGUMENT,
            "passages[1].text is empty",
        ),
        (request("q", ["a"], min_score=math.nan), grpc.StatusCode.INVALID_ARGUMENT, "finite"),
        (request("q", ["a"], min_score=math.inf), grpc.StatusCode.INVALID_ARGUMENT, "finite"),
        (
            request("q", ["a"], fallback_count=MAX_PASSAGES + 1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "fallback_count",
        ),
        (
            request("q", ["a"] * (MAX_PASSAGES + 1)),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the limit is {MAX_PASSAGES}",
        ),
        (
            request("q", ["a", "b" * (MAX_PASSAGE_CHARS + 1)]),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "passages[1].text",
        ),
        (
            request("q" * (MAX_QUERY_CHARS + 1), ["a"]),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the limit is {MAX_QUERY_CHARS}",
        ),
    ],
)
async def test_bad_requests_are_rejected(
    stub: reranker_pb2_grpc.RerankerServiceStub,
    request_: reranker_pb2.RerankRequest,
    code: grpc.StatusCode,
    fragment: str,
) -> None:
    with pytest.raises(aio.AioRpcError) as err:
        await stub.Rerank(request_, timeout=10)
    assert err.value.code() == code
    assert fragment in (err.value.details() or "")


async def test_limits_are_inclusive(stub: reranker_pb2_grpc.RerankerServiceStub) -> None:
    reply = await stub.Rerank(
        request("q" * MAX_QUERY_CHARS, ["b" * MAX_PASSAGE_CHARS] + ["t"] * (MAX_PASSAGES - 1)),
        timeout=10,
    )
    assert reply.scored == MAX_PASSAGES


async def test_model_info(stub: reranker_pb2_grpc.RerankerServiceStub, cell_model: CrossEncoderModel) -> None:
    info = await stub.GetModelInfo(reranker_pb2.GetModelInfoRequest(), timeout=10)
    assert info.model == MODEL_NAME
    assert info.head == reranker_pb2.HEAD_SINGLE_LOGIT
    assert info.max_tokens == MAX_TOKENS
    assert info.max_batch == cell_model.max_batch
    assert info.provider == CPU_PROVIDER
    assert info.model_sha256 == cell_model.model_sha256
    assert info.default_min_score == DEFAULT_MIN_SCORE
    assert info.default_fallback_count == DEFAULT_FALLBACK
    assert info.max_passages == MAX_PASSAGES


async def test_model_info_of_a_two_class_model(make_model_dir: ModelDirFactory) -> None:
    model_dir = make_model_dir(width=2, head="two_class")
    model = CrossEncoderModel.load(model_dir, provider="cpu")
    started = await serve(model)
    try:
        info = await started.stub.GetModelInfo(reranker_pb2.GetModelInfoRequest(), timeout=10)
        reply = await started.stub.Rerank(request("cell", ["cell", "none"]), timeout=10)
    finally:
        await shut(started)
    assert info.head == reranker_pb2.HEAD_TWO_CLASS
    assert info.model_sha256 == sha256_file(model_dir / MODEL_FILE)
    assert [(r.id, r.score) for r in reply.results] == [("p0", 4.0), ("p1", 2.0)]


async def test_concurrent_calls_share_model_runs(server: Server) -> None:
    calls = 8
    runs_before = server.servicer.batcher.model_runs
    replies = await asyncio.gather(
        *(server.stub.Rerank(request("cell", ["cell " * i + "end", "end"]), timeout=10) for i in range(calls))
    )
    runs = server.servicer.batcher.model_runs - runs_before
    assert 1 <= runs < calls
    # Each caller gets its own rows back, whatever run they were scored in.
    for i, reply in enumerate(replies):
        assert {r.id: r.score for r in reply.results} == {"p0": float(1 + i), "p1": 1.0}


async def test_pairs_asked_again_come_from_the_score_cache(cell_model: CrossEncoderModel) -> None:
    server = await serve(cell_model, reranker_score_cache_pairs=3)
    try:
        first = await server.stub.Rerank(request("cell", TEXTS[:3]), timeout=10)
        runs = server.servicer.batcher.model_runs
        pairs = counter("ragmesh_reranker_pairs_total")
        hits = counter("ragmesh_reranker_cache_hits_total")
        again = await server.stub.Rerank(request("cell", TEXTS[:3]), timeout=10)
        # The same answer, without running the model.
        assert [(r.id, r.score) for r in again.results] == [(r.id, r.score) for r in first.results]
        assert server.servicer.batcher.model_runs == runs
        assert counter("ragmesh_reranker_cache_hits_total") - hits == 3
        # A new pair runs alone; the oldest pair then leaves the cache (capacity 3).
        mixed = await server.stub.Rerank(request("cell", [TEXTS[3], TEXTS[1]]), timeout=10)
        assert {r.id: r.score for r in mixed.results} == {"p0": 3.0, "p1": 3.0}
        assert counter("ragmesh_reranker_pairs_total") - pairs == 1
        assert len(server.servicer.cache) == 3
        # Another query is another pair.
        other = await server.stub.Rerank(request("end", TEXTS[:1]), timeout=10)
        assert counter("ragmesh_reranker_pairs_total") - pairs == 2 and other.results
        # uncached: every pair runs, cached or not.
        fresh = request("cell", [TEXTS[3], TEXTS[1]])
        fresh.uncached = True
        await server.stub.Rerank(fresh, timeout=10)
        assert counter("ragmesh_reranker_pairs_total") - pairs == 4
    finally:
        await shut(server)
