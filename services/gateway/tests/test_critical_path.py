"""The short critical path of a search: plans made in the gateway process, and, when the
planner service plans, BM25 and the question's own dense search running while it does."""

from __future__ import annotations

import pytest

from meshkit.settings import GatewaySettings, PlannerSettings
from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from services.gateway.planning import LocalPlanner, local_planner

from .conftest import LAG_S, STANDALONE_PREFIX, Gateway, running_gateway
from .test_search import names, search

QUERY = "what is a zx-81"


def timing(response: pb.SearchResponse, stage: str) -> float:
    return next(t.ms for t in response.timings if t.stage == stage)


async def test_local_planner_plans_in_process_without_the_service() -> None:
    async with running_gateway(gateway_planner="local") as gateway:
        # A dead planner service changes nothing: it is not on the path.
        gateway.fakes.behaviour["planner"] = "fail"
        response = await search(gateway, include_leg_results=True, max_variations=3)
    fakes = gateway.fakes
    assert fakes.calls["planner"] == 0
    assert not response.degradations
    plan = response.plan
    assert plan.planner == "deterministic" and plan.searched_query == QUERY
    # The deterministic planner's own plan: the question first, its rewrites after it.
    assert plan.variations[0] == QUERY and len(plan.variations) > 1
    assert list(plan.hard_keywords) == ["zx-81"]
    assert plan.strategy == planner_pb2.STRATEGY_PRECISE and plan.pool_size == 50
    # One embedding call for every variation, and every leg ran.
    assert [list(e.texts) for e in fakes.requests["embedder"]] == [list(plan.variations)]
    assert list(fakes.requests["exact"][0].keywords) == ["zx-81"]
    assert names(response)[:2] == ["c0", "c2"]
    assert "planner" in {t.stage for t in response.timings}


async def test_local_planner_keeps_the_callers_limits() -> None:
    async with running_gateway(gateway_planner="local") as gateway:
        response = await search(gateway, max_variations=1, strategy=planner_pb2.STRATEGY_EXHAUSTIVE)
    assert list(response.plan.variations) == [QUERY]
    assert response.plan.strategy == planner_pb2.STRATEGY_EXHAUSTIVE and response.plan.pool_size == 80
    assert [list(e.texts) for e in gateway.fakes.requests["embedder"]] == [[QUERY]]


async def test_hyde_requests_still_go_to_the_planner_service() -> None:
    async with running_gateway(gateway_planner="local") as gateway:
        response = await search(gateway, hyde_mode=planner_pb2.HYDE_MODE_FUSION)
    assert gateway.fakes.calls["planner"] == 1
    assert response.plan.hyde_mode == planner_pb2.HYDE_MODE_FUSION


async def test_dead_planner_service_degrades_when_it_plans() -> None:
    # gateway_planner=auto with an LLM planner configured: the service plans, and when it is
    # down the search runs on the question alone, reported.
    llm = PlannerSettings(planner_mode="llm")
    settings = GatewaySettings(gateway_planner="auto")
    assert local_planner(settings, llm) is None
    async with running_gateway(gateway_planner="service") as gateway:
        gateway.fakes.behaviour["planner"] = "fail"
        response = await search(gateway)
    assert [(d.stage, d.reason) for d in response.degradations] == [
        (pb.STAGE_PLANNER, pb.DEGRADATION_REASON_UNAVAILABLE)
    ]
    assert response.plan.planner == "fallback" and response.results


@pytest.mark.parametrize(
    ("mode", "planner", "local"),
    [
        ("auto", PlannerSettings(), True),
        ("auto", PlannerSettings(planner_mode="llm"), False),
        ("auto", PlannerSettings(planner_hyde_mode="supplement"), False),
        ("local", PlannerSettings(planner_mode="llm"), True),
        ("service", PlannerSettings(), False),
    ],
)
def test_which_planner_plans(mode: str, planner: PlannerSettings, local: bool) -> None:
    chosen = local_planner(GatewaySettings(gateway_planner=mode), planner)
    assert (chosen is not None) == local
    if chosen is not None:
        assert chosen.serves(planner_pb2.HYDE_MODE_OFF) and chosen.serves(planner_pb2.HYDE_MODE_UNSPECIFIED)
        assert not chosen.serves(planner_pb2.HYDE_MODE_SUPPLEMENT)


def test_local_planner_follows_the_planner_settings() -> None:
    planner = LocalPlanner(PlannerSettings(planner_deterministic_variations=2, planner_exhaustive_pool=20))
    # A broad question: the planner chooses the exhaustive strategy.
    plan = planner.plan("What are the side effects of metformin?", planner_pb2.STRATEGY_UNSPECIFIED, 0, ())
    assert len(plan.variations) == 2 and plan.variations[0] == "What are the side effects of metformin?"
    assert plan.pool_size == 20 and plan.planner == "deterministic"


async def test_bm25_and_the_questions_dense_search_run_while_the_service_plans(gateway: Gateway) -> None:
    fakes = gateway.fakes
    fakes.behaviour["planner"] = "lag"
    fakes.behaviour["bm25"] = "lag"
    response = await search(gateway)
    assert not response.degradations
    # One after the other, plan then BM25 take at least two lags; together, one lag and the
    # rest of the search (the margin is for a loaded machine).
    assert timing(response, "total") < 2 * LAG_S * 1000, response.timings
    # The question's vectors were searched on every shard before the plan's variation was embedded.
    assert [list(e.texts) for e in fakes.requests["embedder"]] == [[QUERY], [f"{QUERY} rephrased"]]
    assert fakes.calls["index-0"] == fakes.calls["index-1"] == 2
    assert fakes.calls["bm25"] == 1


async def test_early_calls_are_made_again_when_the_plan_rewrites_the_question(gateway: Gateway) -> None:
    fakes = gateway.fakes
    fakes.behaviour["planner"] = "rewrite"
    response = await search(gateway, include_leg_results=True)
    rewritten = f"{STANDALONE_PREFIX}{QUERY}"
    assert response.searched_query == rewritten
    # BM25 and the dense search of the question as asked may have started; what counts is
    # the rewrite's.
    assert fakes.requests["bm25"][-1].query == rewritten
    assert [list(e.texts) for e in fakes.requests["embedder"]][-1] == [rewritten, f"{rewritten} rephrased"]
    assert not response.degradations and response.results


async def test_a_conversation_is_searched_only_as_the_planner_rewrote_it(gateway: Gateway) -> None:
    history = [narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_USER, content="tell me about the zx-81")]
    response = await search(gateway, history=history)
    # Nothing started before the plan: the question alone means little in a conversation.
    assert [r.query for r in gateway.fakes.requests["bm25"]] == [response.searched_query]
    assert response.searched_query.startswith(STANDALONE_PREFIX)
    assert response.results
