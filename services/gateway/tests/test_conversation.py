"""Conversations through the gateway (fake downstreams, see conftest): Search and Ask pass the
history to the planner, every leg, the reranker, the extractor and the narrator work on the
query the plan searches, and the responses say which query that was."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio

from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2

from .conftest import COLLECTION, STANDALONE_PREFIX, Gateway

QUESTION = "and for the staging cluster?"
HISTORY = [
    narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_USER, content="How is the production cluster configured?"),
    narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_ASSISTANT, content="Five nodes [1]."),
]
# What the fake planner makes of HISTORY: the prefix and the last turn.
SEARCHED = f"{STANDALONE_PREFIX}Five nodes [1]."


async def test_search_passes_the_conversation_and_searches_the_rewrite(gateway: Gateway) -> None:
    request = pb.SearchRequest(collection=COLLECTION, query=QUESTION, history=HISTORY, rerank=True)
    response = await gateway.stub.Search(request, timeout=10)
    fakes = gateway.fakes
    (plan_request,) = fakes.requests["planner"]
    assert plan_request.query == QUESTION
    assert [(t.role, t.content) for t in plan_request.history] == [
        (planner_pb2.TURN_ROLE_USER, HISTORY[0].content),
        (planner_pb2.TURN_ROLE_ASSISTANT, HISTORY[1].content),
    ]
    assert response.searched_query == response.plan.searched_query == SEARCHED
    assert response.plan.variations[0] == SEARCHED
    assert list(fakes.requests["embedder"][0].texts) == [SEARCHED, f"{SEARCHED} rephrased"]
    assert fakes.requests["bm25"][0].query == SEARCHED
    assert fakes.requests["reranker"][0].query == SEARCHED
    assert response.results


async def test_without_a_conversation_the_question_is_searched(gateway: Gateway) -> None:
    response = await gateway.stub.Search(pb.SearchRequest(collection=COLLECTION, query=QUESTION), timeout=10)
    assert not gateway.fakes.requests["planner"][0].history
    assert response.searched_query == QUESTION
    assert gateway.fakes.requests["bm25"][0].query == QUESTION


async def test_a_rewrite_over_the_gateways_limits_is_not_searched(gateway: Gateway) -> None:
    gateway.fakes.behaviour["planner"] = "huge_rewrite"
    request = pb.SearchRequest(collection=COLLECTION, query=QUESTION, history=HISTORY)
    response = await gateway.stub.Search(request, timeout=10)
    assert response.searched_query == QUESTION == response.plan.variations[0]
    assert gateway.fakes.requests["bm25"][0].query == QUESTION


async def test_the_planner_down_searches_the_question(gateway: Gateway) -> None:
    gateway.fakes.behaviour["planner"] = "fail"
    request = pb.SearchRequest(collection=COLLECTION, query=QUESTION, history=HISTORY)
    response = await gateway.stub.Search(request, timeout=10)
    assert response.searched_query == QUESTION
    assert any(d.stage == pb.STAGE_PLANNER for d in response.degradations)


async def test_ask_answers_the_searched_query_and_says_so(gateway: Gateway) -> None:
    request = pb.AskRequest(collection=COLLECTION, query=QUESTION, history=HISTORY)
    response = await gateway.stub.Ask(request, timeout=10)
    fakes = gateway.fakes
    assert len(fakes.requests["planner"][0].history) == 2
    assert response.searched_query == response.plan.searched_query == SEARCHED
    assert fakes.requests["extractor"][0].query == SEARCHED
    narrate = fakes.requests["narrator"][0]
    assert narrate.query == SEARCHED
    assert list(narrate.history) == HISTORY


@pytest.mark.parametrize(
    ("history", "code"),
    [
        (
            [narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_USER, content="x")] * 21,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        (
            [narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_USER, content="x" * 40_000)],
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        ([narrator_pb2.ChatTurn(content="who?")], grpc.StatusCode.INVALID_ARGUMENT),
        ([narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_USER, content=" ")], grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_a_bad_search_history_is_refused_before_any_downstream(
    gateway: Gateway, history: list[narrator_pb2.ChatTurn], code: grpc.StatusCode
) -> None:
    request = pb.SearchRequest(collection=COLLECTION, query=QUESTION, history=history)
    with pytest.raises(aio.AioRpcError) as caught:
        await gateway.stub.Search(request, timeout=10)
    assert caught.value.code() == code
    assert "history" in (caught.value.details() or "")
    assert gateway.fakes.calls["planner"] == 0
