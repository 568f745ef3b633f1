"""What one FAISS search costs with one OpenMP thread against several, side by side in one run.

    .venv/bin/python -m bench.faiss_threads --vectors 16000 --json

The index service runs every search on a worker thread, one query at a time, with a gap before
the next as the mesh's other stages run. FAISS's OpenMP threads busy-wait in that gap, so the
CPU a search costs can far exceed its wall time. Each round measures, per thread count, the
wall time of a search and the process's CPU time per search (OpenMP threads included) over
searches spaced ``--gap-ms`` apart, through the index's own flat backend and ``omp_threads``.
Rounds alternate the counts (ABBA) so machine drift falls on both.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from services.index.backends import Backend, BackendConfig, build_backend, faiss, omp_threads

DIMENSION = 384
TOP_K = 35


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build(vectors: int, seed: int) -> tuple[Backend, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((vectors, DIMENSION)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    backend = build_backend("flat", BackendConfig(DIMENSION), np.arange(vectors, dtype=np.int64), data)
    return backend, data[rng.choice(vectors, size=64, replace=False)]


def one_search(backend: Backend, query: np.ndarray, threads: int) -> float:
    with omp_threads(threads):
        started = time.perf_counter()
        backend.search(query.reshape(1, -1), TOP_K, None)
        return time.perf_counter() - started


def measure(
    backend: Backend, queries: np.ndarray, threads: int, searches: int, gap_s: float
) -> dict[str, float]:
    """Wall p50 and CPU per search over ``searches`` calls on one pool worker, as the service runs them."""
    walls: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        for query in queries[:8]:  # warm-up: start the OpenMP team
            pool.submit(one_search, backend, query, threads).result()
        cpu_before, wall_before = cpu_seconds(), time.perf_counter()
        for i in range(searches):
            walls.append(pool.submit(one_search, backend, queries[i % len(queries)], threads).result())
            time.sleep(gap_s)
        cpu = cpu_seconds() - cpu_before
        elapsed = time.perf_counter() - wall_before
    # The sleeps cost no CPU unless something spins through them.
    return {
        "wall_p50_ms": statistics.median(walls) * 1000,
        "cpu_ms": cpu / searches * 1000,
        "elapsed_s": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vectors", type=int, default=16_000, help="Vectors in the flat index.")
    parser.add_argument("--searches", type=int, default=400, help="Searches per measurement.")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="Pause between searches.")
    parser.add_argument("--threads", type=int, default=0, help="The other count (0: OpenMP default, min 2).")
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object as the last line.")
    args = parser.parse_args()

    many = args.threads or max(2, int(faiss.omp_get_max_threads()))
    backend, queries = build(args.vectors, seed=0)
    results: dict[int, list[dict[str, float]]] = {1: [], many: []}
    for round_ in range(args.rounds):
        order = (1, many) if round_ % 2 == 0 else (many, 1)
        for threads in order:
            row = measure(backend, queries, threads, args.searches, args.gap_ms / 1000)
            results[threads].append(row)
            print(
                f"round {round_ + 1} threads {threads}: wall p50 {row['wall_p50_ms']:.3f} ms, "
                f"CPU {row['cpu_ms']:.3f} ms per search",
                flush=True,
            )
    wall = {str(t): round(statistics.median(r["wall_p50_ms"] for r in rs), 4) for t, rs in results.items()}
    cpu = {str(t): round(statistics.median(r["cpu_ms"] for r in rs), 4) for t, rs in results.items()}
    summary = {
        "bench": "faiss_threads",
        "vectors": args.vectors,
        "threads": [1, many],
        "wall_p50_ms": wall,
        "cpu_ms_per_search": cpu,
        "cpu_ratio": round(cpu[str(many)] / cpu["1"], 3),
        "wall_ratio": round(wall[str(many)] / wall["1"], 3),
    }
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
