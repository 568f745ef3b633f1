"""What a load test sends to each stage: the workload read from a BEIR dataset and one request
builder per target (``TARGETS``), query vectors for the index."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from meshkit.domain.ids import chunk_id_for
from meshkit.text.answering import split_sentences
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2
from ragmesh.extractor.v1 import extractor_pb2
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.index.v1 import index_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from ragmesh.reranker.v1 import reranker_pb2
from ragmesh.sparse.v1 import sparse_pb2
from ragmesh_cli.channels import open_channel
from ragmesh_cli.datasets import find_corpus, load_dataset
from ragmesh_cli.documents import InputError, WalkStats, read_corpus

# Documents kept (besides the queries' relevant ones) to pad passage lists; enough variety
# without holding a large corpus in memory.
FILLER_DOCS = 2000
# About one ingested chunk (240 tokens); whole abstracts would overstate the per-passage cost.
PASSAGE_CHARS = 1200
SNIPPET_CHARS = 300
EMBED_BATCH = 32
ANSWER_MODES = ("llm", "extractive")


# ---------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str
    text: str


@dataclass
class LoadData:
    """Queries of a dataset split, each with the documents judged relevant to it, and a pool of
    other documents to pad passage lists with."""

    queries: list[str]
    relevant: list[list[str]]
    docs: dict[str, Doc]
    filler: list[str]
    vectors: list[list[float]] = field(default_factory=list)

    def passages(self, i: int, n: int) -> list[Doc]:
        """Query i's relevant documents first, then others drawn at random (the same ones for the
        same i on every run): a candidate list like the one a retrieval stage hands on."""
        chosen = [d for d in self.relevant[i] if d in self.docs][:n]
        taken = set(chosen)
        pool = [d for d in self.filler if d not in taken]
        chosen += random.Random(i).sample(pool, min(n - len(chosen), len(pool)))
        return [self.docs[d] for d in chosen]


def load_data(root: Path, split: str, limit: int, seed: int) -> LoadData:
    dataset = load_dataset(root, split)
    if not dataset.queries:
        raise InputError(f"{root}: no runnable queries in split {split!r}")
    items = list(dataset.queries.items())
    random.Random(seed).shuffle(items)
    items = items[: limit or None]
    relevant = [[d for d, grade in dataset.qrels[q].items() if grade > 0] for q, _ in items]
    wanted = {d for ids in relevant for d in ids}
    docs: dict[str, Doc] = {}
    filler: list[str] = []
    for document in read_corpus(find_corpus(root), WalkStats()):
        keep_as_filler = len(filler) < FILLER_DOCS
        if document.doc_id in wanted or keep_as_filler:
            text = document.content.decode("utf-8")[:PASSAGE_CHARS]
            docs[document.doc_id] = Doc(document.doc_id, document.title, text)
        if keep_as_filler:
            filler.append(document.doc_id)
    if not docs:
        raise InputError(f"{root}: the corpus has no documents")
    return LoadData([text for _, text in items], relevant, docs, filler)


@dataclass(frozen=True)
class RequestOptions:
    collection: str = "default"
    top_k: int = 10
    passages: int = 0
    batch: int = 1
    embed_kind: str = "query"
    answer_mode: str | None = None
    strategy: str | None = None
    rerank: bool | None = None
    health_service: str = ""


Builder = Callable[[LoadData, RequestOptions], list[Message]]


@dataclass(frozen=True)
class Target:
    # Stack component whose address is used, and its gRPC method.
    component: str
    method: str
    build: Builder
    help: str
    # Passages per request when --passages is not given (0: the target takes none).
    default_passages: int = 0
    needs_dataset: bool = True


STRATEGIES = {"precise": planner_pb2.STRATEGY_PRECISE, "exhaustive": planner_pb2.STRATEGY_EXHAUSTIVE}
_WORD = re.compile(r"[\w][\w.+-]*[\w]|\w")


def hard_keywords(query: str, most: int = 2) -> list[str]:
    """Keywords an exact search would get: identifier-like words (digits, inner capitals,
    punctuation) first, else the longest words, as a planner's hard keywords would be."""
    words = list(dict.fromkeys(_WORD.findall(query)))

    def hardness(word: str) -> tuple[bool, int]:
        odd = any(c.isdigit() for c in word) or any(c in ".+-" for c in word) or not word[1:].islower()
        return odd and len(word) > 1, len(word)

    return sorted(words, key=hardness, reverse=True)[:most]


def _strategy(opts: RequestOptions) -> planner_pb2.Strategy:
    return STRATEGIES[opts.strategy] if opts.strategy else planner_pb2.STRATEGY_UNSPECIFIED


def _build_health(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [health_pb2.HealthCheckRequest(service=opts.health_service)]


def _build_gateway(data: LoadData, opts: RequestOptions) -> list[Message]:
    out: list[Message] = []
    for query in data.queries:
        request = gateway_pb2.SearchRequest(
            collection=opts.collection, query=query, top_k=opts.top_k, strategy=_strategy(opts)
        )
        if opts.rerank is not None:
            request.rerank = opts.rerank
        out.append(request)
    return out


def _build_gateway_ask(data: LoadData, opts: RequestOptions) -> list[Message]:
    mode = {"llm": gateway_pb2.ANSWER_MODE_LLM, "extractive": gateway_pb2.ANSWER_MODE_EXTRACTIVE}
    out: list[Message] = []
    for query in data.queries:
        request = gateway_pb2.AskRequest(
            collection=opts.collection,
            query=query,
            passages=opts.passages,
            mode=mode.get(opts.answer_mode or "", gateway_pb2.ANSWER_MODE_UNSPECIFIED),
            strategy=_strategy(opts),
        )
        if opts.rerank is not None:
            request.rerank = opts.rerank
        out.append(request)
    return out


def _build_embedder(data: LoadData, opts: RequestOptions) -> list[Message]:
    if opts.embed_kind == "passage":
        texts = [doc.text for doc in data.docs.values()]
        kind = embedder_pb2.TEXT_KIND_PASSAGE
    else:
        texts, kind = data.queries, embedder_pb2.TEXT_KIND_QUERY
    batches = [texts[i : i + opts.batch] for i in range(0, len(texts), opts.batch)]
    return [embedder_pb2.EmbedRequest(texts=batch, kind=kind) for batch in batches]


def _build_index(data: LoadData, opts: RequestOptions) -> list[Message]:
    if not data.vectors:
        raise RuntimeError("index requests need query vectors (from the embedder, or --random-vectors)")
    return [
        index_pb2.SearchRequest(
            collection=opts.collection, vector=common_pb2.Vector(values=v), top_k=opts.top_k
        )
        for v in data.vectors
    ]


def _build_sparse(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [
        sparse_pb2.SearchBm25Request(collection=opts.collection, query=q, top_k=opts.top_k)
        for q in data.queries
    ]


def _build_sparse_exact(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [
        sparse_pb2.SearchExactRequest(collection=opts.collection, keywords=hard_keywords(q), top_k=opts.top_k)
        for q in data.queries
    ]


def _build_planner(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [planner_pb2.PlanRequest(query=q, strategy=_strategy(opts)) for q in data.queries]


def _build_planner_hyde(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [planner_pb2.HydeRequest(query=q) for q in data.queries]


def _passage_id(opts: RequestOptions, doc: Doc) -> str:
    return chunk_id_for(opts.collection, doc.doc_id, doc.text)


def _build_reranker(data: LoadData, opts: RequestOptions) -> list[Message]:
    return [
        reranker_pb2.RerankRequest(
            query=q,
            passages=[
                reranker_pb2.Passage(id=_passage_id(opts, d), text=f"{d.title}\n{d.text}".strip())
                for d in data.passages(i, opts.passages)
            ],
            top_n=opts.top_k,
            # The model's capacity, not the score cache's: a second run repeats the pairs.
            uncached=True,
        )
        for i, q in enumerate(data.queries)
    ]


_EXTRACTION_MODES = {
    "llm": extractor_pb2.EXTRACTION_MODE_LLM,
    "extractive": extractor_pb2.EXTRACTION_MODE_EXTRACTIVE,
}
_NARRATION_MODES = {
    "llm": narrator_pb2.NARRATION_MODE_LLM,
    "extractive": narrator_pb2.NARRATION_MODE_EXTRACTIVE,
}


def _build_extractor(data: LoadData, opts: RequestOptions) -> list[Message]:
    out: list[Message] = []
    for i, query in enumerate(data.queries):
        passages = [
            # Falling scores, as reranked passages arrive (best first).
            extractor_pb2.Passage(
                id=_passage_id(opts, d), doc_id=d.doc_id, title=d.title, text=d.text, score=4.0 - 0.5 * rank
            )
            for rank, d in enumerate(data.passages(i, opts.passages))
        ]
        mode = _EXTRACTION_MODES.get(opts.answer_mode or "", extractor_pb2.EXTRACTION_MODE_UNSPECIFIED)
        out.append(extractor_pb2.ExtractRequest(query=query, passages=passages, mode=mode))
    return out


def _build_narrator(data: LoadData, opts: RequestOptions) -> list[Message]:
    out: list[Message] = []
    for i, query in enumerate(data.queries):
        docs = data.passages(i, opts.passages)
        sources = [
            narrator_pb2.Source(
                id=_passage_id(opts, d), doc_id=d.doc_id, title=d.title, snippet=d.text[:SNIPPET_CHARS]
            )
            for d in docs
        ]
        # One fact per source, its first sentence, as the extractor's extractive mode would give.
        facts = [
            narrator_pb2.Fact(text=(split_sentences(d.text) or [d.text])[0], source=n, score=4.0 - 0.5 * n)
            for n, d in enumerate(docs, start=1)
        ]
        mode = _NARRATION_MODES.get(opts.answer_mode or "", narrator_pb2.NARRATION_MODE_UNSPECIFIED)
        out.append(narrator_pb2.NarrateRequest(query=query, sources=sources, facts=facts, mode=mode))
    return out


TARGETS: dict[str, Target] = {
    "health": Target(
        "",
        "/grpc.health.v1.Health/Check",
        _build_health,
        "grpc.health.v1 Check on --address (any service; the driver's ceiling)",
        needs_dataset=False,
    ),
    "gateway": Target("gateway", "/ragmesh.gateway.v1.GatewayService/Search", _build_gateway, "Search"),
    "gateway-ask": Target(
        "gateway", "/ragmesh.gateway.v1.GatewayService/Ask", _build_gateway_ask, "Ask (answers)"
    ),
    "embedder": Target(
        "embedder", "/ragmesh.embedder.v1.EmbedderService/Embed", _build_embedder, "Embed queries or passages"
    ),
    "index": Target(
        "index", "/ragmesh.index.v1.IndexService/Search", _build_index, "vector Search on one shard"
    ),
    "sparse": Target("sparse", "/ragmesh.sparse.v1.SparseService/SearchBm25", _build_sparse, "BM25 search"),
    "sparse-exact": Target(
        "sparse", "/ragmesh.sparse.v1.SparseService/SearchExact", _build_sparse_exact, "exact keyword search"
    ),
    "planner": Target("planner", "/ragmesh.planner.v1.PlannerService/Plan", _build_planner, "Plan"),
    "planner-hyde": Target(
        "planner", "/ragmesh.planner.v1.PlannerService/Hyde", _build_planner_hyde, "Hyde passage"
    ),
    "reranker": Target(
        "reranker",
        "/ragmesh.reranker.v1.RerankerService/Rerank",
        _build_reranker,
        "Rerank a query's passages",
        default_passages=35,
    ),
    "extractor": Target(
        "extractor",
        "/ragmesh.extractor.v1.ExtractorService/Extract",
        _build_extractor,
        "Extract facts from passages",
        default_passages=10,
    ),
    "narrator": Target(
        "narrator",
        "/ragmesh.narrator.v1.NarratorService/Narrate",
        _build_narrator,
        "Narrate an answer from sources and facts",
        default_passages=5,
    ),
}


def random_unit_vectors(count: int, dimension: int, seed: int) -> list[list[float]]:
    matrix = np.random.default_rng(seed).standard_normal((count, dimension)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return [row.tolist() for row in matrix]


async def embed_queries(address: str, queries: Sequence[str], timeout_s: float) -> list[list[float]]:
    async with open_channel(address) as channel:
        embed = channel.unary_unary(
            TARGETS["embedder"].method,
            request_serializer=embedder_pb2.EmbedRequest.SerializeToString,
            response_deserializer=embedder_pb2.EmbedResponse.FromString,
        )
        vectors: list[list[float]] = []
        for start in range(0, len(queries), EMBED_BATCH):
            batch = list(queries[start : start + EMBED_BATCH])
            request = embedder_pb2.EmbedRequest(texts=batch, kind=embedder_pb2.TEXT_KIND_QUERY)
            reply = await embed(request, timeout=timeout_s)
            vectors += [list(v.values) for v in reply.vectors]
        return vectors


async def index_dimension(address: str, collection: str, timeout_s: float) -> int:
    async with open_channel(address) as channel:
        stats = channel.unary_unary(
            "/ragmesh.index.v1.IndexService/GetStats",
            request_serializer=index_pb2.GetStatsRequest.SerializeToString,
            response_deserializer=index_pb2.GetStatsResponse.FromString,
        )
        reply = await stats(index_pb2.GetStatsRequest(collection=collection), timeout=timeout_s)
        if not reply.dimension:
            raise RuntimeError(f"collection {collection!r} has no vectors yet: give --dimension")
        return int(reply.dimension)
