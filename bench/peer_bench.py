"""ragmesh against the peers a user would pick instead, on the same SciFact job in one run.

    make peer-bench       # installs the bench extra, then:
    .venv/bin/python -m bench.peer_bench --dataset ../shared/bench/scifact \\
        --gateway 127.0.0.1:PORT --collection scifact --json

Systems, each answering the SciFact test claims with ten documents:
- ``haystack``: a Haystack 2.x pipeline in this process: InMemoryDocumentStore, a query-embedder
  component (the project's model), InMemoryBM25Retriever and InMemoryEmbeddingRetriever, a
  DocumentJoiner with reciprocal_rank_fusion;
- ``lancedb``: a LanceDB table in a temp directory, its full-text index plus the vector column,
  hybrid search with its RRFReranker, in this process;
- ``ragmesh``: gateway Search (rerank off, top_k 10, one result per document) against a running
  mesh that already holds the corpus.

Same text, same vectors: the peers index the chunks ingestion makes (same normaliser, same chunker:
ragmesh_cli.rerankerbuild.mining.chunk_corpus), embedded once with the embedder's own model class
(services/embedder/model.py) and cached under .cache/peer-bench/. A peer's query is embedded with
that same model in-process, inside its timed search, as the gateway calls the embedder inside its
own. Each peer asks each leg for the gateway's candidate pool (planner_precise_pool chunks) with its
own RRF defaults; its fused chunk list becomes documents by first occurrence, the first ten count.

Measured: nDCG@10 (the warm-up pass, scored with ragmesh_cli.metrics), p50/p95 latency at
concurrency 1 and throughput at concurrency 8 (threads for the peers, asyncio for the gateway),
each cell run for a fixed time, the cells alternated ABBA over the passes so drift on a shared
machine falls on every system.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.peer_load import AsyncSearch, run_tasks, run_threads

# Answer.chunk_ids holds a system's ranked documents here (every system answers with documents).
from bench.peers import SyncSearch, build_haystack, build_lancedb, progress, top_documents
from bench.search_bench import Answer, LoadRun, summary
from meshkit.domain.ids import sha256_file
from meshkit.settings import EmbedderSettings, PlannerSettings
from ragmesh_cli import metrics
from ragmesh_cli.channels import gateway_client
from ragmesh_cli.datasets import BeirDataset, load_dataset
from ragmesh_cli.rerankerbuild.mining import Passage, chunk_corpus, read_beir_corpus
from ragmesh_client import AsyncClient, RetryPolicy
from services.embedder.model import EmbeddingModel, TextKind
from services.gateway.validation import DEFAULT_TOP_K

RAGMESH, HAYSTACK, LANCEDB = "ragmesh", "haystack", "lancedb"
PEERS = (HAYSTACK, LANCEDB)
SYSTEMS = (RAGMESH, *PEERS)
CONCURRENCY = (1, 8)
CACHE_DIR = Path(".cache/peer-bench")
# Bump when what is cached changes meaning (not for new chunks: those are content-addressed).
CACHE_VERSION = 1
EMBED_BATCH = 64
PROGRESS_EVERY_S = 10.0
CALL_TIMEOUT_S = 60.0
# Chunk ids are content hashes that include a collection name; any fixed name will do here.
CHUNK_NAMESPACE = "peer-bench"
# The goals: ragmesh's p50 at most this many times the faster peer's.
P50_GOAL_RATIO = 1.5


# ---------------------------------------------------------------------------- corpus


def doc_subset(corpus_order: Sequence[str], qrels: Mapping[str, Mapping[str, int]], n: int) -> list[str]:
    """``n`` documents of the corpus (0: all) that keep every judged document of the chosen claims:
    the gold documents first, the rest filled in corpus order; more than ``n`` when the gold ones
    alone exceed it. Returned in corpus order."""
    if n <= 0:
        return list(corpus_order)
    present = set(corpus_order)
    keep = {doc for rels in qrels.values() for doc in rels if doc in present}
    for doc in corpus_order:
        if len(keep) >= n:
            break
        keep.add(doc)
    return [doc for doc in corpus_order if doc in keep]


def load_chunks(dataset: BeirDataset, docs: int) -> tuple[list[Passage], int]:
    """The chunks ingestion makes of the corpus (or of its ``doc_subset``) and how many documents."""
    records = list(read_beir_corpus(dataset.corpus_path))
    wanted = set(doc_subset([doc_id for doc_id, _title, _text in records], dataset.qrels, docs))
    corpus = chunk_corpus((r for r in records if r[0] in wanted), CHUNK_NAMESPACE)
    return corpus.passages, len(corpus.by_doc)


# ---------------------------------------------------------------------------- embeddings


def cache_key(corpus_sha256: str, model_sha256: str, settings: EmbedderSettings) -> str:
    """Names the cache of one corpus file embedded by one model file (and the settings that change
    a passage's vector). Chunks inside are looked up by id, a hash of their text."""
    identity = {
        "version": CACHE_VERSION,
        "corpus_sha256": corpus_sha256,
        "model_sha256": model_sha256,
        "passage_prefix": settings.embedder_passage_prefix,
        "max_tokens": settings.embedder_max_tokens,
        "pooling": settings.embedder_pooling,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return f"embeddings-{digest[:32]}"


def cached_vectors(
    path: Path, chunks: Sequence[Passage], embed: Callable[[list[str]], np.ndarray]
) -> tuple[np.ndarray, int]:
    """Each chunk's passage vector in order, and how many had to be embedded now: those missing from
    the cache file at ``path`` are embedded and the file rewritten (atomically)."""
    known: dict[str, np.ndarray] = {}
    if path.is_file():
        with np.load(path, allow_pickle=False) as stored:
            known = dict(zip(stored["chunk_ids"].tolist(), stored["vectors"], strict=True))
    missing = [c for c in dict.fromkeys(c.chunk_id for c in chunks) if c not in known]
    if missing:
        text_of = {c.chunk_id: c.text for c in chunks}
        fresh = embed_with_progress([text_of[c] for c in missing], embed)
        known.update(zip(missing, fresh, strict=True))
        path.parent.mkdir(parents=True, exist_ok=True)
        ids = list(known)
        partial = path.with_name(path.name + ".partial.npz")
        np.savez(partial, chunk_ids=np.array(ids), vectors=np.stack([known[c] for c in ids]))
        os.replace(partial, path)
    return np.stack([known[c.chunk_id] for c in chunks]).astype(np.float32, copy=False), len(missing)


def embed_with_progress(texts: Sequence[str], embed: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    started = last = time.perf_counter()
    parts = []
    for start in range(0, len(texts), EMBED_BATCH):
        parts.append(embed(list(texts[start : start + EMBED_BATCH])))
        done, now = min(start + EMBED_BATCH, len(texts)), time.perf_counter()
        if now - last >= PROGRESS_EVERY_S or done == len(texts):
            last = now
            rate = done / max(now - started, 1e-9)
            progress(f"embedded {done}/{len(texts)} chunks ({rate:.0f}/s)")
    return np.concatenate(parts) if parts else np.empty((0, 0), dtype=np.float32)


def passage_vectors(
    model: EmbeddingModel,
    settings: EmbedderSettings,
    corpus_path: Path,
    chunks: Sequence[Passage],
    cache_dir: Path = CACHE_DIR,
) -> np.ndarray:
    key = cache_key(sha256_file(corpus_path), sha256_file(Path(settings.embedder_model_path)), settings)
    path = cache_dir / f"{key}.npz"
    vectors, embedded = cached_vectors(path, chunks, lambda t: model.embed(t, TextKind.PASSAGE)[0])
    progress(f"{len(chunks)} chunk vectors: {len(chunks) - embedded} from {path}, {embedded} embedded now")
    return vectors


# ---------------------------------------------------------------------------- the peers


def ragmesh_search(client: AsyncClient, collection: str, degraded: Counter[str]) -> AsyncSearch:
    """Gateway Search as the bench asks it; counts the degradations the gateway reports (a leg
    that timed out would make its figures look better than the full search)."""

    async def search(query: str) -> list[str]:
        reply = await client.search(
            collection,
            query,
            top_k=DEFAULT_TOP_K,
            rerank=False,
            collapse_documents=True,
            timeout=CALL_TIMEOUT_S,
        )
        degraded.update(f"{d.stage}:{d.reason}" for d in reply.degradations)
        return top_documents(r.doc_id for r in reply.results)

    return search


@dataclass
class System:
    name: str
    sync: SyncSearch | None = None
    run_async: AsyncSearch | None = None

    async def run(self, queries: Sequence[str], concurrency: int, seconds: float | None) -> LoadRun:
        if self.run_async is not None:
            return await run_tasks(self.run_async, queries, concurrency, seconds)
        assert self.sync is not None
        return await asyncio.to_thread(run_threads, self.sync, queries, concurrency, seconds)


def pass_order(pass_no: int, systems: Sequence[str]) -> list[tuple[str, int]]:
    """ABBA over the cells (system, concurrency): even passes forward, odd passes reversed."""
    cells = [(name, c) for c in CONCURRENCY for name in systems]
    return cells if pass_no % 2 == 0 else cells[::-1]


# ---------------------------------------------------------------------------- figures


def ndcg_scores(
    answers: Sequence[Answer], query_ids: Sequence[str], qrels: metrics.Qrels
) -> dict[str, float]:
    """Per-query nDCG@10 of one system's answers (in query order)."""
    return {
        qid: metrics.ndcg_at_k(list(answer.chunk_ids), qrels[qid], DEFAULT_TOP_K)
        for qid, answer in zip(query_ids, answers, strict=True)
    }


def system_figures(runs: Mapping[tuple[str, int], Sequence[LoadRun]]) -> dict[str, dict[str, float]]:
    """Per system: p50/p95 at c=1, p50 and throughput at c=8 (from search_bench's summary)."""
    out: dict[str, dict[str, float]] = {}
    for (name, c), cell in runs.items():
        figures = summary(cell)
        row = out.setdefault(name, {})
        row[f"searches_c{c}"] = figures["searches"]
        row[f"p50_ms_c{c}"] = figures["p50_ms"]
        row[f"p95_ms_c{c}"] = figures["p95_ms"]
        row[f"searches_per_s_c{c}"] = figures["searches_per_s"]
    return out


def comparison(figures: Mapping[str, Mapping[str, float]], ndcg10: Mapping[str, float]) -> dict[str, Any]:
    """The issue's goals: ragmesh against the faster peer (lower p50 at c=1; higher throughput at c=8)
    and against both peers' nDCG@10. Ratios are None when ragmesh or every peer is missing."""
    peers = [p for p in PEERS if p in figures]
    out: dict[str, Any] = {
        "ndcg10": {name: round(value, 4) for name, value in ndcg10.items()},
        "p50_ms_c1": {name: round(row["p50_ms_c1"], 2) for name, row in figures.items()},
        "p95_ms_c1": {name: round(row["p95_ms_c1"], 2) for name, row in figures.items()},
        "throughput_c8": {name: round(row["searches_per_s_c8"], 2) for name, row in figures.items()},
        "fastest_peer_p50": None,
        "fastest_peer_throughput": None,
        "p50_ratio_vs_fastest_peer": None,
        "throughput_ratio_c8_vs_fastest_peer": None,
        "goals": None,
    }
    if not peers or RAGMESH not in figures:
        return out
    by_p50 = min(peers, key=lambda p: figures[p]["p50_ms_c1"])
    by_throughput = max(peers, key=lambda p: figures[p]["searches_per_s_c8"])
    mesh = figures[RAGMESH]
    p50_ratio = mesh["p50_ms_c1"] / figures[by_p50]["p50_ms_c1"]
    throughput_ratio = mesh["searches_per_s_c8"] / figures[by_throughput]["searches_per_s_c8"]
    out.update(
        fastest_peer_p50=by_p50,
        fastest_peer_throughput=by_throughput,
        p50_ratio_vs_fastest_peer=round(p50_ratio, 4),
        throughput_ratio_c8_vs_fastest_peer=round(throughput_ratio, 4),
        goals={
            "ndcg10_ge_every_peer": all(ndcg10[RAGMESH] >= ndcg10[p] for p in peers if p in ndcg10),
            "p50_le_1_5x_fastest_peer": p50_ratio <= P50_GOAL_RATIO,
            "throughput_c8_ge_fastest_peer": throughput_ratio >= 1.0,
        },
    )
    return out


def bootstraps(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """ragmesh minus each peer, nDCG@10 per query, with a paired bootstrap CI."""
    if RAGMESH not in per_query:
        return {}
    return {
        f"{RAGMESH}_minus_{peer}": metrics.paired_bootstrap(per_query[peer], per_query[RAGMESH]).to_dict()
        for peer in PEERS
        if peer in per_query
    }


def table(result: Mapping[str, Any]) -> str:
    figures, ndcg = result["figures"], result["comparison"]["ndcg10"]
    lines = [
        "| system | nDCG@10 | p50 c=1 (ms) | p95 c=1 (ms) | p50 c=8 (ms) | throughput c=8 (searches/s) |",
        "|---|---|---|---|---|---|",
    ]
    for name in SYSTEMS:
        if name in figures:
            row = figures[name]
            lines.append(
                f"| {name} | {ndcg[name]:.4f} | {row['p50_ms_c1']:.1f} | {row['p95_ms_c1']:.1f} | "
                f"{row['p50_ms_c8']:.1f} | {row['searches_per_s_c8']:.1f} |"
            )
    cmp = result["comparison"]
    if cmp["goals"] is not None:
        lines.append("")
        lines.append(
            f"ragmesh p50 / {cmp['fastest_peer_p50']} p50: {cmp['p50_ratio_vs_fastest_peer']:.2f}x; "
            f"ragmesh throughput / {cmp['fastest_peer_throughput']}: "
            f"{cmp['throughput_ratio_c8_vs_fastest_peer']:.2f}x; goals: {cmp['goals']}"
        )
    if RAGMESH in figures:
        lines.append(f"ragmesh degraded searches: {result['ragmesh_degradations'] or 'none'}")
    for name, diff in result["ndcg10_bootstrap"].items():
        ci = f"[{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}]"
        lines.append(f"{name}: {diff['mean_diff']:+.4f} nDCG@10 (95% CI {ci})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main


async def build_systems(
    args: argparse.Namespace, dataset: BeirDataset, workdir: Path, skipped: dict[str, str]
) -> tuple[dict[str, System], dict[str, Any]]:
    wanted = [s for s in args.systems.split(",") if s]
    corpus: dict[str, Any] = {}
    systems: dict[str, System] = {}
    peers = [p for p in PEERS if p in wanted]
    if peers:
        settings = EmbedderSettings()
        model = await asyncio.to_thread(EmbeddingModel.load, settings)
        chunks, documents = await asyncio.to_thread(load_chunks, dataset, args.docs)
        corpus = {"documents": documents, "chunks": len(chunks)}
        progress(f"corpus: {documents} documents, {len(chunks)} chunks")
        vectors = await asyncio.to_thread(
            passage_vectors, model, settings, dataset.corpus_path, chunks, args.cache_dir
        )
        pool = PlannerSettings().planner_precise_pool
        builders: dict[str, Callable[[], SyncSearch]] = {
            HAYSTACK: lambda: build_haystack(model, chunks, vectors, pool),
            LANCEDB: lambda: build_lancedb(model, chunks, vectors, pool, workdir / "lancedb"),
        }
        for name in peers:
            try:
                systems[name] = System(name, sync=await asyncio.to_thread(builders[name]))
            except ImportError as exc:
                skipped[name] = f"not installed ({exc}); `make peer-bench` installs the bench extra"
            except Exception as exc:  # report why and measure the others
                skipped[name] = f"failed to build: {type(exc).__name__}: {exc}"
    if RAGMESH in wanted:
        if args.docs:
            skipped[RAGMESH] = "--docs subsets the peers' corpus only: the mesh holds the whole corpus"
        elif not args.gateway:
            skipped[RAGMESH] = "no --gateway given"
        else:
            systems[RAGMESH] = System(RAGMESH)  # the search is bound once the channel is open
    for name, why in skipped.items():
        progress(f"{name} skipped: {why}")
    return systems, corpus


async def measure(args: argparse.Namespace, dataset: BeirDataset, workdir: Path) -> dict[str, Any]:
    skipped: dict[str, str] = {}
    systems, corpus = await build_systems(args, dataset, workdir, skipped)
    if not systems:
        raise SystemExit(f"nothing to measure: {skipped}")
    degraded: Counter[str] = Counter()
    query_ids = list(dataset.queries)
    queries = [dataset.queries[q] for q in query_ids]
    async with contextlib.AsyncExitStack() as stack:
        if RAGMESH in systems:
            # No retries: a retried search would hide its failure in a latency.
            client = await stack.enter_async_context(
                gateway_client(args.gateway, retry=RetryPolicy(max_attempts=1))
            )
            systems[RAGMESH].run_async = ragmesh_search(client, args.collection, degraded)
        names = [name for name in SYSTEMS if name in systems]
        per_query: dict[str, dict[str, float]] = {}
        for name in names:  # warm-up: every claim once, its answers scored
            run = await systems[name].run(queries, max(CONCURRENCY), None)
            per_query[name] = ndcg_scores(run.answers, query_ids, dataset.qrels)
            progress(f"warm-up {name}: nDCG@10 {metrics.mean(per_query[name].values()):.4f}")
        runs: dict[tuple[str, int], list[LoadRun]] = {}
        seconds = args.seconds / args.passes
        for pass_no in range(args.passes):
            for name, c in pass_order(pass_no, names):
                run = await systems[name].run(queries, c, seconds)
                runs.setdefault((name, c), []).append(run)
                progress(
                    f"pass {pass_no + 1} {name} c={c}: {len(run.latencies_s)} searches, "
                    f"p50 {np.median(run.latencies_s) * 1000:.1f} ms, "
                    f"{len(run.latencies_s) / run.wall_s:.1f}/s"
                )
    ndcg10 = {name: metrics.mean(scores.values()) for name, scores in per_query.items()}
    figures = system_figures(runs)
    return {
        "corpus": corpus,
        "skipped": skipped,
        "ragmesh_degradations": dict(degraded),
        "figures": {name: {k: round(v, 3) for k, v in row.items()} for name, row in figures.items()},
        "comparison": comparison(figures, ndcg10),
        "ndcg10_bootstrap": bootstraps(per_query),
    }


def peer_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for package in ("haystack-ai", "lancedb", "pyarrow"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, default=Path("../shared/bench/scifact"))
    parser.add_argument("--split", default="test")
    parser.add_argument("--gateway", default="", help="HOST:PORT of a running mesh's gateway")
    parser.add_argument("--collection", default="scifact", help="the mesh's collection holding the corpus")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of " + ", ".join(SYSTEMS))
    parser.add_argument("--limit", type=int, default=0, help="claims to ask (0: every judged claim)")
    parser.add_argument(
        "--docs",
        type=int,
        default=0,
        help="peers index this many documents (0: all), every gold document of the claims kept; "
        "skips ragmesh, whose mesh holds the whole corpus",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per cell, all passes")
    parser.add_argument("--passes", type=int, default=2, help="ABBA passes over the cells")
    parser.add_argument(
        "--out", type=Path, default=None, help="report (default bench/results/peer-<time>.json)"
    )
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="passage vectors kept here")
    parser.add_argument("--json", action="store_true", help="end with one line: the comparison as JSON")
    args = parser.parse_args(argv)
    unknown = set(args.systems.split(",")) - set(SYSTEMS) - {""}
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}")
    if args.passes < 1 or args.seconds <= 0:
        parser.error("--passes must be >= 1 and --seconds > 0")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    dataset = load_dataset(args.dataset, args.split, args.limit or None)
    workdir = Path(tempfile.mkdtemp(prefix="ragmesh-peer-bench-"))
    started = time.time()
    try:
        measured = asyncio.run(measure(args, dataset, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "bench": "peer",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "command": " ".join([Path(sys.executable).name, "-m", "bench.peer_bench", *sys.argv[1:]]),
        "dataset": str(args.dataset),
        "split": args.split,
        "claims": len(dataset.queries),
        "seconds_per_cell": args.seconds,
        "passes": args.passes,
        "top_k": DEFAULT_TOP_K,
        "peer_pool": PlannerSettings().planner_precise_pool,
        "versions": peer_versions(),
        "cpus": os.cpu_count(),
        **measured,
    }
    out = args.out or Path("bench/results") / f"peer-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print()
    print(table(result))
    print(f"\nwritten to {out}")
    if args.json:
        summary_line = {
            "bench": "peer",
            **result["comparison"],
            "skipped": result["skipped"],
            "ragmesh_degradations": result["ragmesh_degradations"],
        }
        print(json.dumps(summary_line, sort_keys=True))


if __name__ == "__main__":
    main()
