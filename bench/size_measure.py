"""The size bench's measurements at one corpus size: searches (gateway and index shards: latency,
throughput, recall against exact search), the stack settling after a fill, a checkpoint after
1,000 changed chunks and the restart of a killed index shard."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from google.protobuf.json_format import MessageToDict
from grpc import aio

from bench.size_corpus import ExactIndex, Query, SyntheticCorpus, recall_at_k
from bench.size_fill import Filler
from bench.size_procs import component_pids, data_dirs, disk_of, usage_of
from ragmesh.common.v1 import common_pb2
from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.planner.v1 import planner_pb2
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from ragmesh_cli.stack import Stack
from ragmesh_cli.stats import percentile

T = TypeVar("T")
TOP_K = 10
SEARCH_TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 1800.0
FILTER_DEPT = 3
CHANGED_CHUNKS = 1000
# Documents rewritten (and snapshotted) just before the change, and the chunks set aside for them.
PRIME_DOCS, PRIME_CHUNKS = 8, 150
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def filter_pb(dept: int = FILTER_DEPT) -> common_pb2.MetadataFilter:
    """``dept == d<dept>``: one of ten uniform values, ~10% of the documents."""
    clause = common_pb2.MetadataClause(key="dept", op=common_pb2.FILTER_OP_EQ, values=[f"d{dept}"])
    return common_pb2.MetadataFilter(clauses=[clause])


def gateway_request(
    collection: str, query: str, *, dense_only: bool = False, filtered: bool = False
) -> gateway_pb2.SearchRequest:
    """A plain search: no reranking, no HyDE, one dense variation, the precise strategy (pool 50),
    the server's RRF weights (dense, BM25; exact too, but the synthetic queries hold no hard
    keyword) unless ``dense_only``."""
    request = gateway_pb2.SearchRequest(
        collection=collection,
        query=query,
        top_k=TOP_K,
        strategy=planner_pb2.STRATEGY_PRECISE,
        max_variations=1,
        rerank=False,
        hyde_mode=planner_pb2.HYDE_MODE_OFF,
    )
    if dense_only:
        request.weights.CopyFrom(gateway_pb2.LegWeights(dense=1.0, bm25=0.0, exact=0.0))
    if filtered:
        request.filter.CopyFrom(filter_pb())
    return request


@dataclass
class LoadRun:
    latencies_s: list[float]
    wall_s: float
    results: list[Any]


async def run_load(
    call: Callable[[T], Awaitable[Any]], items: Sequence[T], concurrency: int, total: int | None = None
) -> LoadRun:
    """``total`` calls (default: one per item, cycling through them), ``concurrency`` at a time."""
    count = len(items) if total is None else total
    latencies = [0.0] * count
    results: list[Any] = [None] * count
    pending = iter(range(count))

    async def client() -> None:
        for i in pending:  # one shared iterator: each call is taken by one client
            started = time.perf_counter()
            results[i] = await call(items[i % len(items)])
            latencies[i] = time.perf_counter() - started

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return LoadRun(latencies, time.perf_counter() - started, results)


def ms(latencies_s: Sequence[float], q: float) -> float | None:
    value = percentile([s * 1000.0 for s in latencies_s], q, method="linear")
    return None if value is None else round(value, 2)


class Mesh:
    """Channels to the stack's gateway, index shards (first replica of each) and sparse shards."""

    def __init__(self, stack: Stack, index_names: Sequence[str], sparse_names: Sequence[str]) -> None:
        self.stack = stack
        self.index_names = list(index_names)
        self.sparse_names = list(sparse_names)
        self._channels: dict[str, aio.Channel] = {}
        self.gateway = gateway_pb2_grpc.GatewayServiceStub(self.channel("gateway"))
        self.index = [index_pb2_grpc.IndexServiceStub(self.channel(n)) for n in self.index_names]
        self.sparse = [sparse_pb2_grpc.SparseServiceStub(self.channel(n)) for n in self.sparse_names]

    def channel(self, name: str) -> aio.Channel:
        if name not in self._channels:
            self._channels[name] = aio.insecure_channel(self.stack.address(name), options=CHANNEL_OPTIONS)
        return self._channels[name]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)

    async def index_stats(self, collection: str) -> list[index_pb2.GetStatsResponse]:
        request = index_pb2.GetStatsRequest(collection=collection)
        return list(await asyncio.gather(*(s.GetStats(request, timeout=60) for s in self.index)))

    async def sparse_stats(self, collection: str) -> list[sparse_pb2.GetStatsResponse]:
        request = sparse_pb2.GetStatsRequest(collection=collection)
        return list(await asyncio.gather(*(s.GetStats(request, timeout=60) for s in self.sparse)))

    async def snapshot(self, collection: str) -> list[index_pb2.SnapshotResponse]:
        request = index_pb2.SnapshotRequest(collection=collection)
        calls = (s.Snapshot(request, timeout=ADMIN_TIMEOUT_S) for s in self.index)
        return list(await asyncio.gather(*calls))

    async def dense(
        self, collection: str, vector: np.ndarray, filtered: bool = False
    ) -> list[index_pb2.SearchHit]:
        """Every shard searched, hits merged by score: the dense leg without the gateway."""
        request = index_pb2.SearchRequest(
            collection=collection, vector=common_pb2.Vector(values=vector.tolist()), top_k=TOP_K
        )
        if filtered:
            request.filter.CopyFrom(filter_pb())
        replies = await asyncio.gather(*(s.Search(request, timeout=SEARCH_TIMEOUT_S) for s in self.index))
        hits = [h for r in replies for h in r.hits]
        return sorted(hits, key=lambda h: -h.score)[:TOP_K]


async def measure_searches(
    mesh: Mesh, corpus: SyntheticCorpus, exact: ExactIndex, queries: Sequence[Query], throughput_calls: int
) -> dict[str, Any]:
    """Latency at concurrency 1 and throughput at 8 through the gateway (text queries), latency of
    one index shard, and recall@10 of the shards' ANN against exact search on the same vectors."""
    collection = corpus.collection
    vectors = np.stack([q.vector for q in queries])
    truth = await asyncio.to_thread(exact.top_k, vectors, TOP_K)
    truth_filtered = await asyncio.to_thread(exact.top_k, vectors, TOP_K, FILTER_DEPT)
    out: dict[str, Any] = {}
    degraded = 0

    # The index shards directly: one shard per call (alternating), then every shard (recall).
    shard_count = len(mesh.index)
    one = [
        (
            i % shard_count,
            index_pb2.SearchRequest(
                collection=collection, vector=common_pb2.Vector(values=q.vector.tolist()), top_k=TOP_K
            ),
        )
        for i, q in enumerate(queries)
    ]

    async def one_shard(item: tuple[int, index_pb2.SearchRequest]) -> Any:
        return await mesh.index[item[0]].Search(item[1], timeout=SEARCH_TIMEOUT_S)

    await run_load(one_shard, one[:20], 1)  # warm
    run = await run_load(one_shard, one, 1)
    out["index_search_p50_ms"] = ms(run.latencies_s, 50)
    out["index_search_p99_ms"] = ms(run.latencies_s, 99)

    async def fanout(q: Query) -> list[str]:
        return [h.chunk_id for h in await mesh.dense(collection, q.vector)]

    run = await run_load(fanout, queries, 1)
    out["index_fanout_p50_ms"] = ms(run.latencies_s, 50)
    out["recall_at_10"] = round(recall_at_k(run.results, truth, TOP_K), 4)

    async def fanout_filtered(q: Query) -> list[str]:
        return [h.chunk_id for h in await mesh.dense(collection, q.vector, filtered=True)]

    run = await run_load(fanout_filtered, queries, 1)
    out["index_filtered_p50_ms"] = ms(run.latencies_s, 50)
    out["recall_at_10_filtered"] = round(recall_at_k(run.results, truth_filtered, TOP_K), 4)

    # Through the gateway: text queries (its dense leg embeds them with the real embedder).
    async def gateway(request: gateway_pb2.SearchRequest) -> gateway_pb2.SearchResponse:
        return await mesh.gateway.Search(request, timeout=SEARCH_TIMEOUT_S)

    plain = [gateway_request(collection, q.text) for q in queries]
    await run_load(gateway, plain[:20], 1)  # warm
    run = await run_load(gateway, plain, 1)
    degraded += sum(bool(r.degradations) for r in run.results)
    out["search_p50_ms_c1"] = ms(run.latencies_s, 50)
    out["search_p95_ms_c1"] = ms(run.latencies_s, 95)
    out["search_p99_ms_c1"] = ms(run.latencies_s, 99)
    out["search_results_mean"] = round(sum(len(r.results) for r in run.results) / len(run.results), 2)
    run = await run_load(gateway, plain, 8, total=throughput_calls)
    degraded += sum(bool(r.degradations) for r in run.results)
    out["throughput_c8"] = round(len(run.latencies_s) / run.wall_s, 2)
    out["search_p50_ms_c8"] = ms(run.latencies_s, 50)
    out["search_p99_ms_c8"] = ms(run.latencies_s, 99)

    dense_only = [gateway_request(collection, q.text, dense_only=True) for q in queries]
    run = await run_load(gateway, dense_only, 1)
    degraded += sum(bool(r.degradations) for r in run.results)
    out["gateway_dense_p50_ms_c1"] = ms(run.latencies_s, 50)

    filtered = [gateway_request(collection, q.text, filtered=True) for q in queries]
    run = await run_load(gateway, filtered, 1)
    degraded += sum(bool(r.degradations) for r in run.results)
    out["filtered_p50_ms"] = ms(run.latencies_s, 50)
    out["filtered_p99_ms"] = ms(run.latencies_s, 99)
    wrong = sum(res.metadata.get("dept") != f"d{FILTER_DEPT}" for r in run.results for res in r.results)
    out["filtered_wrong_results"] = wrong
    # Recall through the gateway would need a query vector in its SearchRequest (it has none).
    out["recall_at_10_gateway"] = None
    out["gateway_degraded_searches"] = degraded
    out["queries"] = len(queries)
    return out


async def settle(
    stack: Stack,
    kinds: Sequence[str] = ("index", "sparse"),
    *,
    min_wait_s: float = 0.0,
    quiet_cores: float = 0.1,
    window_s: float = 3.0,
    timeout_s: float = 900.0,
) -> float:
    """Wait ``min_wait_s`` (the stores' snapshot intervals after a write), then until the stores'
    processes stay under ``quiet_cores`` of CPU for ``window_s``: rebuilds, snapshots, uploads and
    merges done. Returns the seconds waited."""
    started = time.perf_counter()
    await asyncio.sleep(min_wait_s)
    while time.perf_counter() - started < timeout_s:
        pids = [pid for kind in kinds for pid in component_pids(stack, kind)]
        before = usage_of(pids, memory=False).cpu_s
        await asyncio.sleep(window_s)
        busy = (usage_of(pids, memory=False).cpu_s - before) / window_s
        if busy < quiet_cores:
            break
    return round(time.perf_counter() - started, 1)


def pick_documents(filler: Filler, chunks: int, seed: int) -> list[int]:
    """Whole documents, at random (seeded), holding at least ``chunks`` chunks together."""
    rng = random.Random(seed)
    whole = filler.whole_documents()
    order = rng.sample(range(whole), min(whole, max(1, chunks // 5)))
    picked, total = [], 0
    for d in order:
        if total >= chunks:
            break
        picked.append(d)
        total += filler.corpus.chunk_count(d)
    return picked


async def checkpoint(stack: Stack, mesh: Mesh, filler: Filler, seed: int) -> dict[str, Any]:
    """Change ~1,000 chunks (documents rewritten), then one Snapshot per shard: the bytes the
    shard processes wrote for it (/proc/<pid>/io write_bytes), against their bytes on disk."""
    collection = filler.collection
    index_pids = component_pids(stack, "index")
    s3_pids = component_pids(stack, "s3")
    docs = pick_documents(filler, CHANGED_CHUNKS + PRIME_CHUNKS, seed)
    prime, docs = docs[:PRIME_DOCS], docs[PRIME_DOCS:]
    # A shard snapshots on its own once it is dirty and its last snapshot is older than the interval
    # (30 s): a fresh one now keeps that tick from taking the change's checkpoint before the RPC does.
    await filler.rewrite(prime)
    await mesh.snapshot(collection)
    before = usage_of(index_pids, memory=False)
    change = await filler.rewrite(docs)
    mid, s3_mid = usage_of(index_pids, memory=False), usage_of(s3_pids, memory=False)
    # Every shard has the change pending: no snapshot of the shard's own took it first.
    pending = [int(s.pending_wal_records) for s in await mesh.index_stats(collection)]
    disk_mid = disk_of(data_dirs(stack, "index"))
    started = time.perf_counter()
    replies = await mesh.snapshot(collection)
    seconds = time.perf_counter() - started
    after, s3_after = usage_of(index_pids, memory=False), usage_of(s3_pids, memory=False)
    disk_after = disk_of(data_dirs(stack, "index"))
    # A shard that snapshotted on its own during the change: its checkpoint is in the change's window.
    background = any(p == 0 for p in pending)
    written = (
        (after.write_bytes - before.write_bytes) if background else (after.write_bytes - mid.write_bytes)
    )
    return {
        "checkpoint_pending_wal_records": pending,
        "checkpoint_background_snapshot": background,
        "checkpoint_changed_chunks": change.chunks,
        "checkpoint_change_s": round(change.wall_s, 3),
        "checkpoint_wal_bytes": mid.write_bytes - before.write_bytes,
        "checkpoint_bytes": written,
        "checkpoint_bytes_ratio": round(written / disk_after.allocated_bytes, 4)
        if disk_after.allocated_bytes
        else None,
        "checkpoint_dir_growth_bytes": disk_after.allocated_bytes - disk_mid.allocated_bytes,
        "checkpoint_objectstore_bytes": s3_after.write_bytes - s3_mid.write_bytes,
        "checkpoint_s": round(seconds, 3),
        "checkpoint_uploaded": all(r.uploaded for r in replies),
    }


async def restart(
    stack: Stack, mesh: Mesh, collection: str, probe: np.ndarray, shard: int = 0
) -> dict[str, Any]:
    """SIGKILL one index shard, start it again, and time until it answers a search holding every
    chunk it held before (GetStats) and the start until healthy (the stack's readiness probe)."""
    name = mesh.index_names[shard]
    stub = mesh.index[shard]
    expected = (await stub.GetStats(index_pb2.GetStatsRequest(collection=collection), timeout=60)).chunks
    search = index_pb2.SearchRequest(
        collection=collection, vector=common_pb2.Vector(values=probe.tolist()), top_k=TOP_K
    )
    await asyncio.to_thread(stack.kill, name)
    killed = time.perf_counter()
    await stack.start_async(name)
    healthy = time.perf_counter()
    while True:
        try:
            stats = await stub.GetStats(index_pb2.GetStatsRequest(collection=collection), timeout=10)
            if stats.chunks == expected:
                reply = await stub.Search(search, timeout=10)
                if reply.hits:
                    break
        except aio.AioRpcError:
            pass
        if time.perf_counter() - killed > ADMIN_TIMEOUT_S:
            raise TimeoutError(f"{name} did not serve its {expected} chunks again")
        await asyncio.sleep(0.05)
    serving = time.perf_counter()
    return {
        "restart_s": round(serving - killed, 3),
        "restart_healthy_s": round(healthy - killed, 3),
        "restart_shard": name,
        "restart_shard_chunks": expected,
    }


def stats_dicts(replies: Sequence[Any]) -> list[dict[str, Any]]:
    """GetStats replies as JSON objects (every field the contract has now, defaults included)."""
    return [MessageToDict(r, always_print_fields_with_no_presence=True) for r in replies]


def random_dept_share(exact: ExactIndex) -> float:
    """Share of the written chunks the bench's filter matches (~1/DEPTS)."""
    if not exact.size:
        return 0.0
    return round(float(np.mean(exact.dept[: exact.size] == FILTER_DEPT)), 4)
