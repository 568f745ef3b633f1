"""Throughput of the accelerator tiers (reranker, embedder) against their replica count, with
stand-in accelerators (bench.accel_standin) in place of the models: no GPU needed.

    .venv/bin/python -m bench.tier_scaling --dataset ../shared/bench/scifact --json

A stack (ragmesh_cli.stack.Stack: NATS, S3, index, sparse, ingestion API, worker, gateway) runs
without the real embedder and reranker; the bench starts 8 stand-ins of each and wires the first N
into the gateway or the worker (RAGMESH_RERANKER_ADDRESS / RAGMESH_EMBEDDER_ADDRESS, comma lists in
``extra_env``, which wins over the stack's wiring), restarting them for each N. The first --docs
SciFact documents are ingested through the real write path with the stand-in embedder, then:

- **search**: gateway Search, reranking on, closed loop at --per-replica x N concurrent calls, for
  N in --counts: searches/s (whole answers only: reranked, no degradation), p50/p99, the ratio to
  1 replica, each device's utilisation, the CPU of the machine and of each process;
- **ingest**: the first --ingest-docs documents into a fresh collection per N embedder stand-ins
  (chunks/s from the first submit to the last document indexed), then once more with the fast
  embedders: the write path's own ceiling;
- **outlier**: 4 rerankers, one slowed --slowdown times, with gRPC's round-robin (the list written
  ``ipv4:a,b,c,d``, a target gRPC balances) and with the client's least-outstanding (the plain list).

Service times are chosen so the tier, not the 2-core machine, is the bottleneck (see the models
below). One JSON line per point with --json, tables otherwise; all of it in --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from grpc import aio

from bench.accel_standin import DeviceModel, Running, Standins, scrape
from bench.process_cpu import cpu_seconds, process_cpu_s
from meshkit.rpc.client import channel_options
from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli.datasets import find_corpus, load_dataset
from ragmesh_cli.documents import WalkStats, read_corpus
from ragmesh_cli.stack import Stack
from ragmesh_cli.stats import percentile

RESULTS = Path("bench/results/tier_scaling.json")
SERVICES = ("index", "sparse", "ingestion", "worker", "gateway")
COUNTS = (1, 2, 4, 8)
# Service times, chosen so the tier is the bottleneck on a 2-core machine (see the module doc).
# A large cross-encoder on a small GPU: 100 ms a launch, 5 ms a pair, 64 pairs a launch: one
# replica reranks ~150 pairs/s, ~4 searches/s of 35 candidates.
RERANK_MODEL = DeviceModel(fixed_ms=100.0, per_item_ms=5.0, max_batch=64)
# The embedder behind the gateway (one query a call) and the setup ingest: never the bottleneck.
QUERY_EMBED_MODEL = DeviceModel(fixed_ms=10.0, per_item_ms=1.0, max_batch=64)
# The embedder of the ingest curve, slowed until one replica (~5 chunks/s) is well under what the
# write path (index and sparse through their replicated logs, NATS, S3) does on 2 cores.
INGEST_EMBED_MODEL = DeviceModel(fixed_ms=40.0, per_item_ms=200.0, max_batch=64)
# Many small concurrent Embed calls per worker, so N replicas all get some; ~260 chunks in flight,
# so a call waits at most ~55 s behind the others at one replica (the worker allows 120 s).
INGEST_ENV = {
    "RAGMESH_INGEST_EMBED_BATCH": "16",
    "RAGMESH_INGEST_EMBED_CONCURRENCY": "32",
    "RAGMESH_INGEST_FETCH_BATCH": "16",
    "RAGMESH_INGEST_MAX_IN_FLIGHT": "128",
}
SEARCH_TIMEOUT_S = 30.0
SUBMIT_BATCH = 64


@dataclass(frozen=True)
class Options:
    seconds: float
    warmup: float
    per_replica: int
    top_k: int = 10


# ---------------------------------------------------------------------------- measuring


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    total = sum(fields[:8])
    return (total - fields[3] - fields[4]) / ticks, total / ticks


@dataclass
class Window:
    """What the machine, the gateway and the stand-ins did between two snapshots."""

    stand_ins: Sequence[Running]
    method: str
    # Name -> the processes whose CPU is reported under it.
    pids: dict[str, list[int]]

    def snapshot(self) -> dict[str, Any]:
        return {
            "cpu": machine_cpu(),
            "pids": {
                **{name: sum(map(cpu_seconds, pids)) for name, pids in self.pids.items()},
                # This process alone (its children are the stack and the stand-ins).
                "driver": process_cpu_s(os.getpid()) or 0.0,
            },
            "devices": [r.counters(self.method) for r in self.stand_ins],
            "at": time.monotonic(),
        }

    def between(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        seconds = after["at"] - before["at"]
        busy = after["cpu"][0] - before["cpu"][0]
        total = after["cpu"][1] - before["cpu"][1]
        devices = [
            r.activity(b, a, seconds)
            for r, b, a in zip(self.stand_ins, before["devices"], after["devices"], strict=True)
        ]
        return {
            "machine_cpu_busy": round(busy / total, 3) if total else None,
            "process_cpu_cores": {
                name: round((after["pids"][name] - before["pids"][name]) / seconds, 3)
                for name in before["pids"]
            },
            "devices": devices,
        }


async def drive_searches(
    address: str, collection: str, queries: Sequence[str], concurrency: int, opts: Options, window: Window
) -> dict[str, Any]:
    """Closed loop: ``concurrency`` callers, each sending its next Search when the last answers.
    Counts the calls that start in the measured window; only whole answers (reranked, no
    degradation) are successes."""
    latencies: list[float] = []
    problems: Counter[str] = Counter()
    start = time.monotonic() + opts.warmup
    end = start + opts.seconds
    async with aio.insecure_channel(address, options=channel_options()) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)

        async def caller(w: int) -> None:
            i = w
            while (sent := time.monotonic()) < end:
                request = gateway_pb2.SearchRequest(
                    collection=collection, query=queries[i % len(queries)], top_k=opts.top_k, rerank=True
                )
                i += concurrency
                problem: str | None = None
                try:
                    reply = await stub.Search(request, timeout=SEARCH_TIMEOUT_S)
                    if reply.degradations:
                        problem = "degraded"
                    elif not reply.reranked:
                        problem = "not_reranked"
                except aio.AioRpcError as exc:
                    problem = exc.code().name
                if sent >= start:
                    if problem is None:
                        latencies.append(time.monotonic() - sent)
                    else:
                        problems[problem] += 1

        async def measure() -> dict[str, Any]:
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            before = await asyncio.to_thread(window.snapshot)
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            return window.between(before, await asyncio.to_thread(window.snapshot))

        measured, *_ = await asyncio.gather(measure(), *(caller(w) for w in range(concurrency)))
    ms = [x * 1000 for x in latencies]
    return {
        "concurrency": concurrency,
        "searches_per_s": round(len(latencies) / opts.seconds, 2),
        "p50_ms": round(percentile(ms, 50, empty=0.0), 1),
        "p99_ms": round(percentile(ms, 99, empty=0.0), 1),
        "errors": dict(problems),
        **measured,
    }


async def ingest(address: str, collection: str, docs: Sequence[ingestion_pb2.Document]) -> dict[str, Any]:
    """Submit ``docs`` and wait until every one is indexed (or failed): chunks per second from the
    first submit to the last document settled."""
    async with aio.insecure_channel(address, options=channel_options()) as channel:
        stub = ingestion_pb2_grpc.IngestionServiceStub(channel)
        started = time.perf_counter()
        for i in range(0, len(docs), SUBMIT_BATCH):
            request = ingestion_pb2.IngestDocumentsRequest(
                collection=collection, documents=docs[i : i + SUBMIT_BATCH]
            )
            await stub.IngestDocuments(request, timeout=120)
        while True:
            status = await stub.GetCollectionStatus(
                ingestion_pb2.GetCollectionStatusRequest(collection=collection), timeout=10
            )
            if status.indexed + status.failed >= len(docs):
                break
            if time.perf_counter() - started > 1800:
                raise RuntimeError(f"{collection}: not indexed after 30 minutes: {status}")
            await asyncio.sleep(0.1)
        seconds = time.perf_counter() - started
    return {
        "documents": status.indexed,
        "failed": status.failed,
        "chunks": status.chunks,
        "seconds": round(seconds, 2),
        "chunks_per_s": round(status.chunks / seconds, 1),
    }


# ---------------------------------------------------------------------------- the runs


class Bench:
    """The stack, the stand-ins (``embedders`` and ``rerankers``: the largest count of each) and the
    measurements; each point is handed to ``emit`` as it is measured."""

    def __init__(
        self,
        stack: Stack,
        standins: Standins,
        opts: Options,
        rerank_model: DeviceModel,
        ingest_model: DeviceModel,
        emit: Callable[[dict[str, Any]], None],
    ) -> None:
        self.stack = stack
        self.standins = standins
        self.opts = opts
        self.rerank_model = rerank_model
        self.ingest_model = ingest_model
        self.emit = emit
        self.rerankers: list[Running] = []
        self.embedders: list[Running] = []

    def rewire(self, names: Sequence[str], env: dict[str, str]) -> None:
        """Restart ``names`` with ``env`` over the stack's wiring."""
        for name in names:
            self.stack.stop(name)
        self.stack.extra_env.update(env)
        for name in names:
            self.stack.start(name)

    def processes(self) -> dict[str, list[int]]:
        """Whose CPU a search point reports: each stack process, the stand-ins, this driver."""
        named = {n: [pid] for n in self.stack.names() if (pid := self.stack.component(n).pid)}
        return {**named, "stand-ins": [r.proc.pid for r in self.standins.running]}

    def workers(self) -> list[str]:
        return [n for n in self.stack.names() if self.stack.component(n).kind == "worker"]

    def use_embedders(self, replicas: Sequence[Running]) -> None:
        self.rewire(self.workers(), {"RAGMESH_EMBEDDER_ADDRESS": ",".join(r.address for r in replicas)})

    def ingest(self, collection: str, docs: Sequence[ingestion_pb2.Document]) -> dict[str, Any]:
        return asyncio.run(ingest(self.stack.address("ingestion"), collection, docs))

    def search(
        self, collection: str, queries: Sequence[str], rerankers: Sequence[Running], address: str, n: int
    ) -> dict[str, Any]:
        embedders = self.embedders[:n]
        self.rewire(
            ["gateway"],
            {
                "RAGMESH_RERANKER_ADDRESS": address,
                "RAGMESH_EMBEDDER_ADDRESS": ",".join(r.address for r in embedders),
            },
        )
        window = Window(rerankers, "Rerank", self.processes())
        gateway = self.stack.kind_address("gateway")
        point = asyncio.run(
            drive_searches(gateway, collection, queries, self.opts.per_replica * n, self.opts, window)
        )
        return {**point, "ejections": self.ejections(["gateway"], "reranker")}

    def ejections(self, names: Sequence[str], target: str) -> dict[str, int]:
        """'<replica> <reason>' -> times the clients in ``names`` ejected it from ``target``."""
        out: Counter[str] = Counter()
        for name in names:
            url = f"http://127.0.0.1:{self.stack.component(name).ports['metrics']}/metrics"
            for metric, labels, value in scrape(url):
                if metric == "ragmesh_client_replica_ejections_total" and labels.get("target") == target:
                    out[f"{labels['replica']} {labels['reason']}"] += int(value)
        return dict(out)

    def search_curve(
        self, collection: str, queries: Sequence[str], counts: Sequence[int]
    ) -> list[dict[str, Any]]:
        points: list[dict[str, Any]] = []
        for n in counts:
            rerankers = self.rerankers[:n]
            point = self.search(collection, queries, rerankers, ",".join(r.address for r in rerankers), n)
            point = {"phase": "search", "replicas": n, "balancing": "least_outstanding", **point}
            base = next((p for p in points if p["replicas"] == 1), point if n == 1 else None)
            point["ratio_to_1"] = round(point["searches_per_s"] / base["searches_per_s"], 2) if base else None
            points.append(point)
            self.emit(point)
        return points

    def ingest_curve(
        self, docs: Sequence[ingestion_pb2.Document], counts: Sequence[int]
    ) -> list[dict[str, Any]]:
        points: list[dict[str, Any]] = []
        slow = self.standins.start("embedder", self.ingest_model, max(counts))
        for n in counts:
            self.use_embedders(slow[:n])
            point = {"phase": "ingest", "replicas": n, **self.ingest(f"ingest-n{n}", docs)}
            point["ejections"] = self.ejections(self.workers(), "embedder")
            base = next((p for p in points if p["replicas"] == 1), point if n == 1 else None)
            point["ratio_to_1"] = round(point["chunks_per_s"] / base["chunks_per_s"], 2) if base else None
            points.append(point)
            self.emit(point)
        self.standins.stop(slow)
        # The write path's own ceiling: the same documents with the fast embedders.
        self.use_embedders(self.embedders)
        ceiling = {
            "phase": "ingest",
            "replicas": len(self.embedders),
            "embedder": "fast",
            **self.ingest("ingest-fast", docs),
        }
        self.emit(ceiling)
        return [*points, ceiling]

    def outlier(self, collection: str, queries: Sequence[str], slowdown: float) -> list[dict[str, Any]]:
        slow = self.standins.start("reranker", replace(self.rerank_model, slowdown=slowdown))
        rerankers = [*self.rerankers[:3], *slow]
        plain = ",".join(r.address for r in rerankers)
        points: list[dict[str, Any]] = []
        for balancing, address in (("round_robin", f"ipv4:{plain}"), ("least_outstanding", plain)):
            point = self.search(collection, queries, rerankers, address, len(rerankers))
            point = {"phase": "outlier", "replicas": 4, "slowdown": slowdown, "balancing": balancing, **point}
            calls = [d["calls"] for d in point["devices"]]
            point["slow_replica_share"] = round(calls[-1] / sum(calls), 3) if sum(calls) else None
            points.append(point)
            self.emit(point)
        self.standins.stop(slow)
        return points


def load_docs(dataset: Path, limit: int) -> list[ingestion_pb2.Document]:
    docs: list[ingestion_pb2.Document] = []
    for document in read_corpus(find_corpus(dataset), WalkStats()):
        docs.append(document)
        if len(docs) >= limit:
            break
    return docs


# ---------------------------------------------------------------------------- report


def print_tables(points: Sequence[dict[str, Any]]) -> None:
    search = [p for p in points if p["phase"] == "search"]
    if search:
        print(
            "\n| reranker replicas | concurrency | searches/s | vs 1 | p50 ms | p99 ms | device busy |",
            end="",
        )
        print(" CPU busy | gateway CPU |\n|---|---|---|---|---|---|---|---|---|")
        for p in search:
            busy = sum(d["utilisation"] for d in p["devices"]) / len(p["devices"])
            print(
                f"| {p['replicas']} | {p['concurrency']} | {p['searches_per_s']:.1f} | "
                f"{p['ratio_to_1']:.2f}x | {p['p50_ms']:.0f} | {p['p99_ms']:.0f} | {busy:.0%} | "
                f"{p['machine_cpu_busy']:.0%} | "
                f"{p['process_cpu_cores']['gateway']:.2f} cores |"
            )
    ingest = [p for p in points if p["phase"] == "ingest"]
    if ingest:
        print("\n| embedder replicas | chunks | seconds | chunks/s | vs 1 |")
        print("|---|---|---|---|---|")
        for p in ingest:
            fast = p.get("embedder") == "fast"
            label = f"{p['replicas']} fast (the write path's ceiling)" if fast else str(p["replicas"])
            ratio = "-" if p.get("ratio_to_1") is None else f"{p['ratio_to_1']:.2f}x"
            print(f"| {label} | {p['chunks']} | {p['seconds']:.1f} | {p['chunks_per_s']:.1f} | {ratio} |")
    outlier = [p for p in points if p["phase"] == "outlier"]
    if outlier:
        print("\n| 4 rerankers, one slowed | searches/s | p50 ms | p99 ms | calls to the slow one | errors |")
        print("|---|---|---|---|---|---|")
        for p in outlier:
            print(
                f"| {p['balancing']} (x{p['slowdown']:g}) | {p['searches_per_s']:.1f} | {p['p50_ms']:.0f} | "
                f"{p['p99_ms']:.0f} | {p['slow_replica_share']:.0%} | {p['errors'] or '-'} |"
            )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, default=Path("../shared/bench/scifact"))
    parser.add_argument("--docs", type=int, default=300, help="documents searched (default 300)")
    parser.add_argument("--ingest-docs", type=int, default=150, help="documents per ingest point")
    parser.add_argument("--counts", default="1,2,4,8", help="replica counts (default 1,2,4,8)")
    parser.add_argument("--phases", default="search,ingest,outlier", help="which runs (default all)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds before each measurement")
    parser.add_argument("--per-replica", type=int, default=4, help="concurrent searches per replica")
    parser.add_argument("--slowdown", type=float, default=5.0, help="the outlier replica's slowdown")
    parser.add_argument("--workers", type=int, default=1, help="ingestion workers")
    parser.add_argument("--rerank-fixed-ms", type=float, default=RERANK_MODEL.fixed_ms)
    parser.add_argument("--rerank-per-item-ms", type=float, default=RERANK_MODEL.per_item_ms)
    parser.add_argument("--rerank-max-batch", type=int, default=RERANK_MODEL.max_batch)
    parser.add_argument("--ingest-embed-fixed-ms", type=float, default=INGEST_EMBED_MODEL.fixed_ms)
    parser.add_argument("--ingest-embed-per-item-ms", type=float, default=INGEST_EMBED_MODEL.per_item_ms)
    parser.add_argument("--ingest-embed-max-batch", type=int, default=INGEST_EMBED_MODEL.max_batch)
    parser.add_argument("--json", action="store_true", help="one JSON line per point on stdout")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    counts = [int(c) for c in args.counts.split(",") if c.strip()]
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    rerank_model = DeviceModel(args.rerank_fixed_ms, args.rerank_per_item_ms, args.rerank_max_batch)
    ingest_model = DeviceModel(
        args.ingest_embed_fixed_ms, args.ingest_embed_per_item_ms, args.ingest_embed_max_batch
    )
    opts = Options(seconds=args.seconds, warmup=args.warmup, per_replica=args.per_replica)
    points: list[dict[str, Any]] = []

    def emit(point: dict[str, Any]) -> None:
        points.append(point)
        if args.json:
            print(json.dumps(point), flush=True)
        else:
            print(
                f"{point['phase']} {point.get('balancing', '')} x{point['replicas']}: "
                f"{point.get('searches_per_s', point.get('chunks_per_s'))}/s",
                flush=True,
            )

    started = time.perf_counter()
    loadavg = [round(x, 2) for x in os.getloadavg()]
    scratch = Path(tempfile.mkdtemp(prefix="ragmesh-tier-scaling-"))
    standins = Standins(scratch / "logs")
    stack: Stack | None = None
    try:
        most = max(counts)
        embedders = standins.start("embedder", QUERY_EMBED_MODEL, most)
        rerankers = standins.start("reranker", rerank_model, most)
        stack = Stack(
            scratch / "stack",
            workers=args.workers,
            services=SERVICES,
            extra_env={
                "RAGMESH_EMBEDDER_ADDRESS": ",".join(r.address for r in embedders),
                "RAGMESH_RERANKER_ADDRESS": rerankers[0].address,
                **INGEST_ENV,
            },
        )
        stack.up()
        bench = Bench(stack, standins, opts, rerank_model, ingest_model, emit)
        bench.embedders, bench.rerankers = embedders, rerankers
        docs = load_docs(args.dataset, args.docs)
        emit({"phase": "setup", "replicas": most, **bench.ingest("tier", docs)})
        queries = list(load_dataset(args.dataset, "test").queries.values())
        if "search" in phases:
            bench.search_curve("tier", queries, counts)
        if "ingest" in phases:
            bench.ingest_curve(docs[: args.ingest_docs], counts)
        if "outlier" in phases:
            bench.outlier("tier", queries, args.slowdown)
    finally:
        if stack is not None:
            stack.down()
        standins.stop_all()
        shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "dataset": str(args.dataset),
        "cpu_count": os.cpu_count(),
        "loadavg_start": loadavg,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "rerank_model": asdict(rerank_model),
        "query_embed_model": asdict(QUERY_EMBED_MODEL),
        "ingest_embed_model": asdict(ingest_model),
        "ingest_env": INGEST_ENV,
        "options": asdict(opts),
        "points": points,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    if not args.json:
        print_tables(points)
        print(f"\nwritten to {args.out} ({result['wall_s']:.0f}s)")


if __name__ == "__main__":
    main()
