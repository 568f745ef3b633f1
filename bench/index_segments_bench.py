"""A collection index's segments, measured in-process: memory, search, recall, checkpoints, seals,
restart, as it holds N synthetic chunks.

    .venv/bin/python -m bench.index_segments_bench --sizes 100000,1000000 [--json]

Each size runs in a fresh child process (clean RSS): it fills one ``CollectionIndex`` (the
index's defaults, ``RAGMESH_INDEX_*`` settings apply) with N chunks of clustered vectors (a
mixture of Gaussian clusters on the sphere: topic centres, documents around them, chunks around
their document), ~1,000 characters of text each, documents of 10 chunks with a title, URI and
two metadata keys, written through ``replace_documents`` in batches of 1,000 chunks (WAL, fsync)
with a checkpoint every 100 batches and the background work (seals, compactions, merges) run
inline as it comes due. Then it prints per size:

- ``rss_per_chunk``: the process's RSS growth over the fill per chunk, minus the vector itself
  (4 bytes x dimension), and its anonymous / file-backed split;
- ``search_p50_ms`` / ``p99``: one query at a time, top 10, one thread; ``filtered_p50_ms``: with a
  metadata filter matching ~10% of the documents;
- ``recall_at_10``: against exact search over every vector (recomputed from the seed);
- ``checkpoint_bytes`` / ``shard_bytes``: what one checkpoint writes after 1,000 changed chunks (100
  documents re-written with new chunks), against the collection's bytes on disk;
- ``seal_s``: mean seconds to seal one segment (files + index + tuning); ``compact_s`` likewise;
- ``open_s``: reopening the collection (manifest, checksums, segments, WAL).

Also the importable generator of these vectors (``Clusters``), which the index's tests use.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CHUNKS_PER_DOC = 10
BATCH_CHUNKS = 1000
BLOCK_CHUNKS = 10_000
DOC_SIGMA, CHUNK_SIGMA, QUERY_SIGMA = 0.7, 0.7, 0.6
DEPTS = 10


def normalise(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


@dataclass
class Clusters:
    """Clustered unit vectors, a pure function of (seed, row block): ``block(b)`` is rows
    [b * BLOCK_CHUNKS, (b + 1) * BLOCK_CHUNKS), chunks of documents of CHUNKS_PER_DOC rows."""

    dim: int = 384
    topics: int = 400
    seed: int = 7

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, 0])
        self.centres = normalise(rng.standard_normal((self.topics, self.dim), dtype=np.float32))
        self.spread = rng.uniform(0.8, 1.25, self.topics).astype(np.float32)

    def block(self, b: int, version: int = 0) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1, b, version])
        docs = BLOCK_CHUNKS // CHUNKS_PER_DOC
        topic = rng.integers(0, self.topics, docs)
        scale = np.float32(1 / math.sqrt(self.dim))
        spread = self.spread[topic][:, None]
        doc = self.centres[topic] + DOC_SIGMA * scale * spread * rng.standard_normal(
            (docs, self.dim), np.float32
        )
        of_row = np.repeat(np.arange(docs), CHUNKS_PER_DOC)
        noise = rng.standard_normal((BLOCK_CHUNKS, self.dim), np.float32)
        return normalise(doc[of_row] + CHUNK_SIGMA * scale * spread[of_row] * noise)

    def rows(self, n: int) -> np.ndarray:
        """The first ``n`` rows (tests; the bench goes block by block)."""
        blocks = [self.block(b) for b in range(math.ceil(n / BLOCK_CHUNKS))]
        return np.concatenate(blocks)[:n] if blocks else np.zeros((0, self.dim), np.float32)

    def queries(self, n: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 2, n])
        topic = rng.integers(0, self.topics, n)
        noise = rng.standard_normal((n, self.dim), np.float32)
        scale = np.float32(QUERY_SIGMA / math.sqrt(self.dim))
        return normalise(self.centres[topic] + scale * self.spread[topic][:, None] * noise)


def exact_top_k(clusters: Clusters, n: int, queries: np.ndarray, k: int = 10) -> np.ndarray:
    """Rows of the exact top ``k`` of every query over the first ``n`` rows, block by block."""
    best_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_rows = np.full((len(queries), k), -1, dtype=np.int64)
    for b in range(math.ceil(n / BLOCK_CHUNKS)):
        vectors = clusters.block(b)[: n - b * BLOCK_CHUNKS]
        scores = queries @ vectors.T
        rows = np.broadcast_to(np.arange(len(vectors)) + b * BLOCK_CHUNKS, scores.shape)
        all_scores = np.concatenate([best_scores, scores], axis=1)
        all_rows = np.concatenate([best_rows, rows], axis=1)
        top = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(all_scores, top, 1)
        best_rows = np.take_along_axis(all_rows, top, 1)
    return best_rows


# ----- one size, in a child process -----


def chunk_id(row: int, version: int = 0) -> str:
    from meshkit.domain.ids import chunk_id_for

    return chunk_id_for("bench", f"doc-{row // CHUNKS_PER_DOC}", f"{row} {version}")


def text_pool(seed: int) -> str:
    rng = np.random.default_rng([seed, 3])
    words = ["".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(3, 10))) for _ in range(5000)]
    return " ".join(rng.choice(words, 400_000).tolist())


def documents(clusters: Clusters, pool: str, start: int, vectors: np.ndarray, version: int = 0) -> list[Any]:
    from services.index import mutations as mut

    docs = []
    for first in range(0, len(vectors), CHUNKS_PER_DOC):
        row = start + first
        d = row // CHUNKS_PER_DOC
        ids = [chunk_id(row + i, version) for i in range(CHUNKS_PER_DOC)]
        payloads = []
        for i in range(CHUNKS_PER_DOC):
            at = (row + i) * 7919 % (len(pool) - 1100)
            payloads.append(
                mut.Payload(pool[at : at + 1000], ("Guide", f"Part {i}"), i, i * 1000, i * 1000 + 999)
            )
        batch = mut.ChunkBatch(
            ids, [f"doc-{d}"] * CHUNKS_PER_DOC, vectors[first : first + CHUNKS_PER_DOC], payloads
        )
        meta = (("dept", f"d{d % DEPTS}"), ("lang", "en"))
        source = mut.Source(f"Document {d}", f"file:///corpus/doc-{d}.md", meta)
        docs.append(mut.Replacement(f"doc-{d}", batch, [], 0, source))
    return docs


def rss() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _maintain(index: Any, timings: dict[str, list[float]]) -> None:
    from services.index.metrics import INDEX_BUILD_SECONDS

    if not index.maintenance_due():
        return
    before = {job: _hist(INDEX_BUILD_SECONDS, job) for job in ("seal", "compaction")}
    index.rebuild()
    for job in ("seal", "compaction"):
        count, total = _hist(INDEX_BUILD_SECONDS, job)
        if count > before[job][0]:
            timings[job].append((total - before[job][1]) / (count - before[job][0]))


def _hist(histogram: Any, job: str) -> tuple[float, float]:
    samples = {s.name: s.value for m in histogram.collect() for s in m.samples if s.labels.get("job") == job}
    return samples.get("ragmesh_index_segment_build_seconds_count", 0.0), samples.get(
        "ragmesh_index_segment_build_seconds_sum", 0.0
    )


def warm_up(policy: Any, clusters: Clusters) -> None:
    """Build and tune one small index of each kind first: BLAS and OpenMP keep per-thread buffers
    (tens of MiB, once per process) that are no cost per chunk."""
    from services.index.ann import calibrate
    from services.index.backends import build_backend

    vectors = clusters.block(10**6)[:5000]
    for kind in ("ivf", "hnsw"):
        backend = build_backend(kind, policy.backend_config(), np.arange(len(vectors)), vectors)
        calibrate(backend, vectors, policy.recall_target)


def measure(n: int, directory: Path, dim: int, queries: int) -> dict[str, Any]:
    from meshkit.domain.metadata import EQ, Clause
    from meshkit.settings import IndexSettings
    from services.index.backends import faiss
    from services.index.shard import policy_of
    from services.index.store import CollectionIndex

    faiss.omp_set_num_threads(os.cpu_count() or 1)  # index builds take every core, as in the service
    policy = policy_of(IndexSettings(index_dimension=dim))
    clusters = Clusters(dim=dim, topics=max(100, n // 500))
    pool = text_pool(clusters.seed)
    index = CollectionIndex.open("bench", directory / "bench", policy)
    warm_up(policy, clusters)
    gc.collect()
    rss0 = rss()
    timings: dict[str, list[float]] = {"seal": [], "compaction": []}
    started = time.perf_counter()
    batches = 0
    for b in range(math.ceil(n / BLOCK_CHUNKS)):
        vectors = clusters.block(b)[: n - b * BLOCK_CHUNKS]
        for first in range(0, len(vectors), BATCH_CHUNKS):
            part = vectors[first : first + BATCH_CHUNKS]
            index.replace_documents(documents(clusters, pool, b * BLOCK_CHUNKS + first, part))
            batches += 1
            if batches % 100 == 0:
                index.snapshot()
            _maintain(index, timings)
    del vectors, part
    index.snapshot()
    _maintain(index, timings)
    index.snapshot()
    fill_s = time.perf_counter() - started
    gc.collect()
    rss1 = rss()
    qs = clusters.queries(queries)
    lat = []
    found = []
    for q in qs:
        t = time.perf_counter()
        hits = index.search(q, 10)
        lat.append(time.perf_counter() - t)
        found.append([h.chunk_id for h in hits])
    dept = (Clause("dept", EQ, ("d3",)),)
    flat = []
    for q in qs[:50]:
        t = time.perf_counter()
        index.search(q, 10, clauses=dept)
        flat.append(time.perf_counter() - t)
    truth = exact_top_k(clusters, n, qs)
    recall = float(
        np.mean([len(set(f) & {chunk_id(r) for r in t}) / 10 for f, t in zip(found, truth, strict=True)])
    )
    # 1,000 changed chunks: 100 documents re-written with new text, vectors and chunk ids.
    changed = clusters.block(0, version=1)[:1000]
    index.replace_documents(documents(clusters, pool, 0, changed, version=1))
    outcome = index.snapshot()
    checkpoint_bytes = index.last_checkpoint_bytes
    shard_bytes = _du(directory / "bench")
    stats = index.stats()
    index.close()
    del index
    gc.collect()
    t = time.perf_counter()
    reopened = CollectionIndex.open("bench", directory / "bench", policy)
    open_s = time.perf_counter() - t
    assert reopened.stats().chunks == stats.chunks and outcome.written
    reopened.close()
    grown = {k: rss1[k] - rss0[k] for k in rss0}
    return {
        "chunks": n,
        "segments": stats.segments,
        "sealed_rows": stats.sealed_rows,
        "index_type": stats.index_type,
        "fill_s": round(fill_s, 1),
        "rss_per_chunk": round(grown["VmRSS"] / n - 4 * dim, 1),
        "rss_anon_per_chunk": round(grown["RssAnon"] / n, 1),
        "rss_file_per_chunk": round(grown["RssFile"] / n, 1),
        "rss_mib": round(rss1["VmRSS"] / 2**20, 1),
        "search_p50_ms": round(float(np.percentile(lat, 50)) * 1000, 3),
        "search_p99_ms": round(float(np.percentile(lat, 99)) * 1000, 3),
        "filtered_p50_ms": round(float(np.percentile(flat, 50)) * 1000, 3),
        "recall_at_10": round(recall, 4),
        "checkpoint_bytes": checkpoint_bytes,
        "shard_bytes": shard_bytes,
        "checkpoint_share": round(checkpoint_bytes / shard_bytes, 5),
        "disk_per_chunk": round(shard_bytes / n, 1),
        "seal_s": round(float(np.mean(timings["seal"])), 2) if timings["seal"] else None,
        "seals": len(timings["seal"]),
        "compact_s": round(float(np.mean(timings["compaction"])), 2) if timings["compaction"] else None,
        "compactions": len(timings["compaction"]),
        "open_s": round(open_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="100000", help="Comma-separated chunk counts, each in its own process."
    )
    parser.add_argument("--dim", type=int, default=384, help="Vector dimension.")
    parser.add_argument("--queries", type=int, default=200, help="Queries for latency and recall.")
    parser.add_argument(
        "--dir", type=Path, default=None, help="Where to build (default: a temp dir, removed)."
    )
    parser.add_argument("--json", action="store_true", help="One JSON line per size only.")
    parser.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        directory = Path(tempfile.mkdtemp(prefix="segbench-", dir=args.dir))
        try:
            print(json.dumps(measure(args.one, directory, args.dim, args.queries)))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    for size in [int(s) for s in args.sizes.split(",") if s]:
        argv = [
            sys.executable,
            "-m",
            "bench.index_segments_bench",
            "--one",
            str(size),
            "--dim",
            str(args.dim),
        ]
        argv += ["--queries", str(args.queries)] + (["--dir", str(args.dir)] if args.dir else [])
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        result = json.loads(out)
        if args.json:
            print(json.dumps(result))
        else:
            print(f"--- {size:,} chunks")
            for key, value in result.items():
                print(f"  {key:22} {value}")


if __name__ == "__main__":
    main()
