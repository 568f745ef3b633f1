"""Cost against corpus size: search latency, throughput and recall, memory and disk per chunk, a
checkpoint and a restart, measured as one collection grows (docs/SCALE.md).

    make size-bench SIZES=10000,100000          # or:
    .venv/bin/python -m bench.size_bench --sizes 10000,100000,1000000 --json [--write-doc]

Starts its own stack (ragmesh_cli.stack.Stack: NATS, SeaweedFS, embedder, two index shards, two
sparse shards, gateway), fills one collection with synthetic documents (bench/size_corpus.py) straight
into the stores' ReplaceDocuments RPCs up to each size in turn (10k, then 90k more, ...), and at
each size measures: gateway search latency at concurrency 1 and throughput at 8 (rerank off, no
HyDE, one variation), an index shard's search latency, dense recall@10 of the shards' ANN against
exact search over the vectors the bench wrote, a filtered search (~10% of documents), RSS/PSS
and disk per chunk of the index and sparse processes, the bytes and seconds of a checkpoint after
1,000 changed chunks, the restart of a SIGKILLed index shard, and the fill rate and what bounded
it. Progress goes to stderr; ``--json`` prints only one JSON line per size on stdout, otherwise
tables follow. Raw results: bench/results/size.json.

The stack runs ``--index-shards`` index shards and ``--sparse-shards`` sparse shards (2 and 2 by
default, the issue's layout); a document's sparse chunks live on its document's shard.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.size_corpus import ExactIndex, SyntheticCorpus
from bench.size_fill import Filler, FillStats, FillStopped
from bench.size_measure import (
    CHANGED_CHUNKS,
    Mesh,
    checkpoint,
    measure_searches,
    random_dept_share,
    restart,
    settle,
    stats_dicts,
)
from bench.size_procs import (
    Usage,
    cores,
    data_dirs,
    disk_of,
    disk_usage,
    kinds_usage,
    machine_room,
    per_chunk,
    self_usage,
)
from bench.size_report import DOC, PLOTS, fill_bound, machine, print_tables, write_doc
from meshkit.settings import IndexSettings, SparseSettings
from ragmesh_cli.stack import Stack

COLLECTION = "size"
SERVICES = ("embedder", "index", "sparse", "gateway")
RESULTS = Path("bench/results/size.json")
FILL_KINDS = ("index", "sparse", "nats", "s3", "gateway", "embedder")
DEFAULT_SIZES = "10000,100000,1000000"


def parse_sizes(text: str) -> list[int]:
    """``10000,100000,1e6`` -> ascending distinct positive sizes."""
    sizes = set()
    for item in (part.strip().replace("_", "") for part in text.split(",")):
        if not item:
            continue
        value = int(float(item))
        if value <= 0:
            raise argparse.ArgumentTypeError(f"size {item!r} must be positive")
        sizes.add(value)
    if not sizes:
        raise argparse.ArgumentTypeError("give at least one size")
    return sorted(sizes)


def shard_names(stack: Stack, kind: str, shard_env: str) -> list[str]:
    """The first replica of every shard of ``kind``, in shard order (a kind without shards: one)."""
    first: dict[int, str] = {}
    for comp in stack.components.values():
        if comp.kind == kind:
            first.setdefault(int(comp.env.get(shard_env, "0")), comp.name)
    return [first[i] for i in sorted(first)]


def index_params(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """What GetStats says (type, dimension per shard) and the RAGMESH_INDEX_* settings the shards
    were started with (GetStats does not report the ANN parameters; every ``index_*`` setting is
    listed, whatever the index's design names them)."""
    own = {"index_data_dir", "index_shard", "index_shard_count", "index_log_stream"}
    configured = {
        key: value
        for key, value in IndexSettings().model_dump(mode="json").items()
        if key.startswith("index_") and key not in own and "address" not in key
    }
    return {
        "types": sorted({s.get("indexType", "") for s in stats}),
        "dimension": sorted({int(s.get("dimension", 0)) for s in stats}),
        "configured": configured,
    }


def footprint(stack: Stack, baseline: dict[str, Usage], chunks: int) -> dict[str, Any]:
    now = kinds_usage(stack, ("index", "sparse"))
    out: dict[str, Any] = {}
    for kind in ("index", "sparse"):
        grown = now[kind] - baseline[kind]
        disk = disk_of(data_dirs(stack, kind))
        out[f"{kind}_rss_bytes"] = now[kind].rss_bytes
        out[f"{kind}_peak_rss_mib"] = round(now[kind].peak_rss_bytes / 2**20)
        out[f"{kind}_rss_bytes_per_chunk"] = per_chunk(grown.rss_bytes, chunks)
        out[f"{kind}_pss_bytes_per_chunk"] = per_chunk(grown.pss_bytes, chunks)
        out[f"{kind}_disk_bytes"] = disk.allocated_bytes
        out[f"{kind}_disk_bytes_per_chunk"] = per_chunk(disk.allocated_bytes, chunks)
        out[f"{kind}_disk_apparent_bytes_per_chunk"] = per_chunk(disk.apparent_bytes, chunks)
        out[f"{kind}_disk_files"] = disk.files
    out["log_disk_bytes_per_chunk"] = per_chunk(disk_usage(stack.state_dir / "nats").allocated_bytes, chunks)
    out["objectstore_disk_bytes_per_chunk"] = per_chunk(
        disk_usage(stack.state_dir / "s3").allocated_bytes, chunks
    )
    return out


def fill_line(
    size: int,
    filler: Filler,
    stats: FillStats,
    fill_cores: dict[str, float],
    index_stats: list[dict[str, Any]],
    sparse_shards: int,
    vectors: str,
    seed: int,
) -> dict[str, Any]:
    """The first fields of a size's JSON line: the collection, the index's layout and the fill."""
    waits = {"index": stats.index_wait_s, "sparse": stats.sparse_wait_s}
    bound, detail = fill_bound(fill_cores, waits, stats.batches, os.cpu_count() or 1)
    return {
        "bench": "size",
        "size": size,
        "chunks": sum(int(s.get("chunks", 0)) for s in index_stats),
        "documents": filler.next_doc + (1 if filler.sent_of_next else 0),
        "vectors": vectors,
        "seed": seed,
        "index_shards": len(index_stats),
        "sparse_shards": sparse_shards,
        "index_type": "+".join(sorted({s.get("indexType", "?") for s in index_stats})),
        "index_params": index_params(index_stats),
        "index_shard_stats": index_stats,
        "fill_chunks": stats.chunks,
        "fill_s": round(stats.wall_s, 2),
        "fill_chunks_per_s": round(stats.chunks / stats.wall_s, 1) if stats.wall_s else None,
        "fill_bound": bound,
        "fill_bound_detail": detail,
        "fill_cores": fill_cores,
        "fill_wait_s": {k: round(v, 2) for k, v in waits.items()},
        "fill_batches": stats.batches,
        "fill_generate_s": round(stats.generate_s, 2),
        "fill_build_s": round(stats.build_s, 2),
        "filter_chunk_share": random_dept_share(filler.exact),
    }


class Bench:
    def __init__(self, args: argparse.Namespace, stack: Stack) -> None:
        self.args = args
        self.stack = stack
        self.corpus = SyntheticCorpus(
            args.seed, clusters=args.clusters, vectors=args.vectors, collection=COLLECTION
        )
        self.exact = ExactIndex(self.corpus, max(args.sizes))
        self.queries = self.corpus.queries(args.queries)
        self.lines: list[dict[str, Any]] = []
        budget = args.time_budget_s
        self.deadline = time.perf_counter() + budget if budget else None

    def settle_wait_s(self) -> float:
        """After a write, the stores snapshot on their own within these intervals (then idle)."""
        if self.args.settle_s is not None:
            return float(self.args.settle_s)
        index = getattr(IndexSettings(), "index_snapshot_interval_s", 30.0)
        sparse = getattr(SparseSettings(), "sparse_snapshot_interval_s", 60.0)
        return max(float(index), float(sparse)) + 5.0

    async def run(self) -> None:
        stack = self.stack
        mesh = Mesh(
            stack,
            shard_names(stack, "index", "RAGMESH_INDEX_SHARD"),
            shard_names(stack, "sparse", "RAGMESH_SPARSE_SHARD"),
        )
        try:
            baseline = kinds_usage(stack, ("index", "sparse"))
            filler = Filler(
                self.corpus,
                self.exact,
                mesh.index,
                mesh.sparse,
                batch_docs=self.args.batch_docs,
                in_flight=self.args.in_flight,
                guard=self.guard,
            )
            for size in self.args.sizes:
                line = await self.one_size(mesh, filler, baseline, size)
                self.lines.append(line)
                if self.args.json:
                    print(json.dumps(line, sort_keys=True), flush=True)
                else:
                    print(f"{size:,}: done", file=sys.stderr, flush=True)
        finally:
            await mesh.close()

    async def one_size(
        self, mesh: Mesh, filler: Filler, baseline: dict[str, Usage], size: int
    ) -> dict[str, Any]:
        stack, log = self.stack, self.log
        before = kinds_usage(stack, FILL_KINDS, memory=False)
        bench_before = self_usage()

        def used(seconds: float) -> dict[str, float]:
            after = kinds_usage(stack, FILL_KINDS, memory=False)
            cpu = {kind: after[kind].cpu_s - before[kind].cpu_s for kind in FILL_KINDS}
            cpu["bench"] = self_usage().cpu_s - bench_before.cpu_s
            return cores(cpu, seconds)

        try:
            stats = await filler.fill(size, self.deadline)
        except FillStopped as stop:
            waits = {"index": stop.stats.index_wait_s, "sparse": stop.stats.sparse_wait_s}
            bound, detail = fill_bound(
                used(stop.stats.wall_s), waits, stop.stats.batches, os.cpu_count() or 1
            )
            raise FillStopped(f"{stop}; the fill was bounded by {bound}: {detail}", stop.stats) from None
        fill_cores = used(stats.wall_s)
        log(f"{size:,}: filled {stats.chunks:,} chunks in {stats.wall_s:.0f}s; settling")
        settled = await settle(stack, min_wait_s=self.settle_wait_s())
        await mesh.snapshot(COLLECTION)  # what is on disk: one snapshot, no WAL
        settled += await settle(stack)
        index_stats = stats_dicts(await mesh.index_stats(COLLECTION))
        sparse_stats = stats_dicts(await mesh.sparse_stats(COLLECTION))
        chunks = sum(int(s.get("chunks", 0)) for s in index_stats)
        sparse_chunks = sum(int(s.get("chunks", 0)) for s in sparse_stats)
        if chunks != filler.chunks or sparse_chunks != filler.chunks:
            raise RuntimeError(
                f"the stores hold {chunks} / {sparse_chunks} chunks, the bench wrote {filler.chunks}"
            )
        line = fill_line(
            size, filler, stats, fill_cores, index_stats, len(mesh.sparse), self.args.vectors, self.args.seed
        )
        line["settle_s"] = settled
        line.update(footprint(stack, baseline, chunks))
        log(f"{size:,}: searching")
        line.update(
            await measure_searches(mesh, self.corpus, self.exact, self.queries, self.args.throughput_calls)
        )
        log(f"{size:,}: checkpoint")
        line.update(await checkpoint(stack, mesh, filler, self.args.seed + size))
        log(f"{size:,}: restart")
        line.update(await restart(stack, mesh, COLLECTION, self.queries[0].vector))
        line["loadavg"] = [round(x, 2) for x in os.getloadavg()]
        return line

    def guard(self) -> str | None:
        """Stop a fill before it takes the machine's last disk or memory (it is shared)."""
        disk, memory = machine_room(self.stack.state_dir)
        args = self.args
        if disk < args.min_free_disk_gb * 2**30:
            return f"{disk / 2**30:.1f} GiB of disk left (--min-free-disk-gb {args.min_free_disk_gb:g})"
        if memory and memory < args.min_free_memory_gb * 2**30:
            return (
                f"{memory / 2**30:.1f} GiB of memory left (--min-free-memory-gb {args.min_free_memory_gb:g})"
            )
        return None

    @staticmethod
    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)


def revision() -> str:
    """The code measured: RAGMESH_BENCH_REVISION when the caller names it, else git's HEAD."""
    named = os.environ.get("RAGMESH_BENCH_REVISION")
    if named:
        return named
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"HEAD {found.stdout.strip()} (and the working tree)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes(DEFAULT_SIZES), help=DEFAULT_SIZES)
    p.add_argument("--json", action="store_true", help="only the JSON lines (one per size) on stdout")
    p.add_argument("--write-doc", action="store_true", help=f"(re)write {DOC} and {PLOTS}/*.png")
    p.add_argument("--vectors", choices=("clustered", "random"), default="clustered")
    p.add_argument("--index-shards", type=int, default=2)
    p.add_argument("--sparse-shards", type=int, default=2)
    p.add_argument("--queries", type=int, default=200, help="queries per measurement (default 200)")
    p.add_argument("--throughput-calls", type=int, default=400, help="searches of the c=8 run")
    p.add_argument("--clusters", type=int, default=2000, help="Gaussian clusters (topics) of the vectors")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--batch-docs", type=int, default=100, help="documents per write request")
    p.add_argument("--in-flight", type=int, default=2, help="write batches in flight")
    p.add_argument(
        "--settle-s", type=float, default=None, help="wait after a fill (default: the snapshot intervals + 5)"
    )
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="give up a size whose fill would end past this many seconds from the start (the sizes done "
        "are reported, with what stopped the next)",
    )
    p.add_argument("--min-free-disk-gb", type=float, default=10.0, help="stop a fill below this (10)")
    p.add_argument("--min-free-memory-gb", type=float, default=3.0, help="stop a fill below this (3)")
    p.add_argument("--state-dir", type=Path, default=None, help="default: a temporary directory, removed")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--doc-from",
        type=Path,
        default=None,
        help=f"run nothing: rewrite {DOC} and its plots from a results file this bench wrote (--out)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.doc_from is not None:
        saved = json.loads(args.doc_from.read_text())
        for note in write_doc(saved["lines"], saved["meta"]):
            print(note, file=sys.stderr)
        print(f"wrote {DOC} from {args.doc_from}", file=sys.stderr)
        return
    if args.sparse_shards < 1 or args.index_shards < 1:
        parser().error("shard counts must be >= 1")
    command = "python -m bench.size_bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    started = time.perf_counter()
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    scratch = None if args.state_dir else Path(tempfile.mkdtemp(prefix="ragmesh-size-bench-"))
    state_dir = args.state_dir or scratch
    assert state_dir is not None
    stack = Stack(
        state_dir,
        workers=0,
        index_shards=args.index_shards,
        services=SERVICES,
        health_timeout_s=600.0,
        sparse_shards=args.sparse_shards,
    )
    bench = Bench(args, stack)
    stopped = None
    try:
        stack.up()
        asyncio.run(bench.run())
    except KeyboardInterrupt:
        stopped = "interrupted"
    except Exception as exc:  # the sizes done so far still count
        if not bench.lines:
            raise
        stopped = str(exc) if isinstance(exc, FillStopped) else f"{type(exc).__name__}: {exc}"
        print(f"stopped after {len(bench.lines)} sizes: {stopped}", file=sys.stderr)
    finally:
        stack.down()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    meta = {
        "command": command,
        "date": datetime.date.today().isoformat(),
        "revision": revision(),
        "machine": machine(),
        "loadavg_start": loadavg_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "sizes": args.sizes,
        "index_shards": args.index_shards,
        "sparse_shards": args.sparse_shards,
        "vectors": args.vectors,
        "seed": args.seed,
        "clusters": args.clusters,
        "queries": args.queries,
        "throughput_calls": args.throughput_calls,
        "changed_chunks": CHANGED_CHUNKS,
        "wall_s": round(time.perf_counter() - started, 1),
        "stopped": stopped,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "lines": bench.lines}, indent=2))
    if not args.json:
        print_tables(bench.lines)
    if args.write_doc:
        for note in write_doc(bench.lines, meta):
            print(note, file=sys.stderr)
        print(f"wrote {DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
