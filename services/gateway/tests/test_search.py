"""The gateway against fake downstreams on real gRPC servers: fusion end to end, and every
failure path (failing leg, slow leg cut at the deadline, open breaker, nothing left)."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from grpc import aio

from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2
from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.planner.v1 import planner_pb2

from .conftest import CHUNK_ID, COLLECTION, NAME_OF, Gateway

DENSE, BM25, EXACT = pb.LEG_DENSE, pb.LEG_BM25, pb.LEG_EXACT


async def search(gateway: Gateway, timeout: float = 10.0, **fields: Any) -> pb.SearchResponse:
    request = pb.SearchRequest(**{"collection": COLLECTION, "query": "what is a zx-81", **fields})
    return await gateway.stub.Search(request, timeout=timeout)


def names(response: pb.SearchResponse) -> list[str]:
    return [NAME_OF[r.chunk_id] for r in response.results]


def ranks(result: pb.SearchResult) -> dict[int, int]:
    return {r.leg: r.rank for r in result.leg_ranks}


def degradations(response: pb.SearchResponse) -> list[tuple[int, int, list[int]]]:
    return [(d.stage, d.reason, list(d.legs)) for d in response.degradations]


async def test_whole_search_fuses_every_leg_and_hydrates(gateway: Gateway) -> None:
    response = await search(gateway, include_leg_results=True, pool_size=30, doc_ids=["alpha.md", "delta.md"])
    # dense c0 c1 c2 c3, bm25 c2 c0 c4, exact c4 (weight 0.3): see conftest for the lists.
    assert names(response) == ["c0", "c2", "c4", "c1", "c3"]
    assert not response.degradations
    top = response.results[0]
    assert ranks(top) == {DENSE: 1, BM25: 2}
    assert [r.leg for r in top.leg_ranks] == [DENSE, BM25]
    assert top.leg_ranks[0].score == pytest.approx(0.9)
    assert top.fused_score == pytest.approx(1 / 61 + 1 / 62)
    assert ranks(response.results[2]) == {BM25: 3, EXACT: 1}
    assert (top.doc_id, top.title, top.text) == ("alpha.md", "Title of c0", "text of c0")
    assert list(top.location.heading_path) == ["H"]
    assert response.plan.planner == "deterministic" and list(response.plan.hard_keywords) == ["ZX-81"]
    assert {t.stage for t in response.timings} == {
        "planner", "embed", "dense", "bm25", "exact", "fuse", "hydrate", "total",
    }  # fmt: skip
    assert [lr.leg for lr in response.leg_results] == [DENSE, BM25, EXACT]
    assert [NAME_OF[h.chunk_id] for h in response.leg_results[0].hits] == ["c0", "c1", "c2", "c3"]

    fakes = gateway.fakes
    # The question as asked is embedded while the planner plans; then only the plan's variation.
    embeds = fakes.requests["embedder"]
    assert all(embed.kind == embedder_pb2.TEXT_KIND_QUERY for embed in embeds)
    assert [list(embed.texts) for embed in embeds] == [["what is a zx-81"], ["what is a zx-81 rephrased"]]
    assert fakes.calls["index-0"] == fakes.calls["index-1"] == 2  # one per shard and variation
    for key in ("index-0", "index-1", "bm25", "exact"):
        leg_request = fakes.requests[key][0]
        assert leg_request.top_k == 30 and list(leg_request.doc_ids) == ["alpha.md", "delta.md"]
    assert list(fakes.requests["exact"][0].keywords) == ["ZX-81"]
    assert fakes.calls["chunks"] == 1


async def test_collapse_weights_and_top_k(gateway: Gateway) -> None:
    collapsed = await search(gateway, collapse_documents=True)
    assert names(collapsed) == ["c0", "c4", "c1", "c3"]  # c2 shares alpha.md with c0
    dense_only = await search(gateway, weights=pb.LegWeights(bm25=0, exact=0), top_k=2, rrf_k=1)
    assert names(dense_only) == ["c0", "c1"]
    assert dense_only.results[0].fused_score == pytest.approx(1 / 2)
    assert gateway.fakes.calls["bm25"] == 1  # only the first search ran the disabled legs
    exact_heavy = await search(gateway, weights=pb.LegWeights(exact=10))
    assert names(exact_heavy)[0] == "c4"


async def test_sparse_down_is_one_degradation_and_then_breaker_open(gateway: Gateway) -> None:
    for key in ("bm25", "exact", "chunks"):
        gateway.fakes.behaviour[key] = "fail"
    first = await search(gateway)
    assert names(first) == ["c0", "c1", "c2", "c3"]
    # The passages come from the index shards' stored payload instead.
    assert all(r.text.startswith("payload of ") for r in first.results)
    assert len(first.degradations) == 1
    assert first.degradations[0].fallback == pb.FALLBACK_INDEX_PAYLOAD
    stage, reason, legs = degradations(first)[0]
    assert stage == pb.STAGE_SPARSE and sorted(legs) == [BM25, EXACT]
    assert reason in (pb.DEGRADATION_REASON_UNAVAILABLE, pb.DEGRADATION_REASON_BREAKER_OPEN)
    calls = gateway.fakes.calls["bm25"]
    second = await search(gateway)
    assert degradations(second) == [(pb.STAGE_SPARSE, pb.DEGRADATION_REASON_BREAKER_OPEN, [BM25, EXACT])]
    assert gateway.fakes.calls["bm25"] == calls  # the open breaker refused without calling


async def test_one_shard_down_dense_answers_from_the_others(gateway: Gateway) -> None:
    gateway.fakes.behaviour["index-1"] = "fail"
    response = await search(gateway)
    assert degradations(response) == [(pb.STAGE_INDEX, pb.DEGRADATION_REASON_UNAVAILABLE, [DENSE])]
    assert "index-1" in response.degradations[0].message
    dense = [NAME_OF[r.chunk_id] for r in response.results if DENSE in ranks(r)]
    assert dense == ["c0", "c2"]


async def test_embedder_down_skips_dense(gateway: Gateway) -> None:
    gateway.fakes.behaviour["embedder"] = "fail"
    response = await search(gateway)
    assert degradations(response) == [(pb.STAGE_EMBEDDER, pb.DEGRADATION_REASON_UNAVAILABLE, [DENSE])]
    assert names(response) == ["c4", "c2", "c0"]  # c4: bm25 3rd + exact 1st
    assert gateway.fakes.calls["index-0"] == 0


async def test_planner_down_falls_back_to_the_query_alone(gateway: Gateway) -> None:
    gateway.fakes.behaviour["planner"] = "fail"
    response = await search(gateway, strategy=planner_pb2.STRATEGY_EXHAUSTIVE)
    assert degradations(response) == [(pb.STAGE_PLANNER, pb.DEGRADATION_REASON_UNAVAILABLE, [EXACT])]
    assert response.plan.planner == "fallback" and response.plan.pool_size == 80
    assert list(response.plan.variations) == ["what is a zx-81"]
    assert gateway.fakes.calls["exact"] == 0
    assert names(response) == ["c0", "c2", "c1", "c4", "c3"]


async def test_slow_leg_is_cut_at_the_deadline_and_the_answer_arrives_in_time(gateway: Gateway) -> None:
    gateway.fakes.behaviour["bm25"] = "slow"
    started = time.monotonic()
    response = await search(gateway, timeout=1.0)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0
    assert degradations(response) == [(pb.STAGE_SPARSE, pb.DEGRADATION_REASON_DEADLINE, [BM25])]
    assert names(response) == ["c0", "c1", "c2", "c3", "c4"]  # dense, then exact's c4
    assert response.results[0].text == "text of c0"


async def test_slow_shard_costs_only_its_own_hits(gateway: Gateway) -> None:
    gateway.fakes.behaviour["index-1"] = "slow"
    started = time.monotonic()
    response = await search(gateway, timeout=0.8)
    assert time.monotonic() - started < 0.8
    assert degradations(response) == [(pb.STAGE_INDEX, pb.DEGRADATION_REASON_DEADLINE, [DENSE])]
    assert "index-1" in response.degradations[0].message
    assert [NAME_OF[r.chunk_id] for r in response.results if DENSE in ranks(r)] == ["c0", "c2"]


async def test_every_leg_failing_is_unavailable(gateway: Gateway) -> None:
    for key in ("embedder", "bm25", "exact"):
        gateway.fakes.behaviour[key] = "fail"
    with pytest.raises(aio.AioRpcError) as caught:
        await search(gateway)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "embedder" in (caught.value.details() or "") and "sparse" in (caught.value.details() or "")


async def test_every_leg_slow_is_deadline_exceeded_in_time(gateway: Gateway) -> None:
    for key in ("index-0", "index-1", "bm25", "exact"):
        gateway.fakes.behaviour[key] = "slow"
    started = time.monotonic()
    with pytest.raises(aio.AioRpcError) as caught:
        await search(gateway, timeout=0.6)
    assert time.monotonic() - started < 0.7
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_hydration_failure_returns_bare_results(gateway: Gateway) -> None:
    gateway.fakes.behaviour["chunks"] = "fail"
    gateway.fakes.behaviour["index-chunks"] = "fail"
    response = await search(gateway)
    assert names(response) == ["c0", "c2", "c4", "c1", "c3"]
    assert [(d.stage, list(d.legs)) for d in response.degradations] == [
        (pb.STAGE_SPARSE, []),
        (pb.STAGE_INDEX, []),
    ]
    assert "passage text" in response.degradations[0].message and not response.results[0].text
    assert response.degradations[0].fallback == pb.FALLBACK_UNSPECIFIED


async def test_legs_send_their_first_hits_text_and_nothing_is_hydrated_after(gateway: Gateway) -> None:
    gateway.fakes.leg_texts = True
    response = await search(gateway, top_k=4, rerank=True, rerank_candidates=5)
    fakes = gateway.fakes
    # Each leg was asked for the text of as many hits as are shown or reranked.
    assert fakes.requests["bm25"][0].with_text == 5
    assert {r.with_payloads for key in ("index-0", "index-1") for r in fakes.requests[key]} == {5}
    assert fakes.calls["chunks"] == fakes.calls["index-chunks"] == 0
    texts = {NAME_OF[r.chunk_id]: r.text for r in response.results}
    # Sparse's text where BM25 found the chunk; the index payload for dense-only chunks.
    assert texts["c0"] == "text of c0" and texts["c1"] == "payload of c1"
    # The reranker read those texts: it was sent every candidate.
    assert len(fakes.requests["reranker"][0].passages) == 5


async def test_only_results_the_legs_sent_no_text_for_are_hydrated(gateway: Gateway) -> None:
    gateway.fakes.leg_texts = True
    # BM25 off, exact first: c4 comes from the exact leg, which sends no text.
    response = await search(gateway, top_k=3, rerank=False, weights=pb.LegWeights(bm25=0, exact=10))
    assert names(response) == ["c4", "c0", "c1"]
    assert [list(r.chunk_ids) for r in gateway.fakes.requests["chunks"]] == [[CHUNK_ID["c4"]]]
    assert [r.text for r in response.results] == ["text of c4", "payload of c0", "payload of c1"]
    assert not response.degradations


async def test_sparse_down_texts_come_from_the_dense_legs_payloads_and_say_so(gateway: Gateway) -> None:
    gateway.fakes.leg_texts = True
    gateway.fakes.behaviour["bm25"] = gateway.fakes.behaviour["exact"] = "fail"
    response = await search(gateway, top_k=4, rerank=False)
    assert names(response) == ["c0", "c1", "c2", "c3"]
    assert [r.text for r in response.results] == [f"payload of c{i}" for i in range(4)]
    # No hydration call at all, and the sparse degradation names where the text came from.
    assert gateway.fakes.calls["chunks"] == gateway.fakes.calls["index-chunks"] == 0
    (degraded,) = response.degradations
    assert degraded.stage == pb.STAGE_SPARSE and degraded.fallback == pb.FALLBACK_INDEX_PAYLOAD


async def test_unknown_collection_is_not_found(gateway: Gateway) -> None:
    for key in ("index-0", "index-1", "bm25", "exact"):
        gateway.fakes.behaviour[key] = "missing"
    with pytest.raises(aio.AioRpcError) as caught:
        await search(gateway)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_shard_without_the_collection_is_not_a_degradation(gateway: Gateway) -> None:
    gateway.fakes.behaviour["index-1"] = "missing"
    response = await search(gateway)
    assert not response.degradations
    assert CHUNK_ID["c1"] not in {r.chunk_id for r in response.results}


async def test_invalid_request_is_rejected_before_any_downstream(gateway: Gateway) -> None:
    with pytest.raises(aio.AioRpcError) as caught:
        await search(gateway, top_k=10_000)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not gateway.fakes.calls


async def test_slow_sparse_also_cuts_hydration_and_still_answers_in_time(gateway: Gateway) -> None:
    for key in ("bm25", "exact", "chunks"):
        gateway.fakes.behaviour[key] = "slow"
    started = time.monotonic()
    response = await search(gateway, timeout=1.0)
    assert time.monotonic() - started < 1.0
    assert degradations(response) == [(pb.STAGE_SPARSE, pb.DEGRADATION_REASON_DEADLINE, [BM25, EXACT])]
    assert "passage text from the index" in response.degradations[0].message
    assert response.degradations[0].fallback == pb.FALLBACK_INDEX_PAYLOAD
    assert names(response) == ["c0", "c1", "c2", "c3"] and response.results[0].text == "payload of c0"


async def test_a_metadata_filter_reaches_every_leg_and_a_bad_one_is_invalid(gateway: Gateway) -> None:
    wanted = common_pb2.MetadataFilter(
        clauses=[
            common_pb2.MetadataClause(key="team", op=common_pb2.FILTER_OP_IN, values=["docs", "infra"]),
            common_pb2.MetadataClause(key="draft", op=common_pb2.FILTER_OP_EXISTS),
        ]
    )
    await search(gateway, filter=wanted)
    for key in ("index-0", "index-1", "bm25", "exact"):
        assert gateway.fakes.requests[key][-1].filter == wanted, key
    calls = sum(gateway.fakes.calls.values())
    bad = common_pb2.MetadataFilter(
        clauses=[common_pb2.MetadataClause(key="team", op=common_pb2.FILTER_OP_EQ)]
    )
    with pytest.raises(aio.AioRpcError) as caught:
        await search(gateway, filter=bad)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "filter.clauses[0]: eq takes exactly one value" in (caught.value.details() or "")
    assert sum(gateway.fakes.calls.values()) == calls  # refused before any downstream


async def test_ask_searches_with_its_metadata_filter(gateway: Gateway) -> None:
    wanted = common_pb2.MetadataFilter(
        clauses=[common_pb2.MetadataClause(key="team", op=common_pb2.FILTER_OP_NE, values=["legal"])]
    )
    await gateway.stub.Ask(pb.AskRequest(collection=COLLECTION, query="why?", filter=wanted), timeout=10)
    for key in ("index-0", "bm25"):
        assert gateway.fakes.requests[key][-1].filter == wanted, key


async def test_a_paragraph_long_query_is_searched_by_every_leg_and_reranked(gateway: Gateway) -> None:
    # 5,000 characters: over the old 2,000 limit, well within the default 16,000.
    query = ("What is a zx-81, and how did home computers of the early eighties store programs? " * 70)[:5000]
    assert len(query) <= gateway.settings.gateway_max_query_chars
    response = await search(gateway, query=query, rerank=True)
    assert response.results and not response.degradations
    assert response.searched_query == query
    fakes = gateway.fakes
    assert [list(embed.texts) for embed in fakes.requests["embedder"]] == [[query], [f"{query} rephrased"]]
    assert fakes.requests["planner"][0].query == query
    assert fakes.requests["bm25"][0].query == query
    assert fakes.requests["reranker"][0].query == query


async def test_a_query_over_the_limit_is_invalid_argument_before_any_downstream(gateway: Gateway) -> None:
    limit = gateway.settings.gateway_max_query_chars
    with pytest.raises(aio.AioRpcError) as caught:
        await search(gateway, query="x" * (limit + 1))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == f"the query length in characters is {limit + 1}, the limit is {limit}"
    assert not gateway.fakes.calls
