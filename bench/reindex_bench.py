"""A reindex of a whole collection while it is searched: how long `ragmesh reindex` takes to
build the new generation, switch readers and retire the old one, and whether every search
answered throughout.

    .venv/bin/python -m bench.reindex_bench --state-dir STATE --collection scifact \
        --dataset ../shared/bench/scifact

Against a running mesh (`ragmesh up --state-dir STATE`) that holds the collection. The reindex
runs as an operator runs it (the `ragmesh reindex` command, in a subprocess, its progress lines
passed through); meanwhile a loop sends the dataset's queries (one split's) to the gateway through
ragmesh_client, one at a time, without reranking. Each search counts as answered (results, no
degradation), degraded (results, some stage reported a degradation: e.g. the dense leg while a
new embedder's generation builds), empty, or failed (an error status). The last line is one JSON
object with the counts, the latency percentiles and the reindex's phase times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ragmesh_cli.addresses import resolve_address
from ragmesh_cli.datasets import load_dataset
from ragmesh_cli.stats import percentile
from ragmesh_client import AsyncClient, RagmeshError

# Between two searches: the loop measures availability, not throughput.
PAUSE_S = 0.2


@dataclass
class SearchLog:
    answered: int = 0
    degraded: int = 0
    empty: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        return {
            "searches": self.answered + self.degraded + self.empty + self.failed,
            "answered": self.answered,
            "degraded": self.degraded,
            "empty": self.empty,
            "failed": self.failed,
            "errors": self.errors,
            "p50_ms": round(percentile(self.latencies_ms, 50, method="linear", empty=0.0), 1),
            "p95_ms": round(percentile(self.latencies_ms, 95, method="linear", empty=0.0), 1),
        }


async def search_loop(
    client: AsyncClient, collection: str, queries: list[str], stop: asyncio.Event
) -> SearchLog:
    log = SearchLog()
    turn = 0
    while not stop.is_set():
        query = queries[turn % len(queries)]
        turn += 1
        started = time.perf_counter()
        try:
            response = await client.search(collection, query, top_k=10, rerank=False)
        except RagmeshError as exc:
            log.failed += 1
            log.errors[exc.code.name] = log.errors.get(exc.code.name, 0) + 1
        else:
            log.latencies_ms.append((time.perf_counter() - started) * 1000)
            if not response.results:
                log.empty += 1
            elif response.degradations:
                log.degraded += 1
            else:
                log.answered += 1
        await asyncio.sleep(PAUSE_S)
    return log


async def run_reindex(
    state_dir: Path, collection: str, timeout: float
) -> tuple[int, list[tuple[float, str]]]:
    """`ragmesh reindex` as a subprocess; its exit code and its lines, each with seconds since start."""
    ragmesh = str(Path(sys.executable).parent / "ragmesh")
    command = [ragmesh, "--state-dir", str(state_dir), "reindex", "--collection", collection]
    command += ["--timeout", str(timeout)]
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    lines: list[tuple[float, str]] = []
    async for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip()
        at = time.perf_counter() - started
        lines.append((at, line))
        print(f"[{at:7.1f} s] {line}", flush=True)
    return await process.wait(), lines


async def bench(args: argparse.Namespace) -> dict[str, object]:
    queries = list(load_dataset(args.dataset, args.split).queries.values())
    client = AsyncClient(resolve_address("gateway", args.state_dir.absolute()))
    stop = asyncio.Event()
    try:
        loop = asyncio.create_task(search_loop(client, args.collection, queries, stop))
        started = time.perf_counter()
        code, lines = await run_reindex(args.state_dir, args.collection, args.timeout)
        elapsed = time.perf_counter() - started
        stop.set()
        log = await loop
    finally:
        await client.close()
    return {
        "bench": "reindex",
        "collection": args.collection,
        "reindex_exit_code": code,
        "reindex_s": round(elapsed, 1),
        "progress_lines": len(lines),
        **log.summary(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, required=True, help="the running mesh's state directory")
    parser.add_argument("--collection", required=True)
    parser.add_argument(
        "--dataset", type=Path, required=True, help="a BEIR dataset whose queries are searched"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--timeout", type=float, default=7200.0, help="the reindex command's own limit (s)")
    args = parser.parse_args(argv)
    result = asyncio.run(bench(args))
    print(json.dumps(result), flush=True)
    return 0 if result["reindex_exit_code"] == 0 and result["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
