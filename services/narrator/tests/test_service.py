"""The real gRPC server in-process (port 0) with a scripted LLM."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
import pytest
from grpc import aio

from meshkit.rpc.server import RunningService, start_service
from meshkit.settings import NarratorSettings
from meshkit.text.answering import NOT_FOUND_PHRASE
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
from services.narrator.servicer import build_spec
from services.narrator.tests.fakes import FACTS, QUERY, SOURCES, FakeLLM, Pause, StreamStep, unavailable

pb = narrator_pb2
LIMITS = {
    "narrator_max_query_chars": 100,
    "narrator_max_sources": 4,
    "narrator_max_facts": 5,
    "narrator_max_fact_chars": 200,
    "narrator_max_snippet_chars": 100,
    "narrator_max_history_turns": 3,
    "narrator_max_history_chars": 300,
    "narrator_max_tokens_limit": 500,
}


@dataclass
class Server:
    running: RunningService
    llm: FakeLLM
    stub: narrator_pb2_grpc.NarratorServiceStub
    channel: aio.Channel


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    settings = NarratorSettings(
        log_format="text",
        port=0,
        llm_timeout_s=30.0,
        narrator_min_support=0.5,
        **LIMITS,  # type: ignore[arg-type]
    )
    llm = FakeLLM()
    spec, _ = build_spec(settings, llm)
    running = await start_service(spec, settings)
    channel = aio.insecure_channel(f"127.0.0.1:{running.port}")
    yield Server(running, llm, narrator_pb2_grpc.NarratorServiceStub(channel), channel)
    await channel.close(None)
    await running.stop(1.0)
    assert llm.closed


def request(**fields: object) -> pb.NarrateRequest:
    base = pb.NarrateRequest(
        query=QUERY,
        sources=[pb.Source(id=s.id, doc_id=s.doc_id, title=s.title, snippet=s.snippet) for s in SOURCES],
        facts=[pb.Fact(text=f.text, source=f.source, score=f.score) for f in FACTS],
        mode=pb.NARRATION_MODE_LLM,
    )
    for name, value in fields.items():
        if isinstance(value, list):
            base.ClearField(name)
            getattr(base, name).extend(value)
        else:
            setattr(base, name, value)
    return base


def script(server: Server, *steps: StreamStep) -> None:
    server.llm.streams.append(list(steps))


async def stream_events(
    server: Server, req: pb.NarrateRequest, timeout: float = 10.0
) -> list[pb.NarrateStreamResponse]:
    call = server.stub.NarrateStream(pb.NarrateStreamRequest(request=req), timeout=timeout)
    return [event async for event in call]


def split(events: list[pb.NarrateStreamResponse]) -> tuple[list[str], pb.Answer]:
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds == ["delta"] * (len(kinds) - 1) + ["answer"], kinds
    return [e.delta for e in events[:-1]], events[-1].answer


async def test_narrate_returns_the_verified_answer_with_citations(server: Server) -> None:
    script(server, "The Eiffel Tower is 330 metres tall [1,3]. ", "It was built by elves [2].")
    response = await server.stub.Narrate(request(max_tokens=120))
    answer = response.answer
    assert answer.text == "The Eiffel Tower is 330 metres tall [1, 3]."
    assert [(s.text, list(s.sources)) for s in answer.sentences] == [(answer.text, [1, 3])]
    assert [(c.number, c.source_id, c.doc_id, c.title, c.snippet) for c in answer.citations] == [
        (1, "c-1", "eiffel", "Eiffel Tower", "The Eiffel Tower is 330 metres tall."),
        (3, "c-3", "almanac", "Old almanac", "The Eiffel Tower is 300 metres tall."),
    ]
    assert [(r.text, r.reason) for r in answer.rejected] == [("It was built by elves [2].", "unsupported")]
    assert answer.answered and answer.mode == pb.NARRATION_MODE_LLM and answer.degraded_reason == ""
    assert server.llm.stream_calls[0]["max_tokens"] == 120


async def test_stream_sends_deltas_then_exactly_one_answer(server: Server) -> None:
    script(server, "The Eiffel Tower ", "is 330 metres tall [1].")
    deltas, answer = split(await stream_events(server, request()))
    assert deltas == ["The Eiffel Tower ", "is 330 metres tall [1]."]
    assert answer.text == "The Eiffel Tower is 330 metres tall [1]."
    assert [c.number for c in answer.citations] == [1]


async def test_stream_breaking_midway_ends_with_an_extractive_answer(server: Server) -> None:
    script(server, "The Eiffel Tower ", unavailable())
    deltas, answer = split(await stream_events(server, request()))
    assert deltas == ["The Eiffel Tower "]
    assert answer.mode == pb.NARRATION_MODE_EXTRACTIVE and answer.answered
    assert answer.degraded_reason == "unavailable: connection refused"
    assert all(list(s.sources) and f"[{s.sources[0]}]" in s.text for s in answer.sentences)


async def test_llm_error_before_the_first_token(server: Server) -> None:
    script(server, unavailable())
    deltas, answer = split(await stream_events(server, request()))
    assert deltas == [answer.text]
    assert answer.mode == pb.NARRATION_MODE_EXTRACTIVE and answer.degraded_reason.startswith("unavailable: ")


async def test_a_hung_llm_is_cut_by_the_callers_deadline(server: Server) -> None:
    script(server, "The Eiffel ", Pause(60))
    deltas, answer = split(await stream_events(server, request(), timeout=1.5))
    assert deltas == ["The Eiffel "]
    assert answer.mode == pb.NARRATION_MODE_EXTRACTIVE and answer.degraded_reason.startswith("deadline: ")


async def test_not_found_when_there_are_no_facts(server: Server) -> None:
    deltas, answer = split(await stream_events(server, request(facts=[])))
    assert not answer.answered and answer.text.startswith(NOT_FOUND_PHRASE)
    assert deltas == [answer.text] and not answer.citations and not answer.sentences
    assert server.llm.stream_calls == []


async def test_not_found_when_the_model_says_so(server: Server) -> None:
    script(server, "NOT_IN_DOCUMENTS")
    answer = (await server.stub.Narrate(request())).answer
    assert not answer.answered and answer.text.startswith(NOT_FOUND_PHRASE)
    assert answer.mode == pb.NARRATION_MODE_LLM


async def test_extractive_mode(server: Server) -> None:
    deltas, answer = split(await stream_events(server, request(mode=pb.NARRATION_MODE_EXTRACTIVE)))
    assert deltas == [answer.text]
    assert answer.mode == pb.NARRATION_MODE_EXTRACTIVE and answer.degraded_reason == ""
    assert [c.number for c in answer.citations] == [1, 2, 3]
    assert server.llm.stream_calls == []


async def test_unspecified_mode_is_the_server_default(server: Server) -> None:
    script(server, "The Eiffel Tower is 330 metres tall [1].")
    answer = (await server.stub.Narrate(request(mode=pb.NARRATION_MODE_UNSPECIFIED))).answer
    assert answer.mode == pb.NARRATION_MODE_LLM


async def test_contradictions_come_back(server: Server) -> None:
    script(server, "The Eiffel Tower is 330 metres tall [1]. Another source says 300 metres tall [3].")
    server.llm.structured_replies.append(
        {"contradictions": [{"source_a": 1, "source_b": 3, "description": "330 m vs 300 m"}]}
    )
    answer = (await server.stub.Narrate(request())).answer
    assert [(c.description, list(c.sources)) for c in answer.contradictions] == [("330 m vs 300 m", [1, 3])]


async def test_history_is_accepted(server: Server) -> None:
    script(server, "The Eiffel Tower is 330 metres tall [1].")
    turns = [
        pb.ChatTurn(role=pb.ROLE_USER, content="Tell me about Paris."),
        pb.ChatTurn(role=pb.ROLE_ASSISTANT, content="Paris is the capital of France [2]."),
    ]
    await server.stub.Narrate(request(history=turns))
    assert (
        "Assistant: Paris is the capital of France." in server.llm.stream_calls[0]["messages"][-1]["content"]
    )


def sources(n: int) -> list[pb.Source]:
    return [pb.Source(id=f"s{i}", title="t") for i in range(n)]


INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
CASES: list[tuple[str, Callable[[], pb.NarrateRequest], grpc.StatusCode, str]] = [
    ("empty query", lambda: request(query="  "), INVALID, "query is empty"),
    ("long query", lambda: request(query="q" * 101), INVALID, "query has 101 characters"),
    ("too many sources", lambda: request(sources=sources(5), facts=[]), EXHAUSTED, "5 sources"),
    ("too many facts", lambda: request(facts=[pb.Fact(text="f", source=1)] * 6), EXHAUSTED, "6 facts"),
    ("long fact", lambda: request(facts=[pb.Fact(text="f" * 201, source=1)]), EXHAUSTED, "facts[0].text"),
    ("empty fact", lambda: request(facts=[pb.Fact(text=" ", source=1)]), INVALID, "facts[0].text is empty"),
    ("fact source 0", lambda: request(facts=[pb.Fact(text="f", source=0)]), INVALID, "facts[0].source is 0"),
    ("fact source 4", lambda: request(facts=[pb.Fact(text="f", source=4)]), INVALID, "1..3"),
    (
        "nan score",
        lambda: request(facts=[pb.Fact(text="f", source=1, score=float("nan"))]),
        INVALID,
        "finite",
    ),
    (
        "long snippet",
        lambda: request(sources=[pb.Source(id="a", snippet="s" * 101)], facts=[]),
        EXHAUSTED,
        "snippet",
    ),
    (
        "duplicate ids",
        lambda: request(sources=[pb.Source(id="a"), pb.Source(id="a")], facts=[]),
        INVALID,
        "repeated",
    ),
    ("empty id", lambda: request(sources=[pb.Source(id="")], facts=[]), INVALID, "sources[0].id"),
    (
        "too many turns",
        lambda: request(history=[pb.ChatTurn(role=pb.ROLE_USER, content="x")] * 4),
        EXHAUSTED,
        "4 history turns",
    ),
    (
        "long history",
        lambda: request(history=[pb.ChatTurn(role=pb.ROLE_USER, content="x" * 301)]),
        EXHAUSTED,
        "history has 301",
    ),
    (
        "unknown role",
        lambda: request(history=[pb.ChatTurn(role=pb.ROLE_UNSPECIFIED, content="x")]),
        INVALID,
        "history[0].role",
    ),
    ("bad role", lambda: request(history=[pb.ChatTurn(role=7, content="x")]), INVALID, "history[0].role"),  # type: ignore[arg-type]
    (
        "empty turn",
        lambda: request(history=[pb.ChatTurn(role=pb.ROLE_USER, content=" ")]),
        INVALID,
        "history[0].content",
    ),
    ("unknown mode", lambda: request(mode=9), INVALID, "unknown mode 9"),
    ("max tokens", lambda: request(max_tokens=501), EXHAUSTED, "max_tokens is 501"),
]


@pytest.mark.parametrize(("name", "make", "code", "message"), CASES, ids=[c[0] for c in CASES])
async def test_validation(
    server: Server, name: str, make: Callable[[], pb.NarrateRequest], code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(aio.AioRpcError) as unary:
        await server.stub.Narrate(make())
    assert unary.value.code() == code and message in (unary.value.details() or "")
    with pytest.raises(aio.AioRpcError) as streamed:
        await stream_events(server, make())
    assert streamed.value.code() == code
    assert server.llm.stream_calls == []


async def test_stream_without_a_request(server: Server) -> None:
    with pytest.raises(aio.AioRpcError) as error:
        [e async for e in server.stub.NarrateStream(pb.NarrateStreamRequest())]
    assert error.value.code() == INVALID
