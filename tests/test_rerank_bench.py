"""``bench/rerank_bench.py --json``: the one-line summary and the default-against-quality
comparison it reports."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import rerank_bench, rerank_inprocess, rerank_quality, rerank_workloads
from meshkit.settings import RerankerSettings
from ragmesh.gateway.v1 import gateway_pb2
from services.reranker.model import CrossEncoderModel

MODEL_DIR = RerankerSettings().reranker_model_dir


def report(quality: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_dir": str(MODEL_DIR),
        "model": {
            "name": "ragmesh-minilm-l6-ce-v1",
            "provider": "CPUExecutionProvider",
            "max_tokens": 160,
            "window": "overlap",
        },
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
        "default": "models/reranker/small (160 tokens, overlap windows)",
        "quality": f"{MODEL_DIR} (full tokens, head windows)",
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
    assert line["model"] == "ragmesh-minilm-l6-ce-v1" and line["quality"] == quality["quality"]
    assert line["max_tokens"] == 160 and line["window"] == "overlap"
    assert not line["same_model"]
    assert json.loads(json.dumps(line)) == line


def test_the_same_model_on_both_sides_loses_nothing_and_says_so() -> None:
    spec = rerank_workloads.ModelSpec(MODEL_DIR)
    quality = rerank_quality.quality_comparison(spec, spec, Path("no-dataset-needed"), 10, None, 1.0)
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
    ranked = rerank_quality.reranked_docs(model, query, texts, docs)
    scores, _ = model.score(query, texts)
    best = docs[int(np.argmax(scores))]
    assert ranked[0] == best == "vitd"
    assert sorted(ranked) == ["budget", "rain", "vitd"]


def test_the_default_is_the_model_as_the_service_serves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGMESH_RERANKER_MAX_TOKENS", "128")
    monkeypatch.setenv("RAGMESH_RERANKER_PASSAGE_WINDOW", "overlap")
    monkeypatch.setenv("RAGMESH_RERANKER_WINDOW_HEAD_TOKENS", "16")
    served = rerank_workloads.served_spec(MODEL_DIR)
    assert served == rerank_workloads.ModelSpec(MODEL_DIR, 128, "overlap", 16)
    # Served shorter than the quality option: not the same model, so the loss must be measured.
    assert served != rerank_workloads.ModelSpec(MODEL_DIR)
    model = served.load()
    assert (model.max_tokens, model.window, model.window_head_tokens) == (128, "overlap", 16)
    # Served at full length with head windows it is the quality option itself: nothing to measure.
    monkeypatch.setenv("RAGMESH_RERANKER_MAX_TOKENS", "0")
    monkeypatch.setenv("RAGMESH_RERANKER_PASSAGE_WINDOW", "head")
    assert rerank_workloads.served_spec(MODEL_DIR) == rerank_workloads.ModelSpec(MODEL_DIR)


@pytest.mark.parametrize("text", ["160:overlap:32", "160:middle:32:35", "x:head:0:35", "160:head:-1:35"])
def test_a_malformed_variant_is_refused_with_the_expected_form(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape("TOKENS:head|overlap:OPENING:CANDIDATES")):
        rerank_workloads.Variant.parse(text)


def test_a_variant_reads_back_as_written() -> None:
    variant = rerank_workloads.Variant.parse("160:overlap:32:35")
    assert (variant.tokens, variant.window, variant.head, variant.candidates) == (160, "overlap", 32, 35)
    assert str(variant) == "160:overlap:32:35"
    assert variant.spec(MODEL_DIR) == rerank_workloads.ModelSpec(MODEL_DIR, 160, "overlap", 32)


def test_the_in_process_order_follows_the_gateways_rules() -> None:
    results = [
        gateway_pb2.SearchResult(chunk_id=f"c{i}", doc_id=f"d{i}", fused_score=1 / (i + 1)) for i in range(5)
    ]
    # d1 fails the threshold (-5): after those that pass, not dropped; d4 was not reranked.
    order = rerank_inprocess.reranked_order(results, 4, [0.0, -9.0, 3.0, 1.0], weight=0.0)
    assert order == ["d2", "d3", "d0", "d1", "d4"]
    # None passes: the fused order stands.
    assert rerank_inprocess.reranked_order(results, 4, [-9.0] * 4, weight=0.5) == [f"d{i}" for i in range(5)]
    # A heavy fused weight brings the fused order back among those that pass.
    heavy = rerank_inprocess.reranked_order(results, 4, [0.0, -9.0, 3.0, 1.0], weight=100.0)
    assert heavy[:3] == ["d0", "d2", "d3"]
