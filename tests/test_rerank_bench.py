"""``bench/rerank_bench.py --json``: the one-line summary and the default-against-quality
comparison it reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench import rerank_bench
from meshkit.settings import RerankerSettings
from services.reranker.model import CrossEncoderModel

MODEL_DIR = RerankerSettings().reranker_model_dir


def report(quality: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_dir": str(MODEL_DIR),
        "model": {"name": "ragmesh-minilm-l6-ce-v1", "provider": "CPUExecutionProvider", "max_tokens": 256},
        "raw_vs_service": {
            "raw_pairs_per_s": 24.1,
            "service": {
                "35@c1": {"p50_ms": 1480.2, "p95_ms": 1602.0, "pairs_per_s": 23.0, "vs_raw": 0.95},
                "35@c8": {"p50_ms": 8400.0, "p95_ms": 9100.0, "pairs_per_s": 24.0, "vs_raw": 1.0},
                "60@c1": {"p50_ms": 2500.0, "p95_ms": 2700.0, "pairs_per_s": 23.5, "vs_raw": 0.98},
            },
        },
        "quality": quality,
    }


def test_the_summary_holds_the_35_candidate_figures_and_the_loss() -> None:
    quality = {
        "default_dir": "models/reranker/small",
        "quality_dir": str(MODEL_DIR),
        "same_model": False,
        "ndcg10_loss": 0.0042,
        "ndcg10_loss_ci95": [-0.001, 0.009],
        "basis": "paired bootstrap over the test claims (quality minus default)",
    }
    line = rerank_bench.summary(report(quality))
    assert line["p50_ms_35"] == 1480.2 and line["p95_ms_35"] == 1602.0
    assert line["pairs_per_s_c1"] == 23.0 and line["pairs_per_s_c8"] == 24.0
    assert line["raw_pairs_per_s"] == 24.1
    assert line["ndcg10_loss"] == 0.0042 and line["ndcg10_loss_ci95"] == [-0.001, 0.009]
    assert line["model"] == "ragmesh-minilm-l6-ce-v1" and line["quality_model_dir"] == str(MODEL_DIR)
    assert not line["same_model"]
    assert json.loads(json.dumps(line)) == line


def test_the_same_model_on_both_sides_loses_nothing_and_says_so() -> None:
    quality = rerank_bench.quality_comparison(MODEL_DIR, MODEL_DIR, Path("no-dataset-needed"), 10, None, 1.0)
    assert quality["same_model"] and quality["ndcg10_loss"] == 0.0
    assert "same model" in quality["basis"]
    line = rerank_bench.summary(report(quality))
    assert line["same_model"] and line["ndcg10_loss"] == 0.0 and line["ndcg10_loss_ci95"] is None


def test_reranked_documents_follow_the_models_scores_each_document_once() -> None:
    model = CrossEncoderModel.load(MODEL_DIR)
    query = "Vitamin D supplementation reduces fracture risk in older adults."
    texts = [
        "The committee approved the budget for the new library building.",
        "Vitamin D supplements given to adults over 65 reduced the rate of hip and other fractures.",
        "Rainfall in the region was higher than average this spring.",
        "Older adults taking vitamin D had fewer fractures than those on placebo.",
    ]
    docs = ["budget", "vitd", "rain", "vitd"]
    ranked = rerank_bench.reranked_docs(model, query, texts, docs)
    scores, _ = model.score(query, texts)
    best = docs[int(np.argmax(scores))]
    assert ranked[0] == best == "vitd"
    assert sorted(ranked) == ["budget", "rain", "vitd"]
