"""``bench/rerank_variants.py``: the question sets it reads and the score cache that lets a rerun
(or another blend weight or margin) cost no model time."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import rerank_variants
from bench.qa import GRPC_DOCS_FILE, read
from bench.rerank_workloads import Variant
from meshkit.settings import RerankerSettings
from ragmesh.gateway.v1 import gateway_pb2

SCIFACT = Path(__file__).resolve().parents[1] / ".." / "shared" / "bench" / "scifact"


def test_a_question_set_keeps_its_answerable_questions_with_their_gold_pages() -> None:
    group = rerank_variants.load_set(f"qa:{GRPC_DOCS_FILE}:tune", SCIFACT)
    expected = [i for i in read(GRPC_DOCS_FILE) if i.split == "tune" and i.answerable]
    assert sorted(group.queries) == sorted(i.id for i in expected) and expected
    first = expected[0]
    assert group.qrels[first.id] == dict.fromkeys(first.gold_doc_ids, 1)


@pytest.mark.skipif(not SCIFACT.is_dir(), reason=f"no SciFact at {SCIFACT}")
def test_the_scifact_validation_set_is_the_claims_the_model_build_held_out() -> None:
    group = rerank_variants.load_set("scifact:val", SCIFACT)
    # 15% of the train claims with a positive, as in the build (seed 13).
    assert len(group.queries) == 121
    assert all(any(rel > 0 for rel in group.qrels[q].values()) for q in group.queries)


def test_an_unknown_set_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="unknown set"):
        rerank_variants.load_set("beir:nfcorpus", SCIFACT)


def test_scores_are_cached_by_model_setting_and_candidates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = argparse.Namespace(model_dir=RerankerSettings().reranker_model_dir, cache=tmp_path)
    group = rerank_variants.QuerySet("t", {"q1": "vitamin D and fractures"}, {"q1": {"d1": 1}})
    candidates = {
        "q1": [
            gateway_pb2.SearchResult(chunk_id="c1", doc_id="d1", text="Vitamin D lowered fracture rates."),
            gateway_pb2.SearchResult(chunk_id="c2", doc_id="d2", text="The budget was approved."),
        ]
    }
    variant = Variant.parse("160:overlap:32:2")
    first = rerank_variants.score_variant(args, variant, group, candidates)
    assert not first.cached and len(first.scores["q1"]) == 2
    assert first.scores["q1"][0] > first.scores["q1"][1]

    def no_model(*_: object, **__: object) -> None:
        raise AssertionError("the model ran again")

    monkeypatch.setattr(rerank_variants, "rerank_scores", no_model)
    again = rerank_variants.score_variant(args, variant, group, candidates)
    assert again.cached and again.scores == first.scores
    # Another setting is another entry: it must be scored.
    with pytest.raises(AssertionError, match="ran again"):
        rerank_variants.score_variant(args, Variant.parse("128:overlap:32:2"), group, candidates)
