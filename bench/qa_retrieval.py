"""Retrieval on the grpc-docs question set: does the answering page come back in the top 1 / 5 /
10 documents, fused (RRF over dense, BM25, exact) and reranked (the cross-encoder on the fused
candidates)? Prints one JSON line.

    ragmesh up --state-dir /tmp/qa-stack
    ragmesh ingest --state-dir /tmp/qa-stack --collection grpcdocs --wait ../shared/corpora/grpc-docs/docs
    .venv/bin/python -m bench.qa_retrieval --state-dir /tmp/qa-stack --collection grpcdocs

Searches go through the gateway of a running stack, one document per result
(``collapse_documents``), as a caller would ask them. A question counts as found at k when any
of its gold documents is among the first k results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from bench import qa
from bench.qa import QAItem, Split
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh_cli.addresses import resolve_address
from ragmesh_cli.channels import gateway_client, use_state_dir
from ragmesh_client import AsyncClient

CUTOFFS = (1, 5, 10)
TIMEOUT_S = 60.0
# Searches in flight: enough to keep the stages busy, few enough for a shared 2-core machine.
CONCURRENCY = 4


def gold_rank(item: QAItem, doc_ids: Sequence[str]) -> int | None:
    """1-based rank of the first gold document in ``doc_ids``, or None."""
    gold = set(item.gold_doc_ids)
    return next((rank for rank, doc_id in enumerate(doc_ids, start=1) if doc_id in gold), None)


def hit_rates(ranks: Sequence[int | None]) -> dict[str, float]:
    return {
        f"top{k}": round(sum(1 for r in ranks if r is not None and r <= k) / len(ranks), 3) for k in CUTOFFS
    }


async def ranked_doc_ids(
    client: AsyncClient,
    collection: str,
    question: str,
    rerank: bool,
    max_variations: int = 0,
) -> list[str]:
    request = gateway_pb2.SearchRequest(
        collection=collection,
        query=question,
        top_k=max(CUTOFFS),
        collapse_documents=True,
        rerank=rerank,
        max_variations=max_variations,
    )
    # max_variations is a contract field the client does not map: the request goes as it is.
    response = await client.search(collection, question, request=request, timeout=TIMEOUT_S)
    return [result.doc_id for result in response.results]


async def measure(
    address: str, collection: str, items: Sequence[QAItem], max_variations: int = 0, fused_only: bool = False
) -> dict[str, object]:
    gate = asyncio.Semaphore(CONCURRENCY)
    report: dict[str, object] = {
        "questions": len(items),
        "collection": collection,
        "max_variations": max_variations,
    }
    async with gateway_client(address) as client:

        async def rank(item: QAItem, rerank: bool) -> int | None:
            async with gate:
                found = await ranked_doc_ids(client, collection, item.question, rerank, max_variations)
                return gold_rank(item, found)

        systems = (("fused", False),) if fused_only else (("fused", False), ("reranked", True))
        for name, rerank in systems:
            ranks = await asyncio.gather(*(rank(item, rerank) for item in items))
            report[name] = hit_rates(ranks)
            report[f"{name}_missed_top10"] = [
                item.id for item, r in zip(items, ranks, strict=True) if r is None
            ]
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="state directory of a running stack")
    parser.add_argument("--collection", default="grpcdocs")
    parser.add_argument("--split", choices=qa.SPLITS, default="test")
    parser.add_argument(
        "--max-variations",
        type=int,
        nargs="+",
        default=[0],
        help="dense query variations per search (0: the planner's default); one JSON line per value",
    )
    parser.add_argument("--fused-only", action="store_true", help="skip the reranked searches")
    args = parser.parse_args(argv)
    split: Split = args.split
    items = [item for item in qa.load_grpc_docs(split) if item.answerable]
    use_state_dir(args.state_dir)
    address = resolve_address("gateway", args.state_dir)
    for variations in args.max_variations:
        report = asyncio.run(measure(address, args.collection, items, variations, args.fused_only))
        print(json.dumps({"set": "grpc_docs", "split": split, **report}))


if __name__ == "__main__":
    main()
