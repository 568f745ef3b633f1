"""Reranking in the gateway against the fake reranker (see conftest): the reranker's order, the
candidates it is sent, the blend with the fused order, and every way it can fail while the search
still answers in fused order."""

from __future__ import annotations

import time
from typing import Any

import pytest

from meshkit.settings import GatewaySettings
from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.planner.v1 import planner_pb2
from services.gateway.rerank import candidate_count

from .conftest import COLLECTION, NAME_OF, RERANK_MIN_SCORE, RERANK_SCORES, Gateway, running_gateway

QUERY = "what is a zx-81"
# The fused order of the default request (see test_search), and the fake reranker's order of it:
# best score first, then c2 (-6.0, under the -5.0 threshold) in its fused place among the failures.
FUSED = ["c0", "c2", "c4", "c1", "c3"]
RERANKED = ["c3", "c1", "c4", "c0", "c2"]
FUSED_RANK = {name: rank for rank, name in enumerate(FUSED, 1)}


async def search(gateway: Gateway, timeout: float = 10.0, **fields: Any) -> pb.SearchResponse:
    request = pb.SearchRequest(**{"collection": COLLECTION, "query": QUERY, **fields})
    return await gateway.stub.Search(request, timeout=timeout)


def names(response: pb.SearchResponse) -> list[str]:
    return [NAME_OF[r.chunk_id] for r in response.results]


def rerank_scores(response: pb.SearchResponse) -> dict[str, float | None]:
    return {
        NAME_OF[r.chunk_id]: r.rerank_score if r.HasField("rerank_score") else None for r in response.results
    }


def degradations(response: pb.SearchResponse) -> list[tuple[int, int, list[int]]]:
    return [(d.stage, d.reason, list(d.legs)) for d in response.degradations]


def timing_stages(response: pb.SearchResponse) -> set[str]:
    return {t.stage for t in response.timings}


def assert_fused_order_unscored(response: pb.SearchResponse, expected: list[str] = FUSED) -> None:
    assert names(response) == expected
    assert rerank_scores(response) == dict.fromkeys(expected)
    assert [r.fused_rank for r in response.results] == [FUSED_RANK[n] for n in expected]
    assert not response.reranked


async def test_rerank_orders_by_the_reranker_and_demotes_what_fails_the_threshold(gateway: Gateway) -> None:
    fused = await search(gateway, rerank=False)
    assert_fused_order_unscored(fused)
    assert gateway.fakes.calls["reranker"] == 0 and "rerank" not in timing_stages(fused)

    response = await search(gateway, rerank=True)
    assert names(response) == RERANKED
    assert rerank_scores(response) == {n: RERANK_SCORES[n] if n != "c2" else None for n in RERANKED}
    assert [r.fused_rank for r in response.results] == [5, 4, 3, 1, 2]
    fused_score = {NAME_OF[r.chunk_id]: r.fused_score for r in fused.results}
    assert {NAME_OF[r.chunk_id]: r.fused_score for r in response.results} == {
        n: fused_score[n] for n in RERANKED
    }
    assert response.reranked
    assert not response.degradations
    assert "rerank" in timing_stages(response)
    assert response.results[0].text == "text of c3" and response.results[0].title == "Title of c3"
    assert not response.fused_hits  # only with include_leg_results

    assert gateway.fakes.calls["reranker"] == 1
    sent = gateway.fakes.requests["reranker"][0]
    assert sent.query == QUERY
    assert [NAME_OF[p.id] for p in sent.passages] == FUSED
    assert [p.text for p in sent.passages] == [f"text of {n}" for n in FUSED]


async def test_rerank_candidates_bounds_what_is_sent_and_the_rest_follow_in_fused_order(
    gateway: Gateway,
) -> None:
    response = await search(gateway, rerank=True, rerank_candidates=2)
    assert [NAME_OF[p.id] for p in gateway.fakes.requests["reranker"][-1].passages] == ["c0", "c2"]
    assert names(response) == ["c0", "c2", "c4", "c1", "c3"]  # c2 fails the threshold
    assert rerank_scores(response) == {"c0": -1.0, "c2": None, "c4": None, "c1": None, "c3": None}
    assert [r.fused_rank for r in response.results] == [1, 2, 3, 4, 5]
    # The reranker's best is the fused first: the fused order stands (keep_fused_margin).
    assert response.reranked

    response = await search(gateway, rerank=True, rerank_candidates=3)
    assert [NAME_OF[p.id] for p in gateway.fakes.requests["reranker"][-1].passages] == ["c0", "c2", "c4"]
    assert names(response) == ["c4", "c0", "c2", "c1", "c3"]
    assert rerank_scores(response) == {"c4": 1.0, "c0": -1.0, "c2": None, "c1": None, "c3": None}


async def test_candidates_beyond_top_k_are_reranked_and_the_answer_is_cut_to_top_k(gateway: Gateway) -> None:
    response = await search(gateway, rerank=True, top_k=2)
    # c3 is last in fused order: only reranking candidates past top_k brings it to the top.
    assert [NAME_OF[p.id] for p in gateway.fakes.requests["reranker"][0].passages] == FUSED
    assert names(response) == ["c3", "c1"]


async def test_fused_hits_are_the_fused_list_before_reranking(gateway: Gateway) -> None:
    fused = await search(gateway, include_leg_results=True)
    assert not fused.fused_hits and fused.leg_results

    response = await search(gateway, rerank=True, include_leg_results=True)
    assert [NAME_OF[h.chunk_id] for h in response.fused_hits] == FUSED
    assert [h.score for h in response.fused_hits] == [r.fused_score for r in fused.results]
    assert [h.doc_id for h in response.fused_hits] == [r.doc_id for r in fused.results]
    assert [lr.leg for lr in response.leg_results] == [lr.leg for lr in fused.leg_results]

    short = await search(gateway, rerank=True, include_leg_results=True, top_k=3)
    assert [NAME_OF[h.chunk_id] for h in short.fused_hits] == FUSED[:3]


async def test_reranker_down_is_one_degradation_then_breaker_open(gateway: Gateway) -> None:
    gateway.fakes.behaviour["reranker"] = "fail"
    settings = gateway.settings
    first = await search(gateway, rerank=True)
    assert_fused_order_unscored(first)
    assert degradations(first) == [(pb.STAGE_RERANKER, pb.DEGRADATION_REASON_UNAVAILABLE, [])]
    assert "reranker" in first.degradations[0].message
    assert first.results[0].text == "text of c0"
    assert "rerank" in timing_stages(first)
    assert gateway.fakes.calls["reranker"] == settings.client_retry_attempts  # idempotent: retried

    # The second search's retries reach breaker_fail_max consecutive failures and trip it.
    second = await search(gateway, rerank=True)
    assert_fused_order_unscored(second)
    assert degradations(second) == [(pb.STAGE_RERANKER, pb.DEGRADATION_REASON_BREAKER_OPEN, [])]
    assert gateway.fakes.calls["reranker"] == settings.breaker_fail_max
    third = await search(gateway, rerank=True)
    assert degradations(third) == [(pb.STAGE_RERANKER, pb.DEGRADATION_REASON_BREAKER_OPEN, [])]
    assert gateway.fakes.calls["reranker"] == settings.breaker_fail_max  # refused without calling


async def test_slow_reranker_is_cut_at_the_deadline_and_the_answer_arrives_in_time(gateway: Gateway) -> None:
    gateway.fakes.behaviour["reranker"] = "slow"
    started = time.monotonic()
    response = await search(gateway, timeout=1.5, rerank=True)
    assert time.monotonic() - started < 1.5
    assert_fused_order_unscored(response)
    assert degradations(response) == [(pb.STAGE_RERANKER, pb.DEGRADATION_REASON_DEADLINE, [])]
    assert response.results[0].text == "text of c0"


async def test_slow_leg_leaves_time_to_rerank(gateway: Gateway) -> None:
    # The legs give way to the rerank share of the budget: the late leg is cut, reranking runs.
    gateway.fakes.behaviour["bm25"] = "slow"
    started = time.monotonic()
    response = await search(gateway, timeout=1.5, rerank=True)
    assert time.monotonic() - started < 1.5
    assert degradations(response) == [(pb.STAGE_SPARSE, pb.DEGRADATION_REASON_DEADLINE, [pb.LEG_BM25])]
    assert response.reranked and names(response) == RERANKED


async def test_nothing_passing_the_threshold_keeps_the_fused_order(gateway: Gateway) -> None:
    gateway.fakes.rerank_scores = dict.fromkeys(RERANK_SCORES, RERANK_MIN_SCORE - 4)
    response = await search(gateway, rerank=True)
    assert names(response) == FUSED
    assert rerank_scores(response) == dict.fromkeys(FUSED, RERANK_MIN_SCORE - 4)
    assert [r.fused_rank for r in response.results] == [1, 2, 3, 4, 5]
    assert not response.reranked
    assert not response.degradations


async def test_fallback_shorter_than_the_candidates_keeps_every_candidate(gateway: Gateway) -> None:
    gateway.fakes.rerank_scores = dict.fromkeys(RERANK_SCORES, RERANK_MIN_SCORE - 4)
    gateway.fakes.rerank_fallback_count = 2
    response = await search(gateway, rerank=True, rerank_candidates=4)
    assert names(response) == FUSED


async def test_fallback_does_not_cut_the_answer_below_top_k(gateway: Gateway) -> None:
    gateway.fakes.rerank_scores = dict.fromkeys(RERANK_SCORES, RERANK_MIN_SCORE - 4)
    gateway.fakes.rerank_fallback_count = 2  # the reranker's own default, smaller than the candidates
    response = await search(gateway, rerank=True)
    assert names(response) == FUSED


async def test_hydration_failure_skips_reranking(gateway: Gateway) -> None:
    gateway.fakes.behaviour["chunks"] = "fail"
    gateway.fakes.behaviour["index-chunks"] = "fail"
    response = await search(gateway, rerank=True)
    assert_fused_order_unscored(response)
    assert not response.results[0].text
    assert [(d.stage, list(d.legs)) for d in response.degradations] == [
        (pb.STAGE_SPARSE, []),
        (pb.STAGE_INDEX, []),
        (pb.STAGE_RERANKER, []),
    ]
    assert response.degradations[0].fallback == pb.FALLBACK_UNSPECIFIED
    assert response.degradations[2].reason == pb.DEGRADATION_REASON_ERROR
    assert "hydration" in response.degradations[2].message
    assert gateway.fakes.calls["reranker"] == 0


@pytest.mark.parametrize("sparse_mode", ["fail", "slow"])
async def test_sparse_down_or_late_hydrates_from_the_index_payload(
    gateway: Gateway, sparse_mode: str
) -> None:
    gateway.fakes.behaviour["chunks"] = sparse_mode
    # A 6 s deadline gives sparse half of what is left (under 3 s) against its 5 s sleep: late
    # by seconds, not by the few milliseconds a 10 s deadline left on a loaded machine.
    response = await search(gateway, timeout=6.0, rerank=True)
    assert response.reranked
    assert response.results and all(r.text.startswith("payload of ") for r in response.results)
    first = response.results[0]
    assert first.title == f"Title of {NAME_OF[first.chunk_id]}"
    assert first.source_uri == f"file:///{first.doc_id}"
    assert set(first.metadata) == {"shard"}
    assert [(d.stage, d.fallback) for d in response.degradations] == [
        (pb.STAGE_SPARSE, pb.FALLBACK_INDEX_PAYLOAD)
    ]
    assert gateway.fakes.calls["reranker"] == 1


async def test_reply_naming_an_unknown_passage_is_an_error_and_leaves_no_scores(gateway: Gateway) -> None:
    gateway.fakes.behaviour["reranker"] = "unknown_id"
    response = await search(gateway, rerank=True)
    assert_fused_order_unscored(response)
    assert degradations(response) == [(pb.STAGE_RERANKER, pb.DEGRADATION_REASON_ERROR, [])]
    assert "not-a-candidate" in response.degradations[0].message


async def test_without_a_reranker_tier_rerank_requests_answer_in_fused_order() -> None:
    async with running_gateway(reranker_address="", gateway_rerank=True) as gateway:
        response = await search(gateway, include_leg_results=True)
        explicit = await search(gateway, rerank=True)
    for answer in (response, explicit):
        assert_fused_order_unscored(answer)
        assert not answer.degradations
        assert "rerank" not in timing_stages(answer)
    assert not response.fused_hits
    assert gateway.fakes.calls["reranker"] == 0


async def test_fused_weight_blends_the_reranker_order_with_the_fused_order() -> None:
    weight, k = 1.0, 20
    # gateway_rerank on: requests that leave rerank unset are reranked.
    async with running_gateway(gateway_rerank=True, gateway_rerank_fused_weight=weight) as gateway:
        fused = await search(gateway, rerank=False, rrf_k=k)
        response = await search(gateway, rrf_k=k)
    fused_rank = {name: rank for rank, name in enumerate(names(fused), 1)}

    def blended(name: str) -> float:
        return 1 / (k + RERANKED.index(name) + 1) + weight / (k + fused_rank[name])

    passing = [n for n in RERANKED if n != "c2"]
    # Those under the threshold (c2) do not take part in the blend: they follow it.
    expected = [*sorted(passing, key=lambda n: (-blended(n), passing.index(n))), "c2"]
    # c0, first in fused order, climbs back over the reranker's top three; neither order alone.
    assert expected == ["c0", "c3", "c1", "c4", "c2"]
    assert names(response) == expected
    assert response.reranked
    assert rerank_scores(response) == {n: RERANK_SCORES[n] if n != "c2" else None for n in expected}
    assert [r.fused_rank for r in response.results] == [fused_rank[n] for n in expected]


def test_candidate_count_is_the_request_else_the_strategy_default() -> None:
    settings = GatewaySettings()
    assert candidate_count(settings, 7, planner_pb2.STRATEGY_EXHAUSTIVE) == 7
    assert candidate_count(settings, 0, planner_pb2.STRATEGY_PRECISE) == 35
    assert candidate_count(settings, 0, planner_pb2.STRATEGY_EXHAUSTIVE) == 60
    assert candidate_count(settings, 0, planner_pb2.STRATEGY_UNSPECIFIED) == 35
    tuned = GatewaySettings(gateway_rerank_candidates_precise=12, gateway_rerank_candidates_exhaustive=24)
    assert candidate_count(tuned, 0, planner_pb2.STRATEGY_PRECISE) == 12
    assert candidate_count(tuned, 0, planner_pb2.STRATEGY_EXHAUSTIVE) == 24


@pytest.mark.parametrize(("first_score", "kept"), [(2.5, True), (2.0, True), (1.9, False)])
async def test_the_fused_order_stands_when_the_reranker_finds_its_first_close_to_its_best(
    first_score: float, kept: bool
) -> None:
    # c3 is the reranker's best (3.0); c0, fused first, within a margin of 1 of it or not.
    async with running_gateway(gateway_rerank=True, gateway_rerank_keep_fused_margin=1.0) as gateway:
        gateway.fakes.rerank_scores["c0"] = first_score
        response = await search(gateway)
    assert not response.degradations
    # Judged either way: the fused order standing is the reranker's decision, not a failure.
    assert response.reranked
    assert names(response) == (FUSED if kept else ["c3", "c1", "c0", "c4", "c2"])
    # Kept or not, every candidate that passed carries its score (Ask's evidence gate reads them).
    expected_scores = {**RERANK_SCORES, "c0": first_score, "c2": None}
    assert rerank_scores(response) == pytest.approx({n: expected_scores[n] for n in names(response)})


async def test_a_margin_of_zero_always_takes_the_rerankers_order() -> None:
    async with running_gateway(gateway_rerank=True, gateway_rerank_keep_fused_margin=0.0) as gateway:
        gateway.fakes.rerank_scores["c0"] = 2.9  # a near tie with the best (c3, 3.0)
        response = await search(gateway)
    assert response.reranked and names(response)[:2] == ["c3", "c0"]


async def test_a_request_sets_its_own_margin() -> None:
    async with running_gateway(gateway_rerank=True, gateway_rerank_keep_fused_margin=1.0) as gateway:
        gateway.fakes.rerank_scores["c0"] = 2.9
        kept = await search(gateway)
        reordered = await search(gateway, keep_fused_margin=0.0)
    assert names(kept) == FUSED
    assert names(reordered)[:2] == ["c3", "c0"]
