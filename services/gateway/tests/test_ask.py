"""Ask through the real gateway over fake stages: evidence gating, the stages' failures turned
into degradations with an answer still on time, the stream's event order, validation, and the
HyDE and LLM-planner paths of the search underneath."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc import aio

from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from services.gateway.tests.conftest import (
    COLLECTION,
    HYDE_PASSAGE,
    NAME_OF,
    NARRATOR_DELTAS,
    SLOW_S,
    Gateway,
    running_gateway,
)


def ask(**fields: object) -> gateway_pb2.AskRequest:
    return gateway_pb2.AskRequest(collection=COLLECTION, query="what is ZX-81?", **fields)  # type: ignore[arg-type]


async def collect_stream(
    gateway: Gateway, request: gateway_pb2.AskRequest, timeout: float = 10
) -> list[gateway_pb2.AskStreamResponse]:
    call = gateway.stub.AskStream(gateway_pb2.AskStreamRequest(request=request), timeout=timeout)
    return [event async for event in call]


def stages(response: gateway_pb2.AskResponse | gateway_pb2.SearchResponse) -> set[tuple[int, int]]:
    return {(d.stage, d.reason) for d in response.degradations}


async def test_an_answer_cites_passages_it_read_and_lists_what_it_explored() -> None:
    async with running_gateway(gateway_rerank=True) as gateway:
        # The passages hold the fake extractor's facts and what the fake narrator says (an
        # unsupported fact or sentence is dropped).
        gateway.fakes.chunk_texts = {n: f"Fact from {n}. More of {n}." for n in ("c0", "c1", "c4")}
        gateway.fakes.chunk_texts["c3"] = "Fact from c3. The answer is here in the text."
        response = await gateway.stub.Ask(ask(include_facts=True), timeout=10)
    assert response.answered and response.answer == "".join(NARRATOR_DELTAS)
    assert not response.degradations
    read = [s.chunk_id for s in response.sources]
    # c2 scores -6, under the evidence floor (-2): not read; the rest in reranked order.
    assert [NAME_OF[c] for c in read] == ["c3", "c1", "c4", "c0"]
    assert [c.number for c in response.citations] == [1]
    assert response.citations[0].chunk_id == read[0]
    assert response.citations[0].location.heading_path == ["H"]
    assert [s.cited for s in response.sources] == [True, False, False, False]
    assert {f.passage_id for f in response.facts} == set(read)
    assert {t.stage for t in response.timings} >= {"search", "extract", "narrate", "total", "rerank"}
    assert response.mode == gateway_pb2.ANSWER_MODE_LLM
    # The extractor got the reranker's scores; the narrator got the facts numbered by source.
    extract = gateway.fakes.requests["extractor"][0]
    assert [p.score for p in extract.passages] == [3.0, 2.0, 1.0, -1.0]
    narrate = gateway.fakes.requests["narrator"][0]
    assert [f.source for f in narrate.facts] == [1, 2, 3, 4]


async def test_no_passage_above_the_evidence_floor_means_the_documents_do_not_say() -> None:
    async with running_gateway(gateway_rerank=True) as gateway:
        gateway.fakes.rerank_scores = dict.fromkeys(gateway.fakes.rerank_scores, -4.5)
        response = await gateway.stub.Ask(ask(), timeout=10)
    assert not response.answered and not response.sources and not response.citations
    assert gateway.fakes.calls["extractor"] == 0
    assert response.answer == "The documents do not say."


async def test_extractive_mode_asks_both_stages_for_it() -> None:
    async with running_gateway() as gateway:
        response = await gateway.stub.Ask(ask(mode=gateway_pb2.ANSWER_MODE_EXTRACTIVE), timeout=10)
    assert gateway.fakes.requests["extractor"][0].mode == 2  # EXTRACTION_MODE_EXTRACTIVE
    assert gateway.fakes.requests["narrator"][0].mode == narrator_pb2.NARRATION_MODE_EXTRACTIVE
    assert response.mode == gateway_pb2.ANSWER_MODE_EXTRACTIVE


async def test_extractor_down_gives_first_sentences_as_facts_and_a_degradation() -> None:
    async with running_gateway() as gateway:
        gateway.fakes.behaviour["extractor"] = "fail"
        # Sentences, not labels: evidence text leaves out a two-word line.
        gateway.fakes.chunk_texts.update(
            {f"c{i}": f"text of c{i} states one fact of the corpus." for i in range(20)}
        )
        response = await gateway.stub.Ask(ask(), timeout=10)
    assert stages(response) == {(gateway_pb2.STAGE_EXTRACTOR, gateway_pb2.DEGRADATION_REASON_UNAVAILABLE)}
    facts = gateway.fakes.requests["narrator"][0].facts
    assert facts and all(f.text.startswith("text of c") for f in facts)
    assert response.answered


async def test_a_stage_that_answered_without_its_llm_is_reported() -> None:
    async with running_gateway() as gateway:
        gateway.fakes.behaviour["extractor"] = "degraded"
        gateway.fakes.behaviour["narrator"] = "degraded"
        response = await gateway.stub.Ask(ask(), timeout=10)
    assert stages(response) == {
        (gateway_pb2.STAGE_EXTRACTOR, gateway_pb2.DEGRADATION_REASON_UNAVAILABLE),
        (gateway_pb2.STAGE_NARRATOR, gateway_pb2.DEGRADATION_REASON_DEADLINE),
    }
    assert response.answered


async def test_narrator_down_gives_the_gateways_own_extractive_answer() -> None:
    async with running_gateway() as gateway:
        gateway.fakes.behaviour["narrator"] = "fail"
        response = await gateway.stub.Ask(ask(), timeout=10)
    assert stages(response) == {(gateway_pb2.STAGE_NARRATOR, gateway_pb2.DEGRADATION_REASON_UNAVAILABLE)}
    assert response.answered and response.mode == gateway_pb2.ANSWER_MODE_EXTRACTIVE
    read = {s.chunk_id for s in response.sources}
    assert response.citations and all(c.chunk_id in read for c in response.citations)
    assert all(f"[{c.number}]" in response.answer for c in response.citations)


async def test_a_stream_cut_mid_answer_ends_with_an_extractive_answer_not_a_hang() -> None:
    async with running_gateway() as gateway:
        gateway.fakes.behaviour["narrator"] = "cut"
        events = await collect_stream(gateway, ask())
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-1] == "answer" and "delta" in kinds
    final = events[-1].answer
    assert (gateway_pb2.STAGE_NARRATOR, gateway_pb2.DEGRADATION_REASON_UNAVAILABLE) in stages(final)
    assert final.mode == gateway_pb2.ANSWER_MODE_EXTRACTIVE and final.answered


async def test_a_late_narrator_costs_the_llm_answer_not_the_deadline() -> None:
    async with running_gateway() as gateway:
        gateway.fakes.behaviour["narrator"] = "slow"
        started = time.monotonic()
        response = await gateway.stub.Ask(ask(), timeout=3)
        elapsed = time.monotonic() - started
    assert elapsed < SLOW_S - 1
    assert (gateway_pb2.STAGE_NARRATOR, gateway_pb2.DEGRADATION_REASON_DEADLINE) in stages(response)
    assert response.answered


async def test_the_stream_reports_progress_then_text_then_the_answer_last() -> None:
    async with running_gateway() as gateway:
        events = await collect_stream(gateway, ask())
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds == ["progress", "progress", "delta", "delta", "answer"]
    assert [e.progress.stage for e in events[:2]] == ["search", "extract"]
    assert "".join(e.delta for e in events if e.HasField("delta")) == events[-1].answer.answer


@pytest.mark.parametrize(
    ("request_fields", "code"),
    [
        ({"passages": 51}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"mode": 9}, grpc.StatusCode.INVALID_ARGUMENT),
        (
            {"history": [narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_USER, content="x" * 40_000)]},
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        ({"history": [narrator_pb2.ChatTurn(content="who?")]}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"hyde_mode": 7}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_bad_asks_are_refused_with_a_clear_code(
    gateway: Gateway, request_fields: dict[str, object], code: grpc.StatusCode
) -> None:
    with pytest.raises(aio.AioRpcError) as caught:
        await gateway.stub.Ask(ask(**request_fields), timeout=10)
    assert caught.value.code() == code
    assert gateway.fakes.calls["extractor"] == 0


async def test_history_reaches_the_narrator(gateway: Gateway) -> None:
    turns = [
        narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_USER, content="What is ZX-81?"),
        narrator_pb2.ChatTurn(role=narrator_pb2.ROLE_ASSISTANT, content="A computer [1]."),
    ]
    await gateway.stub.Ask(ask(history=turns), timeout=10)
    assert list(gateway.fakes.requests["narrator"][0].history) == turns


# ---------------------------------------------------------------------------- HyDE, LLM planner


def search(**fields: object) -> gateway_pb2.SearchRequest:
    return gateway_pb2.SearchRequest(collection=COLLECTION, query="what is ZX-81?", **fields)  # type: ignore[arg-type]


async def test_supplement_hyde_searches_with_the_passage_when_results_are_weak() -> None:
    # The best fake cosine is 0.9: a 0.95 floor makes every search weak.
    async with running_gateway(gateway_hyde_min_score=0.95) as gateway:
        response = await gateway.stub.Search(search(hyde_mode=planner_pb2.HYDE_MODE_SUPPLEMENT), timeout=10)
    assert gateway.fakes.calls["hyde"] == 1
    assert response.plan.hyde_passage == HYDE_PASSAGE
    embedded = [list(r.texts) for r in gateway.fakes.requests["embedder"]]
    assert embedded[-1] == [HYDE_PASSAGE]
    assert "hyde" in {t.stage for t in response.timings}
    assert not response.degradations


async def test_supplement_hyde_is_skipped_when_results_are_strong() -> None:
    async with running_gateway(gateway_hyde_min_score=0.5) as gateway:
        response = await gateway.stub.Search(search(hyde_mode=planner_pb2.HYDE_MODE_SUPPLEMENT), timeout=10)
    assert gateway.fakes.calls["hyde"] == 0
    assert response.plan.hyde_passage == ""


async def test_a_failed_hyde_leaves_the_plain_results_with_a_degradation() -> None:
    async with running_gateway(gateway_hyde_min_score=0.95) as gateway:
        gateway.fakes.behaviour["hyde"] = "fail"
        plain = await gateway.stub.Search(search(), timeout=10)
        response = await gateway.stub.Search(search(hyde_mode=planner_pb2.HYDE_MODE_SUPPLEMENT), timeout=10)
    assert [r.chunk_id for r in response.results] == [r.chunk_id for r in plain.results]
    assert stages(response) == {(gateway_pb2.STAGE_HYDE, gateway_pb2.DEGRADATION_REASON_UNAVAILABLE)}
    assert list(response.degradations[0].legs) == [gateway_pb2.LEG_DENSE]


async def test_a_planner_that_fell_back_from_its_llm_is_reported(gateway: Gateway) -> None:
    gateway.fakes.behaviour["planner"] = "llm_fallback"
    response = await gateway.stub.Search(search(), timeout=10)
    assert stages(response) == {(gateway_pb2.STAGE_PLANNER, gateway_pb2.DEGRADATION_REASON_INVALID_OUTPUT)}
    assert response.results


async def test_the_reranker_fallback_is_gated_too() -> None:
    # Nothing passes the reranker's own threshold (-5): it falls back to fused order, still scored.
    async with running_gateway(gateway_rerank=True) as gateway:
        gateway.fakes.rerank_scores = dict.fromkeys(gateway.fakes.rerank_scores, -7.0)
        response = await gateway.stub.Ask(ask(), timeout=10)
    assert not response.answered and not response.sources
    assert gateway.fakes.calls["extractor"] == 0
