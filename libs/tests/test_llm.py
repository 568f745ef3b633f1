"""OpenAICompatibleLLM against a scripted fake OpenAI-compatible server (httpx.MockTransport):
request shape, auth, lenient structured parsing, retries, breaker, streaming, deadlines."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel

from meshkit.llm.factory import LLMError
from meshkit.llm.openai_compat import OpenAICompatibleLLM
from meshkit.llm.replies import extract_json, validate_items
from meshkit.rpc import tracing
from meshkit.settings import LLMSettings, MeshSettings

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]
MESSAGES = [{"role": "user", "content": "hello"}]


class Answer(BaseModel):
    title: str
    count: int


class FakeServer:
    """Answers with the scripted responses in turn (the last one repeats) and keeps each request."""

    def __init__(self, *responses: Handler) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        respond = self.responses[min(len(self.requests), len(self.responses)) - 1]
        return await respond(request)

    def body(self, index: int = -1) -> dict[str, Any]:
        return dict(json.loads(self.requests[index].content))


def completion(content: str, usage: dict[str, int] | None = None) -> Handler:
    async def respond(request: httpx.Request) -> httpx.Response:
        data: dict[str, Any] = {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]
        }
        if usage:
            data["usage"] = usage
        return httpx.Response(200, json=data)

    return respond


def status(code: int) -> Handler:
    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(code, json={"error": {"message": f"status {code}"}})

    return respond


def slow(seconds: float) -> Handler:
    async def respond(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(seconds)
        return await completion("late")(request)

    return respond


def sse(*deltas: str, done: bool = True, cut: bool = False) -> Handler:
    """A streamed completion: one event per delta, then [DONE] (or an early end or a dropped
    connection)."""

    async def body() -> AsyncIterator[bytes]:
        yield b": keep-alive comment\n\n"
        for delta in deltas:
            chunk = {"choices": [{"index": 0, "delta": {"content": delta}}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        if cut:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        if done:
            usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(deltas)}}
            yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()

    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    return respond


def settings(**overrides: Any) -> LLMSettings:
    base: dict[str, Any] = {
        "llm_base_url": "http://llm.test/v1",
        "llm_model": "test-model",
        "llm_retry_backoff_s": 0.01,
        "llm_retry_attempts": 3,
        "llm_breaker_fail_max": 3,
        "llm_timeout_s": 5.0,
    }
    return LLMSettings(**{**base, **overrides})


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., OpenAICompatibleLLM]]:
    clients: list[OpenAICompatibleLLM] = []

    def make(server: FakeServer, **overrides: Any) -> OpenAICompatibleLLM:
        client = OpenAICompatibleLLM(settings(**overrides), transport=httpx.MockTransport(server))
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_chat_returns_content_and_sends_the_request(
    connect: Callable[..., OpenAICompatibleLLM],
) -> None:
    server = FakeServer(completion("hi there", usage={"prompt_tokens": 7, "completion_tokens": 2}))
    llm = connect(server, llm_max_tokens=64, llm_temperature=0.3)
    ok_before = sample("ragmesh_llm_requests_total", outcome="ok")
    prompt_before = sample("ragmesh_llm_tokens_total", kind="prompt")

    assert await llm.chat(MESSAGES) == "hi there"
    assert await llm.chat(MESSAGES, max_tokens=5, temperature=0.0) == "hi there"

    first, second = server.body(0), server.body(1)
    assert server.requests[0].url.path == "/v1/chat/completions"
    assert server.requests[0].method == "POST"
    assert first == {"model": "test-model", "messages": MESSAGES, "max_tokens": 64, "temperature": 0.3}
    assert (second["max_tokens"], second["temperature"]) == (5, 0.0)
    assert sample("ragmesh_llm_requests_total", outcome="ok") == ok_before + 2
    assert sample("ragmesh_llm_tokens_total", kind="prompt") == prompt_before + 14


async def test_bearer_header_only_when_a_key_is_set(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    server = FakeServer(completion("ok"))
    await connect(server).chat(MESSAGES)
    await connect(server, llm_api_key="sk-secret").chat(MESSAGES)

    assert "authorization" not in server.requests[0].headers
    assert server.requests[1].headers["authorization"] == "Bearer sk-secret"
    assert "sk-secret" not in repr(settings(llm_api_key="sk-secret"))


async def test_structured_parses_a_fenced_reply_and_coerces(
    connect: Callable[..., OpenAICompatibleLLM],
) -> None:
    server = FakeServer(completion('Sure! Here it is:\n```json\n{"title": "x", "count": "3"}\n```\nDone.'))
    answer = await connect(server).structured(MESSAGES, Answer)

    assert answer == Answer(title="x", count=3)
    response_format = server.body()["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "Answer"
    assert response_format["json_schema"]["strict"] is True
    assert response_format["json_schema"]["schema"] == Answer.model_json_schema()


def test_extract_json_finds_an_object_in_prose() -> None:
    assert extract_json('The plan is {"a": [1, 2]} as asked.') == {"a": [1, 2]}
    assert extract_json("  [1, 2] ") == [1, 2]
    with pytest.raises(ValueError):
        extract_json("no json {here")


@pytest.mark.parametrize(
    "reply",
    ['{"title": "x", "count": 3', '{"title": "x", "count": "three"}', '{"title": "x"}', "I cannot help."],
)
async def test_structured_invalid_output_keeps_the_raw_text(
    connect: Callable[..., OpenAICompatibleLLM], reply: str
) -> None:
    with pytest.raises(LLMError) as caught:
        await connect(FakeServer(completion(reply))).structured(MESSAGES, Answer)
    assert caught.value.reason == "invalid_output"
    assert caught.value.raw == reply


def test_validate_items_keeps_good_entries_and_reports_bad_ones() -> None:
    raw = [{"title": "a", "count": 1}, {"title": "b"}, {"title": "c", "count": "2"}, "junk"]
    valid, rejected = validate_items(raw, Answer)

    assert valid == [Answer(title="a", count=1), Answer(title="c", count=2)]
    assert [index for index, _ in rejected] == [1, 3]
    assert "count" in rejected[0][1]


async def test_retries_a_503_then_succeeds(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    server = FakeServer(status(503), status(429), completion("ok"))
    assert await connect(server).chat(MESSAGES) == "ok"
    assert len(server.requests) == 3


async def test_retries_stop_at_the_attempt_limit(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    server = FakeServer(status(502))
    with pytest.raises(LLMError) as caught:
        await connect(server, llm_retry_attempts=2).chat(MESSAGES)
    assert (caught.value.reason, caught.value.status) == ("unavailable", 502)
    assert len(server.requests) == 2


async def test_no_retry_on_400(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    server = FakeServer(status(400), completion("never"))
    with pytest.raises(LLMError) as caught:
        await connect(server).chat(MESSAGES)
    assert (caught.value.reason, caught.value.status) == ("error", 400)
    assert len(server.requests) == 1


async def test_connect_error_is_retried_then_unavailable(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    async def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    server = FakeServer(refuse)
    with pytest.raises(LLMError) as caught:
        await connect(server, llm_retry_attempts=2).chat(MESSAGES)
    assert caught.value.reason == "unavailable"
    assert len(server.requests) == 2


async def test_errors_name_the_failure_not_the_servers_answer_or_the_exception(
    connect: Callable[..., OpenAICompatibleLLM],
) -> None:
    # LLMError messages reach callers as degradation reasons: internals stay in the log.
    async def leaky(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, text="prompt too long: /models/secret-path.gguf token=abc123")

    with pytest.raises(LLMError) as caught:
        await connect(FakeServer(leaky)).chat(MESSAGES)
    assert caught.value.message == "HTTP 400 from the LLM server"

    async def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connect to 10.1.2.3:8080 failed", request=request)

    with pytest.raises(LLMError) as caught:
        await connect(FakeServer(refuse), llm_retry_attempts=1).chat(MESSAGES)
    assert caught.value.message == "cannot reach the LLM server (ConnectError)"


async def test_breaker_opens_and_fails_fast(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    server = FakeServer(status(503))
    llm = connect(server, llm_retry_attempts=1, llm_breaker_fail_max=3)
    for _ in range(3):
        with pytest.raises(LLMError) as caught:
            await llm.chat(MESSAGES)
        assert caught.value.reason == "unavailable"

    with pytest.raises(LLMError) as caught:
        await llm.chat(MESSAGES)
    assert caught.value.reason == "breaker_open"
    assert len(server.requests) == 3
    assert llm.breaker_state == "open"


async def test_refused_requests_do_not_open_the_breaker(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    server = FakeServer(status(400))
    llm = connect(server, llm_breaker_fail_max=2)
    for _ in range(4):
        with pytest.raises(LLMError, match="HTTP 400"):
            await llm.chat(MESSAGES)
    assert len(server.requests) == 4
    assert llm.breaker_state == "closed"


async def test_stream_yields_deltas_in_order_until_done(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    server = FakeServer(sse("Hel", "lo", " world"))
    deltas = [delta async for delta in connect(server).stream(MESSAGES)]

    assert deltas == ["Hel", "lo", " world"]
    assert server.body()["stream"] is True


@pytest.mark.parametrize("ending", [{"cut": True}, {"done": False}], ids=["dropped", "ended-early"])
async def test_stream_cut_before_done_is_unavailable(
    connect: Callable[..., OpenAICompatibleLLM], ending: dict[str, bool]
) -> None:
    seen: list[str] = []
    with pytest.raises(LLMError) as caught:
        async for delta in connect(FakeServer(sse("a", "b", **ending))).stream(MESSAGES):
            seen.append(delta)
    assert caught.value.reason == "unavailable"
    assert seen == ["a", "b"]


async def test_stream_open_is_retried(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    server = FakeServer(status(503), sse("ok"))
    assert [d async for d in connect(server).stream(MESSAGES)] == ["ok"]
    assert len(server.requests) == 2


async def test_deadline_cuts_a_slow_server(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LLMError) as caught:
        await connect(FakeServer(slow(5.0))).chat(MESSAGES, timeout=0.2)
    assert caught.value.reason == "deadline"
    assert loop.time() - started < 1.0


async def test_deadline_cuts_a_stalled_stream(connect: Callable[..., OpenAICompatibleLLM]) -> None:
    async def stall(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            yield b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
            await asyncio.sleep(5.0)
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=body())

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LLMError) as caught:
        async for _ in connect(FakeServer(stall)).stream(MESSAGES, timeout=0.3):
            pass
    assert caught.value.reason == "deadline"
    assert loop.time() - started < 1.5


async def test_each_llm_call_is_one_client_span_whose_context_the_server_receives(
    connect: Callable[..., OpenAICompatibleLLM], tmp_path: Path
) -> None:
    path = tmp_path / "spans.jsonl"
    assert tracing.configure_tracing("unit", MeshSettings(trace_file=path))
    try:
        server = FakeServer(status(503), completion("hi"), sse("a", "b"))
        llm = connect(server)
        assert await llm.chat(MESSAGES) == "hi"  # the first attempt failed: both are one span
        assert [d async for d in llm.stream(MESSAGES)] == ["a", "b"]
        assert tracing.flush_tracing()
        spans = tracing.read_spans(path)
    finally:
        tracing.shutdown_tracing()
    chat, stream = spans
    assert (chat["name"], stream["name"]) == ("llm.chat", "llm.stream")
    assert chat["kind"] == "CLIENT" and chat["attributes"]["gen_ai.request.model"] == "test-model"
    assert chat["status"] != "ERROR" and stream["status"] != "ERROR"
    # Every attempt carried the span's context (the retry too), for the server's own spans.
    parents = [r.headers["traceparent"].split("-")[2] for r in server.requests]
    assert parents == [chat["span_id"], chat["span_id"], stream["span_id"]]
