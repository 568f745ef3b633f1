"""Section 4 of bench.rerank_bench: the default model, as served, against the quality option:
nDCG@10 of the test claims reranked by each, and the paired bootstrap of the loss."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.rerank_inprocess import rerank_run
from bench.rerank_workloads import ModelSpec, Workload, bm25_workload
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh_cli import metrics
from ragmesh_cli.datasets import load_dataset
from ragmesh_cli.rerankerbuild.mining import chunk_corpus, read_beir_corpus
from services.reranker.model import CrossEncoderModel

# The reranker figure: one claim's candidates at concurrency 1.
SUMMARY_CANDIDATES = 35


def reranked_docs(
    model: CrossEncoderModel, query: str, texts: Sequence[str], docs: Sequence[str]
) -> list[str]:
    scores, _ = model.score(query, texts)
    return metrics.first_occurrence(docs[i] for i in np.argsort(-scores, kind="stable"))


def ndcg_per_query(
    model: CrossEncoderModel,
    work: Workload,
    qrels: metrics.Qrels,
    fused: dict[str, list[gateway_pb2.SearchResult]] | None,
    weight: float,
) -> dict[str, float]:
    """nDCG@10 of each test claim reranked by ``model``: with the gateway's fused candidates and
    blend when given, else the claim's BM25 candidates ordered by the model's scores."""
    run: dict[str, list[str]] = {}
    for qid, query, texts, docs in zip(
        work.query_ids, work.queries, work.candidates, work.doc_ids, strict=True
    ):
        if fused is not None:
            run[qid], _ = rerank_run(model, query, fused[qid], SUMMARY_CANDIDATES, weight)
        else:
            run[qid] = reranked_docs(model, query, texts, docs)
    return metrics.per_query(run, qrels, metrics.STANDARD_METRICS["ndcg@10"])


def quality_comparison(
    default: ModelSpec,
    quality: ModelSpec,
    dataset: Path,
    limit: int,
    fused: dict[str, list[gateway_pb2.SearchResult]] | None,
    weight: float,
) -> dict[str, Any]:
    """nDCG@10 of the default model, as served, against the quality option on the test claims."""
    same = default == quality
    out: dict[str, Any] = {"default": default.label(), "quality": quality.label(), "same_model": same}
    if same:
        return out | {"ndcg10_loss": 0.0, "basis": "the same model on both sides: no loss by construction"}
    data = load_dataset(dataset, "test", limit or None)
    corpus = chunk_corpus(read_beir_corpus(data.corpus_path), "bench")
    work = bm25_workload(corpus, sorted(data.queries.items()), SUMMARY_CANDIDATES)
    default_scores = ndcg_per_query(default.load(), work, data.qrels, fused, weight)
    quality_scores = ndcg_per_query(quality.load(), work, data.qrels, fused, weight)
    boot = metrics.paired_bootstrap(default_scores, quality_scores)
    return out | {
        "candidates": "gateway fused (blend as served)" if fused is not None else "BM25 top 35 (in process)",
        "claims": boot.queries,
        "ndcg10_default": round(boot.mean_a, 4),
        "ndcg10_quality": round(boot.mean_b, 4),
        "ndcg10_loss": round(boot.mean_diff, 4),
        "ndcg10_loss_ci95": [round(boot.ci_low, 4), round(boot.ci_high, 4)],
        "basis": "paired bootstrap over the test claims (quality minus default)",
    }
