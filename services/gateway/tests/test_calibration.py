"""A collection's calibration applied to a search (services/gateway/calibration.py): it fills in
only what the request left unset, and only for the embedder it was measured with."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from meshkit.domain.calibration import Calibration
from meshkit.domain.collections import CollectionRecord, EmbedderIdentity
from meshkit.settings import GatewaySettings
from ragmesh.gateway.v1 import gateway_pb2 as pb
from services.gateway.calibration import calibrated
from services.gateway.fusion import Fused
from services.gateway.rerank import final_order
from services.gateway.validation import SearchParams, validate_ask, validate_search

SETTINGS = GatewaySettings(gateway_rerank=True)
EMBEDDER = EmbedderIdentity("m", 4, "a" * 64)
CALIBRATION = Calibration(
    rerank=False,
    weights={"dense": 1.0, "bm25": 0.25, "exact": 0.0},
    keep_fused_margin=3.0,
    embedder_sha256=EMBEDDER.sha256,
)


def resolved(
    calibration: Calibration | None = CALIBRATION, embedder: EmbedderIdentity = EMBEDDER, **fields: Any
) -> SearchParams:
    params = validate_search(pb.SearchRequest(collection="c", query="q", **fields), SETTINGS)
    record = CollectionRecord(collection="c", embedder=embedder, calibration=calibration)
    return calibrated(replace(params, record=record))


def test_a_search_that_leaves_the_choices_unset_takes_the_collections_calibration() -> None:
    params = resolved()
    assert params.rerank is False
    assert params.weights == {"dense": 1.0, "bm25": 0.25, "exact": 0.0}
    assert params.keep_fused_margin == 3.0


def test_what_the_request_sets_stands() -> None:
    params = resolved(rerank=True, keep_fused_margin=0.5, weights=pb.LegWeights(bm25=2.0))
    assert params.rerank is True and params.keep_fused_margin == 0.5
    assert params.weights == {"dense": 1.0, "bm25": 2.0, "exact": 0.0}


def test_an_ask_on_a_collection_calibrated_off_keeps_the_fused_order_with_scores_for_its_gate() -> None:
    search, _, _ = validate_ask(pb.AskRequest(collection="c", query="q"), SETTINGS)
    record = CollectionRecord(collection="c", embedder=EMBEDDER, calibration=CALIBRATION)
    params = calibrated(replace(search, record=record))
    assert params.rerank is True and params.keep_fused_margin == math.inf
    search, _, _ = validate_ask(pb.AskRequest(collection="c", query="q", rerank=True), SETTINGS)
    params = calibrated(replace(search, record=record))
    assert params.rerank is True and params.keep_fused_margin == CALIBRATION.keep_fused_margin
    # The caller turned reranking off: no scores, no gate, as without a calibration.
    search, _, _ = validate_ask(pb.AskRequest(collection="c", query="q", rerank=False), SETTINGS)
    assert calibrated(replace(search, record=record)).rerank is False


def test_an_infinite_margin_keeps_the_fused_order() -> None:
    # The reranker's best is the fused last, far ahead of the fused first.
    candidates = [
        Fused(chunk_id=f"c{i}", doc_id=f"d{i}", score=1.0 / (i + 1), rerank_score=score)
        for i, score in enumerate((-30.0, 1.0, 50.0))
    ]
    order = final_order(
        candidates, candidates[::-1], False, fused_weight=0.0, rrf_k=60, keep_fused_margin=math.inf
    )
    assert [item.chunk_id for item in order.results] == ["c0", "c1", "c2"] and order.reranked


def test_no_calibration_or_one_of_another_embedder_leaves_the_server_defaults() -> None:
    defaults = validate_search(pb.SearchRequest(collection="c", query="q"), SETTINGS)
    for params in (resolved(None), resolved(embedder=EmbedderIdentity("other", 4, "b" * 64))):
        assert (params.rerank, params.weights, params.keep_fused_margin) == (
            defaults.rerank,
            defaults.weights,
            defaults.keep_fused_margin,
        )
    assert calibrated(defaults) == defaults  # no record at all


def test_a_calibration_never_turns_every_leg_off() -> None:
    # The request turned dense off; the calibration turns bm25 and exact off: the request's
    # weights stand rather than a search with no leg.
    params = resolved(
        weights=pb.LegWeights(dense=0.0),
        calibration=replace(CALIBRATION, weights={"dense": 1.0, "bm25": 0.0, "exact": 0.0}),
    )
    assert any(params.weights.values())
    assert params.weights["dense"] == 0.0


def test_uncalibrated_weights_leave_the_requests_and_the_defaults() -> None:
    uncalibrated = replace(CALIBRATION, weights={"dense": 0.0, "bm25": 0.0, "exact": 0.0})
    defaults = validate_search(pb.SearchRequest(collection="c", query="q"), SETTINGS)
    params = resolved(calibration=uncalibrated)
    assert params.weights == defaults.weights and params.rerank is False
    params = resolved(calibration=uncalibrated, weights=pb.LegWeights(dense=2.0))
    assert params.weights == {**defaults.weights, "dense": 2.0}
