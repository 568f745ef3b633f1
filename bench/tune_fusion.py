"""Tune the gateway's fusion (RRF k, leg weights, pool depth, query variations) on a BEIR
split, offline: each query goes through the real gateway once per variation setting with
``include_leg_results``; every candidate configuration is then fused with the gateway's own
``services.gateway.fusion`` code and scored, so hundreds of settings cost no extra searches.

    .venv/bin/python -m bench.tune_fusion --dataset ../shared/bench/scifact --split train \\
        --state-dir .ragmesh --collection scifact

Tune on train only; report test with ``ragmesh eval`` using the chosen defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ragmesh.gateway.v1 import gateway_pb2
from ragmesh_cli.datasets import load_dataset
from ragmesh_cli.metrics import mrr_at_k, ndcg_at_k, recall_at_k
from ragmesh_cli.stack import Stack
from ragmesh_client import AsyncClient
from services.gateway.fusion import Hit, collapse_documents, rrf

LEG_NAMES = {gateway_pb2.LEG_DENSE: "dense", gateway_pb2.LEG_BM25: "bm25", gateway_pb2.LEG_EXACT: "exact"}
LegLists = dict[str, list[Hit]]


async def fetch_leg_lists(
    address: str, collection: str, queries: Mapping[str, str], variations: int, pool: int, concurrency: int
) -> dict[str, LegLists]:
    """Each query's per-leg chunk lists, as the gateway's legs returned them."""
    slots = asyncio.Semaphore(concurrency)
    out: dict[str, LegLists] = {}
    async with AsyncClient(address) as client:

        async def one(query_id: str, text: str) -> None:
            request = gateway_pb2.SearchRequest(
                collection=collection,
                query=text,
                top_k=10,
                pool_size=pool,
                max_variations=variations,
                include_leg_results=True,
                rerank=False,
            )
            async with slots:
                # Leg results and variations are contract fields the client does not map: the
                # request goes as it is and the legs are read from the reply message.
                reply = await client.search(collection, text, request=request, timeout=60)
            out[query_id] = {
                LEG_NAMES[leg.leg]: [Hit(h.chunk_id, h.doc_id, h.score) for h in leg.hits]
                for leg in reply.raw.leg_results
            }

        await asyncio.gather(*(one(qid, text) for qid, text in queries.items()))
    return out


def doc_ranking(legs: LegLists, weights: Mapping[str, float], k: float, pool: int) -> list[str]:
    truncated = {leg: hits[:pool] for leg, hits in legs.items() if leg in weights}
    return [item.doc_id for item in collapse_documents(rrf(truncated, weights, k))]


def single_leg_ranking(hits: Sequence[Hit]) -> list[str]:
    seen: dict[str, None] = {}
    for hit in hits:
        seen.setdefault(hit.doc_id, None)
    return list(seen)


def score(runs: Mapping[str, list[str]], qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    ids = [q for q in qrels if q in runs]
    return {
        "ndcg@10": sum(ndcg_at_k(runs[q], qrels[q], 10) for q in ids) / len(ids),
        "recall@100": sum(recall_at_k(runs[q], qrels[q], 100) for q in ids) / len(ids),
        "mrr@10": sum(mrr_at_k(runs[q], qrels[q], 10) for q in ids) / len(ids),
    }


def grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    configs = []
    for k, dense, bm25, exact, pool in itertools.product(
        args.k, args.dense, args.bm25, args.exact, args.pools
    ):
        configs.append({"k": k, "weights": {"dense": dense, "bm25": bm25, "exact": exact}, "pool": pool})
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--state-dir", type=Path, default=Path(".ragmesh"))
    parser.add_argument("--collection", default="scifact")
    parser.add_argument("--variations", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--fetch-pool", type=int, default=200, help="candidates fetched per leg")
    parser.add_argument("--pools", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--k", type=float, nargs="+", default=[10, 20, 30, 45, 60, 80])
    parser.add_argument("--dense", type=float, nargs="+", default=[0.6, 0.8, 1.0, 1.2, 1.5])
    parser.add_argument("--bm25", type=float, nargs="+", default=[1.0])
    parser.add_argument("--exact", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3, 0.5])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("bench/results/tune_fusion.json"))
    args = parser.parse_args()

    dataset = load_dataset(args.dataset, args.split)
    stack = Stack.load(args.state_dir)
    address = stack.address("gateway")
    results: list[dict[str, Any]] = []
    for variations in args.variations:
        started = time.perf_counter()
        legs_by_query = asyncio.run(
            fetch_leg_lists(
                address, args.collection, dataset.queries, variations, args.fetch_pool, args.concurrency
            )
        )
        print(
            f"variations={variations}: {len(legs_by_query)} queries in {time.perf_counter() - started:.0f}s"
        )
        for leg in ("dense", "bm25", "exact"):
            runs = {q: single_leg_ranking(legs.get(leg, [])) for q, legs in legs_by_query.items()}
            print(f"  leg {leg:5s} {score(runs, dataset.qrels)}")
        for config in grid(args):
            runs = {
                q: doc_ranking(legs, config["weights"], config["k"], config["pool"])
                for q, legs in legs_by_query.items()
            }
            results.append({"variations": variations, **config, **score(runs, dataset.qrels)})
    results.sort(key=lambda r: -r["ndcg@10"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\ntop {args.top} of {len(results)} configurations on {args.split} (by nDCG@10):")
    print("| variations | k | dense | bm25 | exact | pool | nDCG@10 | R@100 | MRR@10 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results[: args.top]:
        w = r["weights"]
        print(
            f"| {r['variations']} | {r['k']:g} | {w['dense']:g} | {w['bm25']:g} | {w['exact']:g} "
            f"| {r['pool']} | {r['ndcg@10']:.4f} | {r['recall@100']:.4f} | {r['mrr@10']:.4f} |"
        )


if __name__ == "__main__":
    main()
