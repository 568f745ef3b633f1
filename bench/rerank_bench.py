"""Reranker tier: latency and throughput of the service against the model's raw in-process
throughput, int8 against fp32 score agreement, and the speed/quality trade-off on CPU.

    make bench    # or: .venv/bin/python -m bench.rerank_bench --dataset ../shared/bench/scifact

1. Raw vs service. The same (query, passage) pairs, SciFact train claims against their BM25 top
   chunks, scored (a) by ``CrossEncoderModel.score_pairs`` in batches of 64 in this process and
   (b) through the reranker service over gRPC (the real servicer and micro-batcher, started in
   this process on a loopback port), with 35 and 60 candidates per request at concurrency 1 and
   8. Sides alternate in ABBA order so drift on a shared machine falls on both.
2. int8 vs fp32. With the fp32 export the build leaves in its work dir, the Spearman correlation
   of the two models' scores over each claim's candidates (mean over claims), and the share of
   claims whose top-1 is the same.
3. Trade-off (``--gateway``: a running mesh holding the dataset). The fused candidates of the test
   claims, fetched once from the gateway (rerank off), are reranked in this process under each
   variant (tokens per pair, passage window, opening tokens kept, candidates), with the gateway's
   own selection and blend code: nDCG@10 and the p50 time to score one claim's candidates.
   ``bench/rerank_variants.py`` runs any variants on other question sets.
4. Default against quality. The default is the model as the service serves it (the
   ``RAGMESH_RERANKER_*`` token limit and window); the quality option is ``--quality-model-dir``
   (default: the same model) at its full length with head windows. nDCG@10 of the test claims
   reranked by each (the gateway's fused candidates with ``--gateway``, else each claim's BM25
   top 35 in this process) and the paired bootstrap of the loss. The same model served the same
   way on both sides loses nothing by construction: nothing is scored and the loss is 0.0.

``--json``: the last line of output is one JSON object (``summary``) for comparing runs across
changes: ``p50_ms_35`` (the default model through the service, 35 candidates, concurrency 1),
pairs/s, ``ndcg10_loss`` (quality minus default; above 0: the default loses) and the models
compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from grpc import aio

from bench.rerank_inprocess import fused_candidates, rerank_run
from bench.rerank_quality import SUMMARY_CANDIDATES, quality_comparison
from bench.rerank_workloads import (
    TRADE_OFF,
    ModelSpec,
    Variant,
    Workload,
    percentile,
    served_spec,
    train_workload,
)
from meshkit.rpc.server import start_service
from meshkit.settings import GatewaySettings, RerankerSettings
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc
from ragmesh_cli import metrics
from ragmesh_cli.datasets import load_dataset
from ragmesh_cli.rerankerbuild.export import write_manifest
from services.reranker.model import CrossEncoderModel
from services.reranker.servicer import build_spec

RESULTS = Path("bench/results/rerank.json")
# Pairs per raw measurement: two model runs of 64, the service's batch size.
RAW_PAIRS = 128


# ---------------------------------------------------------------------------- 1. raw vs service


def raw_pairs_per_s(model: CrossEncoderModel, work: Workload, pairs: int) -> float:
    queries = [q for q, c in zip(work.queries, work.candidates, strict=True) for _ in c][:pairs]
    texts = [t for c in work.candidates for t in c][:pairs]
    started = time.perf_counter()
    model.score_pairs(queries, texts)
    return len(texts) / (time.perf_counter() - started)


async def service_load(
    stub: reranker_pb2_grpc.RerankerServiceStub,
    work: Workload,
    candidates: int,
    concurrency: int,
    requests: int,
) -> dict[str, float]:
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        query, texts = (
            work.queries[i % len(work.queries)],
            work.candidates[i % len(work.queries)][:candidates],
        )
        # The requests repeat (i modulo the workload): the model is measured, not the cache.
        request = reranker_pb2.RerankRequest(
            query=query,
            passages=[reranker_pb2.Passage(id=str(j), text=t) for j, t in enumerate(texts)],
            uncached=True,
        )
        async with gate:
            started = time.perf_counter()
            await stub.Rerank(request, timeout=120)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    wall = time.perf_counter() - started
    return {
        "p50_ms": round(percentile(latencies, 50), 1),
        "p95_ms": round(percentile(latencies, 95), 1),
        "pairs_per_s": round(requests * candidates / wall, 1),
    }


async def raw_vs_service(model: CrossEncoderModel, work: Workload, requests: int) -> dict[str, Any]:
    settings = RerankerSettings(port=0, log_format="text", reranker_max_passages=256)
    spec, _ = build_spec(settings, model)
    running = await start_service(spec, settings)
    rows: dict[str, Any] = {}
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = reranker_pb2_grpc.RerankerServiceStub(channel)
            await service_load(stub, work, 8, 1, 2)  # warm-up
            raw: list[float] = []
            for candidates in (35, 60):
                for concurrency in (1, 8):
                    # ABBA: raw, service, service, raw.
                    raw.append(await asyncio.to_thread(raw_pairs_per_s, model, work, RAW_PAIRS))
                    first = await service_load(stub, work, candidates, concurrency, requests)
                    second = await service_load(stub, work, candidates, concurrency, requests)
                    raw.append(await asyncio.to_thread(raw_pairs_per_s, model, work, RAW_PAIRS))
                    name = f"{candidates}@c{concurrency}"
                    rows[name] = {key: round((first[key] + second[key]) / 2, 1) for key in first}
                    print(f"  {candidates} candidates, concurrency {concurrency}: {rows[name]}")
    finally:
        await running.stop(0)
    raw_rate = statistics.median(raw)
    for row in rows.values():
        row["vs_raw"] = round(row["pairs_per_s"] / raw_rate, 2)
    return {"raw_pairs_per_s": round(raw_rate, 1), "service": rows}


# ---------------------------------------------------------------------------- 2. int8 vs fp32


def fp32_model(model_dir: Path, fp32: Path, scratch: Path) -> CrossEncoderModel:
    """The fp32 export as a model directory (same tokenizer and calibration as the int8 one)."""
    manifest = json.loads((model_dir / "manifest.json").read_text())
    (scratch / "model.onnx").symlink_to(fp32.resolve())
    (scratch / "tokenizer.json").symlink_to((model_dir / "tokenizer.json").resolve())
    manifest.pop("files", None)
    write_manifest(scratch, manifest)
    return CrossEncoderModel.load(scratch)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def int8_vs_fp32(
    int8: CrossEncoderModel, fp32: CrossEncoderModel, work: Workload, depth: int
) -> dict[str, Any]:
    correlations, same_top = [], 0
    for query, texts in zip(work.queries, work.candidates, strict=True):
        a, _ = int8.score(query, texts[:depth])
        b, _ = fp32.score(query, texts[:depth])
        correlations.append(spearman(a, b))
        same_top += int(np.argmax(a) == np.argmax(b))
    return {
        "claims": len(work.queries),
        "candidates": depth,
        "spearman_mean": round(statistics.mean(correlations), 4),
        "spearman_min": round(min(correlations), 4),
        "same_top1_share": round(same_top / len(work.queries), 4),
    }


# ---------------------------------------------------------------------------- 3. trade-off


def trade_off(
    model_dir: Path,
    candidates: dict[str, list[gateway_pb2.SearchResult]],
    queries: dict[str, str],
    qrels: metrics.Qrels,
    variants: Sequence[Variant],
    weight: float,
) -> list[dict[str, Any]]:
    ndcg = metrics.STANDARD_METRICS["ndcg@10"]
    rows = []
    fused_run = {qid: [r.doc_id for r in results] for qid, results in candidates.items()}
    fused_score = metrics.mean(metrics.per_query(fused_run, qrels, ndcg).values())
    for variant in variants:
        model = variant.spec(model_dir).load()
        run, times = {}, []
        for qid, results in candidates.items():
            run[qid], ms = rerank_run(model, queries[qid], results, variant.candidates, weight)
            times.append(ms)
        score = metrics.mean(metrics.per_query(run, qrels, ndcg).values())
        row = {
            "variant": str(variant),
            "ndcg@10": round(score, 4),
            "fused_ndcg@10": round(fused_score, 4),
            "p50_ms": round(percentile(times, 50), 1),
            "p95_ms": round(percentile(times, 95), 1),
        }
        print(f"  {row}")
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------- the summary and the run


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The one-line JSON of ``--json``: the default model's latency and throughput for 35
    candidates through the service, and its nDCG@10 loss against the quality model."""
    service = report["raw_vs_service"]["service"]
    c1, c8 = service[f"{SUMMARY_CANDIDATES}@c1"], service.get(f"{SUMMARY_CANDIDATES}@c8", {})
    quality = report["quality"]
    return {
        "bench": "rerank",
        "model": report["model"]["name"],
        "max_tokens": report["model"]["max_tokens"],
        "window": report["model"]["window"],
        "quality": quality["quality"],
        "same_model": quality["same_model"],
        "p50_ms_35": c1["p50_ms"],
        "p95_ms_35": c1["p95_ms"],
        "pairs_per_s_c1": c1["pairs_per_s"],
        "pairs_per_s_c8": c8.get("pairs_per_s"),
        "raw_pairs_per_s": report["raw_vs_service"]["raw_pairs_per_s"],
        "ndcg10_loss": quality["ndcg10_loss"],
        "ndcg10_loss_ci95": quality.get("ndcg10_loss_ci95"),
        "ndcg10_basis": quality["basis"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, default=Path("../shared/bench/scifact"))
    parser.add_argument("--model-dir", type=Path, default=RerankerSettings().reranker_model_dir)
    parser.add_argument("--fp32", type=Path, default=Path(".cache/reranker-build/model-fp32.onnx"))
    parser.add_argument("--claims", type=int, default=20, help="train claims for sections 1 and 2")
    parser.add_argument("--requests", type=int, default=8, help="service requests per measurement")
    parser.add_argument("--gateway", default=None, help="a mesh holding the dataset: run section 3")
    parser.add_argument("--collection", default="scifact")
    parser.add_argument("--limit", type=int, default=100, help="test claims for section 3 (0: all)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--quality-model-dir",
        type=Path,
        default=None,
        help="the quality option, served at its full length with head windows (default: --model-dir)",
    )
    parser.add_argument("--json", action="store_true", help="end with the one-line JSON summary")
    args = parser.parse_args()

    report: dict[str, Any] = {"model_dir": str(args.model_dir)}
    default = served_spec(args.model_dir)
    model = default.load()
    report["model"] = {
        "name": model.manifest.name,
        "provider": model.provider,
        "max_tokens": model.max_tokens,
        "window": model.window,
    }
    print(f"building the workload: {args.claims} train claims x their BM25 top 60")
    work = train_workload(args.dataset, args.claims, 60, seed=7)
    print("1. raw in-process vs service")
    report["raw_vs_service"] = asyncio.run(raw_vs_service(model, work, args.requests))
    if args.fp32.is_file():
        print("2. int8 vs fp32")
        with tempfile.TemporaryDirectory() as scratch:
            fp32 = fp32_model(args.model_dir, args.fp32, Path(scratch))
            report["int8_vs_fp32"] = int8_vs_fp32(model, fp32, work, 20)
            print(f"  {report['int8_vs_fp32']}")
    else:
        print(f"2. skipped: no fp32 export at {args.fp32} (make reranker-model leaves one)")
    weight = GatewaySettings().calibration.rerank_fused_weight
    fused = None
    if args.gateway:
        print("3. trade-off on the test split")
        data = load_dataset(args.dataset, "test", args.limit or None)
        fused = asyncio.run(fused_candidates(args.gateway, args.collection, data.queries, 100))
        report["trade_off"] = trade_off(args.model_dir, fused, data.queries, data.qrels, TRADE_OFF, weight)
    print("4. default against the quality option")
    quality = ModelSpec(args.quality_model_dir or args.model_dir)
    report["quality"] = quality_comparison(default, quality, args.dataset, args.limit, fused, weight)
    print(f"  {report['quality']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    if args.json:
        print(json.dumps(summary(report), separators=(",", ":")))


if __name__ == "__main__":
    main()
