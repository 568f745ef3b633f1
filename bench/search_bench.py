"""Search latency and throughput through the gateway against the same stages composed
in-process, without gRPC: what the mesh costs on the read path.

    make bench            # or: .venv/bin/python -m bench.search_bench --dataset ../shared/bench/scifact

The mesh (ragmesh_cli.stack.Stack) ingests a corpus into a fresh state directory with the CLI,
then stops so every store writes its final snapshot. Its index and sparse data are copied for
the in-process side, and the read path (planner, embedder, index shards, sparse, gateway) starts
again on the original. The in-process side opens the copies with the services' own classes
and runs the gateway's flow as plain calls in one process: the deterministic planner, one
micro-batched embedding of every variation, every shard per variation, BM25 and exact in
parallel, the gateway's own fusion code, hydration of the top k. Blocking work goes to
thread pools, one per store, as each service runs it in its own process.

Both sides answer the SciFact test claims (top_k 10, server defaults for the rest) at
concurrency 1 and 8, after a warm-up, alternating sides in ABBA order over the passes so
drift on a shared machine falls on both. The warm-up also checks that both sides return the
same top-10 chunks: otherwise the comparison would not be of the same work.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench.common import cli_ingest, collection_counts, corpus_file
from meshkit.rpc.server import start_service
from meshkit.settings import EmbedderSettings, GatewaySettings, IndexSettings, PlannerSettings, SparseSettings
from ragmesh_cli.stack import Stack
from ragmesh_client import AsyncClient, RetryPolicy
from services.embedder.batcher import EmbedBatcher
from services.embedder.model import EmbeddingModel, TextKind
from services.gateway.fusion import Hit, combine_variations, merge_by_score, rrf
from services.gateway.servicer import build_spec as gateway_build_spec
from services.gateway.validation import BM25, DEFAULT_TOP_K, DENSE, EXACT
from services.index.shard import policy_of
from services.index.store import CollectionIndex
from services.planner.deterministic import DeterministicPlanner, PoolSizes
from services.planner.plan import PlanInput
from services.sparse.collection import Collection
from services.sparse.exact import find_ripgrep, normalise_keywords, rank, ripgrep_counts
from services.sparse.servicer import exact_phrase

T = TypeVar("T")

COLLECTION = "bench"
INPROC, GATEWAY = "in-process", "gateway"
CONCURRENCY = (1, 8)
# The read path: ingestion and its workers stay down while searches are measured.
READ_SERVICES = ("embedder", "index", "sparse", "planner", "gateway")
CALL_TIMEOUT_S = 60.0
# What asyncio.to_thread uses in each service process: the same pool size per store here.
POOL_THREADS = min(32, (os.cpu_count() or 1) + 4)


@dataclass(frozen=True)
class Answer:
    chunk_ids: tuple[str, ...]
    degraded: bool


SearchFn = Callable[[str], Awaitable[Answer]]


@dataclass
class LoadRun:
    latencies_s: list[float]
    wall_s: float
    answers: list[Answer]


def load_queries(dataset: Path) -> list[str]:
    """The test claims, in the order qrels/test.tsv first names them."""
    texts = {}
    with (dataset / "queries.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                texts[str(row["_id"])] = row["text"]
    ids: dict[str, None] = {}
    with (dataset / "qrels" / "test.tsv").open(encoding="utf-8") as handle:
        next(handle)  # header
        for line in handle:
            if line.strip():
                ids.setdefault(line.split("\t")[0], None)
    return [texts[i] for i in ids]


class InProcessSearch:
    """The gateway's search flow over the stores' own classes, in this process, no gRPC."""

    def __init__(
        self,
        gateway: GatewaySettings,
        planner_settings: PlannerSettings,
        sparse_settings: SparseSettings,
        batcher: EmbedBatcher,
        shards: Sequence[CollectionIndex],
        sparse: Collection,
    ) -> None:
        self.gateway = gateway
        self.planner_settings = planner_settings
        self.planner = DeterministicPlanner(
            PoolSizes(planner_settings.planner_precise_pool, planner_settings.planner_exhaustive_pool),
            planner_settings.planner_max_keywords,
        )
        self.sparse_settings = sparse_settings
        self.rg = find_ripgrep()
        self.batcher = batcher
        self.shards = list(shards)
        self.sparse = sparse
        self.weights = {
            DENSE: gateway.gateway_weight_dense,
            BM25: gateway.gateway_weight_bm25,
            EXACT: gateway.gateway_weight_exact,
        }
        self.index_pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="index")
        self.sparse_pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="sparse")

    @classmethod
    async def open(cls, state_dir: Path, index_shards: int) -> InProcessSearch:
        """Open the stores under ``state_dir`` (a copy of the mesh's data) and load the model."""
        policy = policy_of(IndexSettings())
        shards = [
            await asyncio.to_thread(
                CollectionIndex.open,
                COLLECTION,
                state_dir / f"index-{i}" / COLLECTION,
                policy,
                shard=i,
                shard_count=index_shards,
            )
            for i in range(index_shards)
        ]
        sparse_settings = SparseSettings()
        sparse = await asyncio.to_thread(
            Collection.open,
            state_dir / "sparse",
            COLLECTION,
            sparse_settings.sparse_writer_heap_bytes,
            sparse_settings.sparse_title_boost,
        )
        embedder = EmbedderSettings()
        model = await asyncio.to_thread(EmbeddingModel.load, embedder)
        batcher = EmbedBatcher(
            model.embed_with_flags,
            max_batch=embedder.embedder_max_batch,
            window_s=embedder.embedder_batch_window_ms / 1000.0,
            max_queued_texts=embedder.embedder_max_queued_texts,
        )
        await batcher.start()
        return cls(GatewaySettings(), PlannerSettings(), sparse_settings, batcher, shards, sparse)

    async def close(self) -> None:
        await self.batcher.stop()
        for shard in self.shards:
            shard.close()
        self.sparse.close()
        self.index_pool.shutdown()
        self.sparse_pool.shutdown()

    async def _in(self, pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def _collection(self) -> Collection:
        return self.sparse

    def _plan(self, query: str) -> tuple[list[str], list[str], int]:
        """Dense texts, hard keywords and pool size, as the gateway uses the planner's plan."""
        plan = self.planner.plan_sync(
            PlanInput(query, None, self.planner_settings.planner_deterministic_variations, None)
        )
        gateway = self.gateway
        variations = list(dict.fromkeys([query, *(v for v in plan.variations if v.strip())]))
        keywords = list(dict.fromkeys(k for k in plan.hard_keywords if k.strip()))
        texts = variations[: gateway.gateway_max_variations]
        if plan.hyde_passage.strip():
            texts.append(plan.hyde_passage)
        pool = min(max(plan.pool_size, DEFAULT_TOP_K), gateway.gateway_max_pool_size)
        return texts, keywords[: gateway.gateway_max_keywords], pool

    async def search(self, query: str) -> Answer:
        texts, keywords, pool = self._plan(query)
        legs: dict[str, Awaitable[list[Hit]]] = {}
        if self.weights[DENSE] > 0:
            legs[DENSE] = self._dense(texts, pool)
        if self.weights[BM25] > 0:
            legs[BM25] = self._bm25(query, pool)
        if self.weights[EXACT] > 0 and keywords:
            legs[EXACT] = self._exact(keywords, pool)
        lists = dict(zip(legs, await asyncio.gather(*legs.values()), strict=True))
        top = rrf(lists, self.weights, self.gateway.gateway_rrf_k)[:DEFAULT_TOP_K]
        collection = await self._collection()
        records = await self._in(self.sparse_pool, collection.get_chunks, [f.chunk_id for f in top])
        present = {r.chunk_id for r in records}
        return Answer(tuple(f.chunk_id for f in top if f.chunk_id in present), False)

    async def _dense(self, texts: list[str], pool: int) -> list[Hit]:
        vectors, _ = await self.batcher.embed(texts, TextKind.QUERY)
        answers = await asyncio.gather(*(self._shard(shard, vectors, pool) for shard in self.shards))
        per_text = [merge_by_score((answer[i] for answer in answers), pool) for i in range(len(texts))]
        return combine_variations(
            per_text, self.gateway.gateway_rrf_k, pool, self.gateway.gateway_dense_combine
        )

    async def _shard(self, shard: CollectionIndex, vectors: np.ndarray, pool: int) -> list[list[Hit]]:
        found = await asyncio.gather(
            *(self._in(self.index_pool, shard.search, vector, pool, None) for vector in vectors)
        )
        return [[Hit(h.chunk_id, h.doc_id, h.score) for h in hits] for hits in found]

    async def _bm25(self, query: str, pool: int) -> list[Hit]:
        collection = await self._collection()
        hits = await self._in(self.sparse_pool, collection.search_bm25, query, pool, [])
        return [Hit(h.chunk_id, h.doc_id, h.score) for h in hits]

    async def _exact(self, raw: list[str], pool: int) -> list[Hit]:
        keywords = normalise_keywords(raw)
        collection = await self._collection()
        if self.sparse_settings.sparse_exact_mode == "ripgrep":
            if self.rg is None:
                raise RuntimeError("sparse_exact_mode is 'ripgrep' but no rg binary was found")
            counts = await ripgrep_counts(
                self.rg, collection.files.root, keywords, self.sparse_settings.sparse_exact_timeout_s
            )
            doc_of = await self._in(self.sparse_pool, collection.live_documents, counts.keys(), [])
            hits = rank(counts, doc_of, keywords, pool)
        else:
            hits = await self._in(self.sparse_pool, exact_phrase, collection, keywords, pool, [])
        return [Hit(h.chunk_id, h.doc_id, h.score) for h in hits]


def gateway_client(address: str) -> AsyncClient:
    """A client of the gateway that never retries: a retried search would hide its failure in
    a latency."""
    return AsyncClient(address, retry=RetryPolicy(max_attempts=1))


def gateway_search(client: AsyncClient) -> SearchFn:
    async def search(query: str) -> Answer:
        # The retrieval path is what is compared; the reranker tier has its own benchmark.
        reply = await client.search(
            COLLECTION, query, top_k=DEFAULT_TOP_K, rerank=False, timeout=CALL_TIMEOUT_S
        )
        return Answer(tuple(r.chunk_id for r in reply.results), bool(reply.degradations))

    return search


async def run_load(search: SearchFn, queries: Sequence[str], concurrency: int) -> LoadRun:
    """Every query once, ``concurrency`` searches in flight at a time."""
    latencies = [0.0] * len(queries)
    answers: list[Answer | None] = [None] * len(queries)
    pending = iter(range(len(queries)))

    async def client() -> None:
        for i in pending:  # one shared iterator: each query is taken by one client
            started = time.perf_counter()
            answers[i] = await search(queries[i])
            latencies[i] = time.perf_counter() - started

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return LoadRun(latencies, wall, [a for a in answers if a is not None])


def pass_order(pass_no: int) -> list[tuple[str, int]]:
    """ABBA: even passes run in-process first, odd passes the reverse sequence."""
    order = [(side, c) for c in CONCURRENCY for side in (INPROC, GATEWAY)]
    return order if pass_no % 2 == 0 else order[::-1]


def summary(runs: Sequence[LoadRun]) -> dict[str, float]:
    latencies = [s * 1000 for run in runs for s in run.latencies_s]
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    searches = len(latencies)
    return {
        "searches": searches,
        "p50_ms": cuts[49],
        "p95_ms": cuts[94],
        "mean_ms": statistics.fmean(latencies),
        "searches_per_s": searches / sum(run.wall_s for run in runs),
    }


async def measure(
    gateway_address: str, copy_dir: Path, index_shards: int, queries: list[str], passes: int
) -> dict[str, Any]:
    inproc = await InProcessSearch.open(copy_dir, index_shards)
    try:
        async with gateway_client(gateway_address) as client:
            searches = {INPROC: inproc.search, GATEWAY: gateway_search(client)}
            warm = {side: await run_load(fn, queries, max(CONCURRENCY)) for side, fn in searches.items()}
            same = sum(
                a.chunk_ids == b.chunk_ids
                for a, b in zip(warm[INPROC].answers, warm[GATEWAY].answers, strict=True)
            )
            print(f"warm-up done: identical top-{DEFAULT_TOP_K} on {same}/{len(queries)} queries", flush=True)
            runs: dict[tuple[str, int], list[LoadRun]] = {}
            for pass_no in range(passes):
                for side, concurrency in pass_order(pass_no):
                    run = await run_load(searches[side], queries, concurrency)
                    runs.setdefault((side, concurrency), []).append(run)
                    p50 = statistics.median(run.latencies_s) * 1000
                    print(f"pass {pass_no + 1} {side} c={concurrency}: p50 {p50:.1f} ms", flush=True)
    finally:
        await inproc.close()
    degraded = sum(a.degraded for run in runs.values() for r in run for a in r.answers)
    return {
        "identical_top_k": same / len(queries),
        "gateway_degraded_searches": degraded,
        "results": {f"{side} c={c}": summary(r) for (side, c), r in runs.items()},
    }


# Frames of the profile summary, by self time and by cumulative time.
PROFILE_TOP = 25


async def profile_gateway(env: dict[str, str], queries: Sequence[str], out: Path) -> str:
    """One pass of searches at concurrency 1 through a gateway run in this process (against
    the same read path) under cProfile: where a search's time goes in the gateway. The client's
    calls are in the profile too (a small part; their frames are grpc's). Writes the raw
    profile to ``out`` and returns the summary."""
    fields: dict[str, Any] = {**_settings_of(env), "port": 0, "log_format": "text"}
    settings = GatewaySettings(**fields)
    running = await start_service(gateway_build_spec(settings), settings)
    profiler = cProfile.Profile()
    try:
        async with gateway_client(f"127.0.0.1:{running.port}") as client:
            search = gateway_search(client)
            await run_load(search, queries[:10], 1)  # warm
            profiler.enable()
            run = await run_load(search, queries, 1)
            profiler.disable()
    finally:
        await running.stop(0)
    profiler.dump_stats(out)
    report = io.StringIO()
    stats = pstats.Stats(profiler, stream=report).strip_dirs()
    p50 = statistics.median(run.latencies_s) * 1000
    report.write(f"{len(queries)} searches at c=1 in one process, p50 {p50:.1f} ms\n")
    stats.sort_stats("tottime").print_stats(PROFILE_TOP)
    stats.sort_stats("cumulative").print_stats(PROFILE_TOP)
    return report.getvalue()


def _settings_of(env: dict[str, str]) -> dict[str, str]:
    """The mesh wiring (addresses, state dir) of ``env`` as GatewaySettings fields."""
    prefix = "RAGMESH_"
    fields = GatewaySettings.model_fields
    return {k[len(prefix) :].lower(): v for k, v in env.items() if k[len(prefix) :].lower() in fields}


def copy_stores(state_dir: Path, target: Path, index_shards: int) -> None:
    for name in [*(f"index-{i}" for i in range(index_shards)), "sparse"]:
        shutil.copytree(state_dir / name, target / name)


def ratios(results: dict[str, dict[str, float]]) -> dict[str, float]:
    def ratio(c: int, key: str) -> float:
        return results[f"{GATEWAY} c={c}"][key] / results[f"{INPROC} c={c}"][key]

    out = {f"{key}_c{c}": ratio(c, key) for c in CONCURRENCY for key in ("p50_ms", "p95_ms")}
    out["searches_per_s_c8"] = ratio(8, "searches_per_s")
    return out


def comparison(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """The figures to compare across changes, gateway against in-process: the side-by-side
    ratios (``p50_ratio_c1``, ``p50_ratio_c8``, ``throughput_ratio_c8``) and the raw p50s and
    throughputs they come from."""
    cell = {(side, c): results[f"{side} c={c}"] for side in (INPROC, GATEWAY) for c in CONCURRENCY}
    out: dict[str, float] = {}
    for c in CONCURRENCY:
        out[f"p50_ratio_c{c}"] = cell[(GATEWAY, c)]["p50_ms"] / cell[(INPROC, c)]["p50_ms"]
    out["throughput_ratio_c8"] = cell[(GATEWAY, 8)]["searches_per_s"] / cell[(INPROC, 8)]["searches_per_s"]
    for side, name in ((GATEWAY, "gateway"), (INPROC, "inproc")):
        for c in CONCURRENCY:
            out[f"{name}_p50_ms_c{c}"] = cell[(side, c)]["p50_ms"]
        out[f"{name}_searches_per_s_c8"] = cell[(side, 8)]["searches_per_s"]
    return {key: round(value, 4) for key, value in out.items()}


def print_table(result: dict[str, Any]) -> None:
    results, ratio = result["results"], result["gateway_vs_in_process"]
    print()
    print(f"| measure | {INPROC} | {GATEWAY} | gateway / in-process |")
    print("|---|---|---|---|")
    for c in CONCURRENCY:
        for key, label in (("p50_ms", "p50"), ("p95_ms", "p95")):
            a, b = results[f"{INPROC} c={c}"][key], results[f"{GATEWAY} c={c}"][key]
            print(f"| {label} latency, c={c} (ms) | {a:.1f} | {b:.1f} | {ratio[f'{key}_c{c}']:.2f}x |")
    a, b = (results[f"{side} c=8"]["searches_per_s"] for side in (INPROC, GATEWAY))
    print(f"| throughput, c=8 (searches/s) | {a:.1f} | {b:.1f} | {ratio['searches_per_s_c8']:.2f}x |")
    corpus = result["corpus"]
    print(
        f"\n{corpus['documents']} documents, {corpus['chunks']} chunks, {result['queries']} queries x "
        f"{result['passes']} passes per cell; identical top-{DEFAULT_TOP_K}: "
        f"{result['identical_top_k']:.1%}; degraded gateway searches: {result['gateway_degraded_searches']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, default=Path("../shared/bench/scifact"))
    parser.add_argument("--limit-docs", type=int, default=1000, help="documents to ingest (0: all)")
    parser.add_argument("--limit-queries", type=int, default=0, help="test claims to ask (0: all 300)")
    parser.add_argument("--passes", type=int, default=2, help="measured passes over the queries")
    parser.add_argument("--index-shards", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600, help="ingestion timeout, seconds")
    parser.add_argument("--out", type=Path, default=Path("bench/results/search.json"))
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="after measuring, profile one c=1 pass through an in-process gateway (cProfile) and "
        "write the raw profile here (its summary goes to stdout)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="end with one line: a JSON object of the gateway / in-process ratios and raw figures",
    )
    args = parser.parse_args()

    queries = load_queries(args.dataset)[: args.limit_queries or None]
    scratch = Path(tempfile.mkdtemp(prefix="ragmesh-search-bench-"))
    state_dir, copy_dir = scratch / "state", scratch / "in-process"
    try:
        corpus = corpus_file(args.dataset, args.limit_docs, scratch)
        ingest = Stack(state_dir, workers=1, index_shards=args.index_shards)
        try:
            ingest.up()
            ingest_s = cli_ingest(state_dir, corpus, COLLECTION, args.timeout)
            counts = asyncio.run(collection_counts(ingest.address("ingestion"), COLLECTION))
        finally:
            ingest.down()  # the stores write their final snapshots
        print(f"ingested {counts.indexed} documents, {counts.chunks} chunks in {ingest_s:.0f}s", flush=True)
        copy_stores(state_dir, copy_dir, args.index_shards)
        read_path = Stack(state_dir, workers=0, index_shards=args.index_shards, services=READ_SERVICES)
        try:
            read_path.up()
            measured = asyncio.run(
                measure(read_path.address("gateway"), copy_dir, args.index_shards, queries, args.passes)
            )
            if args.profile is not None:
                try:
                    print(asyncio.run(profile_gateway(read_path.client_env(), queries, args.profile)))
                except Exception as exc:  # the measurements above stand without it
                    print(f"profiling failed: {exc!r}")
        finally:
            read_path.down()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    result = {
        "dataset": str(args.dataset),
        "corpus": {"documents": counts.indexed, "failed": counts.failed, "chunks": counts.chunks},
        "index_shards": args.index_shards,
        "queries": len(queries),
        "passes": args.passes,
        "top_k": DEFAULT_TOP_K,
        **measured,
        "gateway_vs_in_process": ratios(measured["results"]),
        "summary": comparison(measured["results"]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print_table(result)
    print(f"\nwritten to {args.out}")
    if args.json:
        print(json.dumps({"bench": "search", **result["summary"]}, sort_keys=True))


if __name__ == "__main__":
    main()
