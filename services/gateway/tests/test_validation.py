from __future__ import annotations

import math
from typing import Any

import grpc
import pytest

from meshkit.core.errors import ServiceError
from meshkit.settings import GatewaySettings
from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.planner.v1 import planner_pb2
from services.gateway.validation import validate_search

SETTINGS = GatewaySettings(
    gateway_max_query_chars=50,
    gateway_max_top_k=20,
    gateway_max_variations=4,
    gateway_max_pool_size=100,
    gateway_max_doc_ids=2,
    gateway_weight_exact=0.3,
    gateway_max_rerank_candidates=50,
)


def request(**fields: Any) -> pb.SearchRequest:
    return pb.SearchRequest(**{"collection": "docs", "query": "what is rrf", **fields})


def test_defaults_are_resolved() -> None:
    params = validate_search(request(), SETTINGS)
    assert params.top_k == 10
    assert params.rrf_k == SETTINGS.gateway_rrf_k
    assert params.weights == {
        "dense": SETTINGS.gateway_weight_dense,
        "bm25": SETTINGS.gateway_weight_bm25,
        "exact": pytest.approx(SETTINGS.gateway_weight_exact),
    }
    assert params.pool_size == 0 and params.max_variations == 0
    assert params.rerank is SETTINGS.gateway_rerank and params.rerank_candidates == 0


@pytest.mark.parametrize("default", [True, False])
def test_rerank_is_the_request_when_set_else_the_server_default(default: bool) -> None:
    settings = SETTINGS.model_copy(update={"gateway_rerank": default})
    assert validate_search(request(), settings).rerank is default
    assert validate_search(request(rerank=not default), settings).rerank is not default
    assert validate_search(request(rerank=default), settings).rerank is default


def test_rerank_candidates_up_to_the_limit() -> None:
    assert validate_search(request(rerank_candidates=50), SETTINGS).rerank_candidates == 50
    assert validate_search(request(rerank_candidates=7), SETTINGS).rerank_candidates == 7


def test_request_overrides_and_zero_weight_disables() -> None:
    params = validate_search(
        request(
            top_k=20,
            rrf_k=5,
            weights=pb.LegWeights(bm25=0.0, exact=2.0),
            doc_ids=["a.md", "a.md"],
            strategy=planner_pb2.STRATEGY_EXHAUSTIVE,
        ),
        SETTINGS,
    )
    assert params.rrf_k == 5 and params.top_k == 20
    assert params.weights == {"dense": 1.0, "bm25": 0.0, "exact": 2.0}
    assert not params.enabled("bm25")
    assert params.doc_ids == ["a.md"]


def test_the_keep_fused_margin_is_the_servers_unless_the_request_sets_one() -> None:
    assert (
        validate_search(request(), SETTINGS).keep_fused_margin
        == SETTINGS.calibration.rerank_keep_fused_margin
    )
    assert validate_search(request(keep_fused_margin=0.0), SETTINGS).keep_fused_margin == 0.0
    assert validate_search(request(keep_fused_margin=2.5), SETTINGS).keep_fused_margin == 2.5


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"collection": ""}, "collection is required"),
        ({"collection": "Bad Name"}, "collection"),
        ({"query": "   "}, "query is empty"),
        ({"query": "x" * 51}, "query length"),
        ({"top_k": 21}, "top_k"),
        ({"max_variations": 5}, "max_variations"),
        ({"pool_size": 101}, "pool_size"),
        ({"doc_ids": ["a", "b", "c"]}, "doc_ids"),
        ({"doc_ids": ["../etc"]}, "doc_ids[0]"),
        ({"weights": pb.LegWeights(dense=-1.0)}, "weights.dense"),
        ({"weights": pb.LegWeights(bm25=math.nan)}, "weights.bm25"),
        ({"weights": pb.LegWeights(exact=math.inf)}, "weights.exact"),
        ({"weights": pb.LegWeights(dense=0, bm25=0, exact=0)}, "every leg weight is 0"),
        ({"rrf_k": 0}, "rrf_k"),
        ({"strategy": 7}, "strategy"),
        ({"rerank_candidates": 51}, "rerank_candidates"),
        ({"keep_fused_margin": -0.5}, "keep_fused_margin"),
        ({"keep_fused_margin": 101.0}, "keep_fused_margin"),
        ({"keep_fused_margin": math.nan}, "keep_fused_margin"),
    ],
)
def test_invalid_requests_are_invalid_argument(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ServiceError) as caught:
        validate_search(request(**fields), SETTINGS)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in caught.value.message


def test_a_paragraph_long_query_passes_and_a_bounded_limit_still_holds() -> None:
    """The default limit (16,000 characters) takes a paragraph or a page; past it the query is
    refused with the limit in the message, before any downstream sees it."""
    defaults = GatewaySettings()
    assert defaults.gateway_max_query_chars == 16_000
    paragraph = ("How do retrieval systems rank documents for a long query? " * 100)[:5000]
    assert validate_search(request(query=paragraph), defaults).query == paragraph
    with pytest.raises(ServiceError) as caught:
        validate_search(request(query="x" * 20_000), defaults)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.message == "the query length in characters is 20000, the limit is 16000"


def test_every_leg_takes_the_longest_query_the_gateway_accepts() -> None:
    from meshkit.settings import EmbedderSettings, PlannerSettings, RerankerSettings, SparseSettings

    limit = GatewaySettings().gateway_max_query_chars
    assert PlannerSettings().planner_max_query_chars >= limit
    assert RerankerSettings().reranker_max_query_chars >= limit
    assert SparseSettings().sparse_max_query_chars >= limit
    assert EmbedderSettings().embedder_max_text_chars >= limit
