"""Fake downstreams (planner, embedder, two index shards, sparse, reranker, extractor, narrator) on
real gRPC servers, and a real gateway in front of them, so deadlines, retries and breakers play out
as in production. Each fake method's behaviour is set per test: ok, fail (UNAVAILABLE), slow,
missing (NOT_FOUND), lag (answers late, within the deadline); the planner rewrites the query when it
gets a conversation (rewrite: always; huge_rewrite: a rewrite over every limit); the reranker also has
unknown_id (its reply names a passage it was not sent), the planner llm_fallback (it planned without
its LLM), the extractor and narrator degraded (their LLM failed, they answered without it) and the
narrator cut (the stream breaks after one delta)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc import aio

from meshkit.domain.ids import chunk_id_for
from meshkit.rpc.server import start_service
from meshkit.settings import GatewaySettings
from meshkit.settings.model_calibration import ModelCalibration
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.extractor.v1 import extractor_pb2, extractor_pb2_grpc
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
from ragmesh.planner.v1 import planner_pb2, planner_pb2_grpc
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from ragmesh_cli import procutil
from services.gateway.servicer import build_spec
from services.reranker.selection import select

COLLECTION = "docs"
SLOW_S = 5.0
# "lag": a slow answer that still comes well within the deadline.
LAG_S = 0.3
DOC_OF = {"c0": "alpha.md", "c1": "beta.md", "c2": "alpha.md", "c3": "gamma.md", "c4": "delta.md"}
CHUNK_ID = {name: chunk_id_for(COLLECTION, doc, name) for name, doc in DOC_OF.items()}
NAME_OF = {cid: name for name, cid in CHUNK_ID.items()}
# Dense: the same cosines for every query; c0 and c2 live on shard 0, c1 and c3 on shard 1.
DENSE_SCORES = {"c0": 0.9, "c1": 0.8, "c2": 0.7, "c3": 0.6}
SHARD_CHUNKS = [["c0", "c2"], ["c1", "c3"]]
BM25_RANKING = ["c2", "c0", "c4"]
EXACT_RANKING = ["c4"]
KEYWORDS = ["ZX-81"]
STANDALONE_PREFIX = "standalone: "
HYDE_PASSAGE = "A hypothetical passage that answers the question."
NARRATOR_DELTAS = ["The answer ", "is here [1]."]
# The fake cross-encoder's score of each chunk, whatever the query: c2 is under the threshold.
RERANK_SCORES = {"c3": 3.0, "c1": 2.0, "c4": 1.0, "c0": -1.0, "c2": -6.0}
# The reranker's defaults when a request leaves min_score / fallback_count unset.
RERANK_MIN_SCORE = -5.0
RERANK_FALLBACK_COUNT = 20


@dataclass
class Fakes:
    """What each fake does and what it was asked."""

    behaviour: dict[str, str] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    requests: dict[str, list[Any]] = field(default_factory=dict)
    # Chunk name -> the fake reranker's score (a test may lower them all to get the fallback).
    rerank_scores: dict[str, float] = field(default_factory=lambda: dict(RERANK_SCORES))
    rerank_fallback_count: int = RERANK_FALLBACK_COUNT
    # Chunk name -> its text (default "text of <name>"), its document's metadata and source.
    chunk_texts: dict[str, str] = field(default_factory=dict)
    chunk_metadata: dict[str, dict[str, str]] = field(default_factory=dict)
    chunk_sources: dict[str, str] = field(default_factory=dict)
    # The fake cross-encoder judging sentences (Rerank calls whose passages are not chunks,
    # counted and controlled as "judge"): a score per (claim, sentence), else per sentence text,
    # else the default.
    sentence_scores: dict[str | tuple[str, str], float] = field(default_factory=dict)
    default_sentence_score: float = 2.0
    # The fake BM25 leg's words of the query that no chunk holds.
    unknown_terms: list[str] = field(default_factory=list)
    novel_terms: list[str] = field(default_factory=list)
    # On: the fake legs honour with_text / with_payloads as the real ones do. Off (most tests,
    # which exercise hydration): they send no text, as an older sparse or index would.
    leg_texts: bool = False

    async def act(self, key: str, request: Any, context: aio.ServicerContext) -> None:
        self.calls[key] += 1
        self.requests.setdefault(key, []).append(request)
        mode = self.behaviour.get(key, "ok")
        if mode == "fail":
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{key} is down")
        if mode == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such collection")
        if mode == "slow":
            await asyncio.sleep(SLOW_S)
        if mode == "lag":
            await asyncio.sleep(LAG_S)


def sparse_hits(names: list[str]) -> list[sparse_pb2.SearchHit]:
    return [
        sparse_pb2.SearchHit(chunk_id=CHUNK_ID[n], doc_id=DOC_OF[n], score=10.0 - i)
        for i, n in enumerate(names)
    ]


class FakePlanner(planner_pb2_grpc.PlannerServiceServicer):
    def __init__(self, fakes: Fakes) -> None:
        self.fakes = fakes

    async def Plan(self, request: Any, context: aio.ServicerContext) -> planner_pb2.PlanResponse:
        await self.fakes.act("planner", request, context)
        # With a conversation, the fake "rewrites" the question: STANDALONE_PREFIX + the last turn.
        searched = f"{STANDALONE_PREFIX}{request.history[-1].content}" if request.history else request.query
        if self.fakes.behaviour.get("planner") == "huge_rewrite":
            searched = "x" * 100_000
        if self.fakes.behaviour.get("planner") == "rewrite":
            searched = f"{STANDALONE_PREFIX}{request.query}"
        plan = planner_pb2.Plan(
            strategy=planner_pb2.STRATEGY_PRECISE,
            pool_size=50,
            variations=[searched, f"{searched} rephrased"],
            hard_keywords=KEYWORDS,
            hyde_mode=request.hyde_mode or planner_pb2.HYDE_MODE_OFF,
            planner="deterministic",
            searched_query=searched,
        )
        if self.fakes.behaviour.get("planner") == "llm_fallback":
            return planner_pb2.PlanResponse(
                plan=plan, fallback_reason="invalid_output", fallback_message="not JSON"
            )
        return planner_pb2.PlanResponse(plan=plan)

    async def Hyde(self, request: Any, context: aio.ServicerContext) -> planner_pb2.HydeResponse:
        await self.fakes.act("hyde", request, context)
        return planner_pb2.HydeResponse(passage=HYDE_PASSAGE)


class FakeEmbedder(embedder_pb2_grpc.EmbedderServiceServicer):
    def __init__(self, fakes: Fakes) -> None:
        self.fakes = fakes

    async def Embed(self, request: Any, context: aio.ServicerContext) -> embedder_pb2.EmbedResponse:
        await self.fakes.act("embedder", request, context)
        vectors = [common_pb2.Vector(values=[float(len(t)), 0.0, 0.0, 1.0]) for t in request.texts]
        return embedder_pb2.EmbedResponse(vectors=vectors, model="fake")


class FakeIndex(index_pb2_grpc.IndexServiceServicer):
    def __init__(self, fakes: Fakes, shard: int) -> None:
        self.fakes = fakes
        self.shard = shard

    def register(self, server: aio.Server) -> None:
        index_pb2_grpc.add_IndexServiceServicer_to_server(self, server)

    async def Search(self, request: Any, context: aio.ServicerContext) -> index_pb2.SearchResponse:
        await self.fakes.act(f"index-{self.shard}", request, context)
        names = sorted(SHARD_CHUNKS[self.shard], key=lambda n: -DENSE_SCORES[n])[: request.top_k]
        hits = [
            index_pb2.SearchHit(chunk_id=CHUNK_ID[n], doc_id=DOC_OF[n], score=DENSE_SCORES[n]) for n in names
        ]
        # As the real shard: the first with_payloads hits come with their payload.
        with_payloads = request.with_payloads if self.fakes.leg_texts else 0
        chunks = [self._stored(CHUNK_ID[n]) for n in names[:with_payloads]]
        return index_pb2.SearchResponse(hits=hits, shard=self.shard, chunks=chunks)

    async def GetChunks(self, request: Any, context: aio.ServicerContext) -> index_pb2.GetChunksResponse:
        await self.fakes.act("index-chunks", request, context)
        chunks = [self._stored(c) for c in request.chunk_ids if c in NAME_OF]
        return index_pb2.GetChunksResponse(chunks=chunks)

    def _stored(self, cid: str) -> index_pb2.StoredChunk:
        return index_pb2.StoredChunk(
            chunk_id=cid,
            doc_id=DOC_OF[NAME_OF[cid]],
            text=f"payload of {NAME_OF[cid]}",
            location=common_pb2.ChunkLocation(heading_path=["H"], ordinal=1),
            source=common_pb2.DocumentSource(
                title=f"Title of {NAME_OF[cid]}",
                source_uri=f"file:///{DOC_OF[NAME_OF[cid]]}",
                metadata={"shard": str(self.shard)},
            ),
        )


class FakeSparse(sparse_pb2_grpc.SparseServiceServicer):
    def __init__(self, fakes: Fakes) -> None:
        self.fakes = fakes

    async def SearchBm25(self, request: Any, context: aio.ServicerContext) -> sparse_pb2.SearchBm25Response:
        await self.fakes.act("bm25", request, context)
        hits = sparse_hits(BM25_RANKING)
        with_text = request.with_text if self.fakes.leg_texts else 0
        return sparse_pb2.SearchBm25Response(
            hits=hits,
            unknown_terms=self.fakes.unknown_terms,
            novel_terms=self.fakes.novel_terms,
            chunks=[self._text(h.chunk_id) for h in hits[:with_text]],
        )

    async def SearchExact(self, request: Any, context: aio.ServicerContext) -> sparse_pb2.SearchExactResponse:
        await self.fakes.act("exact", request, context)
        return sparse_pb2.SearchExactResponse(hits=sparse_hits(EXACT_RANKING))

    async def GetChunks(self, request: Any, context: aio.ServicerContext) -> sparse_pb2.GetChunksResponse:
        await self.fakes.act("chunks", request, context)
        return sparse_pb2.GetChunksResponse(chunks=[self._text(c) for c in request.chunk_ids if c in NAME_OF])

    def _text(self, cid: str) -> sparse_pb2.ChunkText:
        return sparse_pb2.ChunkText(
            chunk_id=cid,
            doc_id=DOC_OF[NAME_OF[cid]],
            title=f"Title of {NAME_OF[cid]}",
            text=self.fakes.chunk_texts.get(NAME_OF[cid], f"text of {NAME_OF[cid]}"),
            location=common_pb2.ChunkLocation(heading_path=["H"], ordinal=1),
            source_uri=self.fakes.chunk_sources.get(NAME_OF[cid], ""),
            metadata=self.fakes.chunk_metadata.get(NAME_OF[cid], {}),
        )


class FakeReranker(reranker_pb2_grpc.RerankerServiceServicer):
    """Scores from ``Fakes.rerank_scores``, selected by the reranker's own threshold/fallback rule."""

    def __init__(self, fakes: Fakes) -> None:
        self.fakes = fakes

    async def Rerank(self, request: Any, context: aio.ServicerContext) -> reranker_pb2.RerankResponse:
        if any(p.id not in NAME_OF for p in request.passages):
            return await self._judge(request, context)
        await self.fakes.act("reranker", request, context)
        scores = [self.fakes.rerank_scores[NAME_OF[p.id]] for p in request.passages]
        chosen = select(
            scores,
            request.min_score if request.HasField("min_score") else RERANK_MIN_SCORE,
            request.fallback_count
            if request.HasField("fallback_count")
            else self.fakes.rerank_fallback_count,
            request.top_n,
        )
        results = [
            reranker_pb2.RerankedPassage(id=request.passages[i].id, score=scores[i], input_index=i)
            for i in chosen.order
        ]
        if self.fakes.behaviour.get("reranker") == "unknown_id":
            results.append(reranker_pb2.RerankedPassage(id="not-a-candidate", score=9.0))
        return reranker_pb2.RerankResponse(
            results=results, fallback=chosen.fallback, scored=len(scores), model="fake"
        )

    async def _judge(self, request: Any, context: aio.ServicerContext) -> reranker_pb2.RerankResponse:
        await self.fakes.act("judge", request, context)
        fakes = self.fakes
        results = [
            reranker_pb2.RerankedPassage(
                id=p.id,
                score=fakes.sentence_scores.get(
                    (request.query, p.text), fakes.sentence_scores.get(p.text, fakes.default_sentence_score)
                ),
                input_index=i,
            )
            for i, p in enumerate(request.passages)
        ]
        return reranker_pb2.RerankResponse(results=results, scored=len(results), model="fake")


class FakeExtractor(extractor_pb2_grpc.ExtractorServiceServicer):
    """One fact per passage, citing it, with the passage's score."""

    def __init__(self, fakes: Fakes) -> None:
        self.fakes = fakes

    async def Extract(self, request: Any, context: aio.ServicerContext) -> extractor_pb2.ExtractResponse:
        await self.fakes.act("extractor", request, context)
        quote = self.fakes.behaviour.get("extractor") == "quote"
        facts = [
            extractor_pb2.Fact(
                # "quote": the passage itself is the fact.
                text=p.text if quote else f"Fact from {NAME_OF[p.id]}.",
                passage_id=p.id,
                doc_id=p.doc_id,
                origin=extractor_pb2.FACT_ORIGIN_LLM,
                score=p.score,
            )
            for p in request.passages
        ]
        reply = extractor_pb2.ExtractResponse(facts=facts, mode=request.mode)
        if self.fakes.behaviour.get("extractor") == "degraded":
            reply.mode = extractor_pb2.EXTRACTION_MODE_EXTRACTIVE
            reply.degraded_reason = "unavailable: the llm is down"
        return reply


class FakeNarrator(narrator_pb2_grpc.NarratorServiceServicer):
    """Two deltas, then an answer citing source 1 (or, with no facts, that the documents do not
    say); in extractive mode, as the real one, each fact as a sentence citing its source."""

    def __init__(self, fakes: Fakes) -> None:
        self.fakes = fakes

    async def NarrateStream(self, request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        await self.fakes.act("narrator", request.request, context)
        req = request.request
        if not req.facts:
            yield narrator_pb2.NarrateStreamResponse(
                answer=narrator_pb2.Answer(text="The documents do not say.", mode=req.mode)
            )
            return
        if (
            req.mode == narrator_pb2.NARRATION_MODE_EXTRACTIVE
            and self.fakes.behaviour.get("narrator") != "cut"
        ):
            yield narrator_pb2.NarrateStreamResponse(answer=_stating(req))
            return
        for delta in NARRATOR_DELTAS:
            yield narrator_pb2.NarrateStreamResponse(delta=delta)
            if self.fakes.behaviour.get("narrator") == "cut":
                await context.abort(grpc.StatusCode.UNAVAILABLE, "narrator died mid-stream")
        source = req.sources[0]
        answer = narrator_pb2.Answer(
            text="".join(NARRATOR_DELTAS),
            sentences=[narrator_pb2.Sentence(text="".join(NARRATOR_DELTAS), sources=[1])],
            citations=[
                narrator_pb2.Citation(
                    number=1,
                    source_id=source.id,
                    doc_id=source.doc_id,
                    title=source.title,
                    snippet=source.snippet,
                )
            ],
            answered=True,
            mode=req.mode,
        )
        if self.fakes.behaviour.get("narrator") == "degraded":
            answer.degraded_reason = "deadline: the llm was late"
        yield narrator_pb2.NarrateStreamResponse(answer=answer)


def _stating(req: Any) -> narrator_pb2.Answer:
    sentences = [
        narrator_pb2.Sentence(text=f"{f.text.rstrip('.')} [{f.source}].", sources=[f.source])
        for f in req.facts
    ]
    answer = narrator_pb2.Answer(
        text=" ".join(s.text for s in sentences), sentences=sentences, answered=True, mode=req.mode
    )
    for number in sorted({f.source for f in req.facts}):
        source = req.sources[number - 1]
        answer.citations.append(
            narrator_pb2.Citation(
                number=number, source_id=source.id, doc_id=source.doc_id, title=source.title
            )
        )
    return answer


async def _server(*adders: Any) -> tuple[aio.Server, str]:
    server = aio.server()
    for add in adders:
        add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@dataclass
class Gateway:
    stub: gateway_pb2_grpc.GatewayServiceStub
    fakes: Fakes
    settings: GatewaySettings
    # The stub's channel, for other services of the gateway's port (health).
    channel: aio.Channel


@asynccontextmanager
async def running_gateway(**overrides: Any) -> AsyncIterator[Gateway]:
    """Fakes and a gateway in front of them; ``overrides`` replace the test settings below."""
    fakes = Fakes()
    mesh, mesh_address = await _server(
        lambda s: planner_pb2_grpc.add_PlannerServiceServicer_to_server(FakePlanner(fakes), s),
        lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(FakeEmbedder(fakes), s),
        lambda s: sparse_pb2_grpc.add_SparseServiceServicer_to_server(FakeSparse(fakes), s),
        lambda s: reranker_pb2_grpc.add_RerankerServiceServicer_to_server(FakeReranker(fakes), s),
        lambda s: extractor_pb2_grpc.add_ExtractorServiceServicer_to_server(FakeExtractor(fakes), s),
        lambda s: narrator_pb2_grpc.add_NarratorServiceServicer_to_server(FakeNarrator(fakes), s),
    )
    shards = [await _server(FakeIndex(fakes, i).register) for i in range(2)]
    test_settings: dict[str, Any] = dict(
        port=0,
        log_format="text",
        # The expected fused scores in the tests are computed with these, not the tuned defaults.
        gateway_rrf_k=60,
        gateway_weight_exact=0.3,
        # The fake planner service plans (its plans are the tests' fixtures); the in-process
        # planner has tests of its own.
        gateway_planner="service",
        planner_address=mesh_address,
        embedder_address=mesh_address,
        sparse_addresses=mesh_address,
        index_addresses=",".join(address for _, address in shards),
        reranker_address=mesh_address,
        extractor_address=mesh_address,
        narrator_address=mesh_address,
        # Off by default so the fusion tests see the fused order; the rerank tests ask for it.
        gateway_rerank=False,
        # The reranker's order alone, easy to assert; the blend has a test of its own.
        gateway_rerank_fused_weight=0.0,
        # The fake passages ("text of c0") share no word with the tests' questions.
        gateway_ask_gate_coverage_weight=0.0,
        gateway_ask_gate_min_score=0.0,
        # Unknown words weigh only in the tests that set their weights.
        gateway_ask_gate_unknown_penalty=0.0,
        client_retry_backoff_s=0.01,
        breaker_fail_max=5,
        breaker_reset_s=60,
        # No NATS: the collection records (meshkit.domain.collections) are unread, whatever NATS may
        # run on this machine's default port; they are tested against real NATS elsewhere.
        nats_url=f"nats://127.0.0.1:{procutil.free_ports(1)[0]}",
    )
    # Overrides named gateway_<field> of the model calibration change the calibration in force.
    merged = {**test_settings, **overrides}
    calibration = {
        name: merged.pop(f"gateway_{name}")
        for name in ModelCalibration.model_fields
        if f"gateway_{name}" in merged
    }
    settings = GatewaySettings(**merged).with_calibration(**calibration)
    running = await start_service(build_spec(settings), settings)
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield Gateway(gateway_pb2_grpc.GatewayServiceStub(channel), fakes, settings, channel)
    finally:
        await running.stop(0)
        for server in [mesh, *(s for s, _ in shards)]:
            await server.stop(0)


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    async with running_gateway() as running:
        yield running
