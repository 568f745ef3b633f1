"""Reranker settings side by side: nDCG@10 and time per query for each (tokens per pair, passage
window, opening tokens kept, candidates), final blend weight and keep-fused margin, on the gateway's own fused
candidates, with the gateway's selection, blend and keep-fused rules
(``bench.rerank_inprocess.reranked_order``),
against the first variant given (the reference) with a paired bootstrap. Each variant's scores
are cached (``--cache``) by model, setting and candidates: a rerun, or another blend weight,
costs no model time.

    .venv/bin/python -m bench.rerank_variants --gateway 127.0.0.1:PORT --set scifact:val \\
        --variant 256:head:0:35 --variant 160:overlap:32:35 --weights 0.5 1 --margins 0 1

Sets:
- ``scifact:val``: the 121 SciFact train claims the bundled model's build held out (its seed and
  share), the set to choose a setting on;
- ``scifact:test``: the 300 test claims, to report;
- ``qa:PATH:SPLIT``: a question set of ``bench.qa`` (answerable questions; the gold page is the
  relevant document), e.g. ``qa:bench/qa/grpc_docs.jsonl:test``, another domain's documents.
The mesh must hold the set's corpus (``--collection``). Candidates are fetched once per set
(rerank off, one result per document) and cached under ``--cache``; every variant then scores
them in this process, one query at a time as a search would.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import qa
from bench.rerank_inprocess import fused_candidates, rerank_scores, reranked_order
from bench.rerank_workloads import Variant, percentile
from meshkit.settings import GatewaySettings, RerankerSettings
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh_cli import metrics
from ragmesh_cli.datasets import load_dataset
from ragmesh_cli.rerankerbuild.build import VALIDATION_SHARE
from ragmesh_cli.rerankerbuild.mining import split_claims

DEPTH = 100
SEED = 13  # the bundled model's build seed: its held-out claims


@dataclass
class QuerySet:
    name: str
    queries: dict[str, str]
    qrels: metrics.Qrels


def load_set(spec: str, dataset: Path) -> QuerySet:
    kind, _, rest = spec.partition(":")
    if kind == "scifact" and rest == "val":
        data = load_dataset(dataset, "train")
        _, held_out = split_claims(data.queries, data.qrels, VALIDATION_SHARE, SEED)
        queries = {qid: text for qid, text, _ in held_out}
        return QuerySet(spec, queries, {q: data.qrels[q] for q in queries})
    if kind == "scifact" and rest == "test":
        data = load_dataset(dataset, "test")
        return QuerySet(spec, dict(data.queries), dict(data.qrels))
    if kind == "qa":
        path, _, split = rest.rpartition(":")
        items = [i for i in qa.read(Path(path)) if i.answerable and i.split == split]
        return QuerySet(
            spec,
            {i.id: i.question for i in items},
            {i.id: dict.fromkeys(i.gold_doc_ids, 1) for i in items},
        )
    raise argparse.ArgumentTypeError(f"unknown set {spec!r}: scifact:val, scifact:test or qa:PATH:SPLIT")


async def cached_candidates(
    address: str, collection: str, group: QuerySet, cache: Path
) -> dict[str, list[gateway_pb2.SearchResult]]:
    key = hashlib.sha256(json.dumps([collection, group.name, sorted(group.queries)]).encode()).hexdigest()
    path = cache / f"candidates-{key[:16]}.json"
    if path.is_file():
        raw = json.loads(path.read_text())
        parse = gateway_pb2.SearchResult.FromString
        return {q: [parse(bytes.fromhex(r)) for r in rs] for q, rs in raw.items()}
    print(f"fetching fused candidates for {len(group.queries)} queries of {group.name}", flush=True)
    found = await fused_candidates(address, collection, group.queries, DEPTH)
    save(path, {q: [r.SerializeToString().hex() for r in rs] for q, rs in found.items()})
    return found


def save(path: Path, payload: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")


@dataclass
class Scored:
    scores: dict[str, list[float]]  # query id -> the model's score of each candidate
    ms: dict[str, float]  # query id -> milliseconds to score its candidates
    cached: bool


def score_variant(
    args: argparse.Namespace,
    variant: Variant,
    group: QuerySet,
    candidates: dict[str, list[gateway_pb2.SearchResult]],
) -> Scored:
    """The variant's scores of every query's candidates, from the cache when this model, setting
    and candidate set were scored before (scores are deterministic; the times are then the first
    run's)."""
    model = variant.spec(args.model_dir).load()
    key_parts = [model.model_sha256, str(variant), group.name, sorted(candidates)]
    key = hashlib.sha256(json.dumps(key_parts).encode()).hexdigest()[:16]
    path = args.cache / f"scores-{key}.json"
    if path.is_file():
        raw = json.loads(path.read_text())
        return Scored(raw["scores"], raw["ms"], cached=True)
    scored = Scored({}, {}, cached=False)
    for done, (qid, results) in enumerate(candidates.items(), start=1):
        query = group.queries[qid]
        scored.scores[qid], scored.ms[qid] = rerank_scores(model, query, results, variant.candidates)
        if done % 50 == 0:
            print(f"  {variant}: {done}/{len(candidates)} queries", flush=True)
    save(path, {"scores": scored.scores, "ms": scored.ms})
    return scored


def compare(reference: dict[str, float], other: dict[str, float]) -> dict[str, Any]:
    boot = metrics.paired_bootstrap(reference, other)
    return {"diff": round(boot.mean_diff, 4), "ci95": [round(boot.ci_low, 4), round(boot.ci_high, 4)]}


def evaluate_set(
    args: argparse.Namespace, group: QuerySet, candidates: dict[str, list[gateway_pb2.SearchResult]]
) -> list[dict[str, Any]]:
    ndcg = metrics.STANDARD_METRICS["ndcg@10"]
    fused = metrics.per_query({q: [r.doc_id for r in rs] for q, rs in candidates.items()}, group.qrels, ndcg)
    rows: list[dict[str, Any]] = [{"variant": "fused", "ndcg@10": round(metrics.mean(fused.values()), 4)}]
    reference: dict[str, float] | None = None
    for variant in args.variant:
        scored = score_variant(args, variant, group, candidates)
        times = list(scored.ms.values())
        for weight, margin in itertools.product(args.weights, args.margins):
            run = {
                qid: reranked_order(results, variant.candidates, scored.scores[qid], weight, margin)
                for qid, results in candidates.items()
            }
            per_query = metrics.per_query(run, group.qrels, ndcg)
            reference = reference or per_query
            row = {
                "variant": str(variant),
                "fused_weight": weight,
                "keep_fused_margin": margin,
                "ndcg@10": round(metrics.mean(per_query.values()), 4),
                "vs_reference": compare(reference, per_query),
                "vs_fused": compare(fused, per_query),
                "p50_ms": round(percentile(times, 50), 1),
                "p95_ms": round(percentile(times, 95), 1),
                "timing": "cached from the first run" if scored.cached else "this run",
            }
            print(f"{group.name} {json.dumps(row)}", flush=True)
            rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gateway", required=True, help="gateway of a mesh holding the sets' corpora")
    parser.add_argument("--collection", default="scifact")
    parser.add_argument("--set", dest="sets", action="append", required=True, help="repeatable; see above")
    parser.add_argument(
        "--variant", type=Variant.parse, action="append", required=True, help="the first: the reference"
    )
    parser.add_argument("--dataset", type=Path, default=Path("../shared/bench/scifact"))
    parser.add_argument("--model-dir", type=Path, default=RerankerSettings().reranker_model_dir)
    parser.add_argument(
        "--weights",
        type=float,
        nargs="+",
        default=[GatewaySettings().calibration.rerank_fused_weight],
        help="fused weights of the final blend to evaluate (each variant is scored once)",
    )
    parser.add_argument(
        "--margins",
        type=float,
        nargs="+",
        default=[GatewaySettings().calibration.rerank_keep_fused_margin],
        help="keep-fused margins to evaluate (0: always the reranker's order)",
    )
    parser.add_argument("--cache", type=Path, default=Path(".cache/rerank-variants"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/rerank-variants.json"))
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "model_dir": str(args.model_dir), "sets": {}}
    for spec in args.sets:
        group = load_set(spec, args.dataset)
        candidates = asyncio.run(cached_candidates(args.gateway, args.collection, group, args.cache))
        report["sets"][spec] = evaluate_set(args, group, candidates)
    save(args.out, report)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
