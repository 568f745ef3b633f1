"""The in-process vLLM backend against a stand-in ``vllm`` module (the real one needs a GPU):
deltas from cumulative outputs, structured output through the constraint, the deadline aborting
the request, and a clear error where vllm is not installed."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from meshkit.llm.factory import LLMError, make_llm
from meshkit.settings import LLMSettings


class _Output:
    def __init__(self, text: str) -> None:
        self.outputs = [types.SimpleNamespace(text=text)]


class _Tokenizer:
    def apply_chat_template(self, messages: list[dict[str, Any]], **_: Any) -> str:
        return "|".join(m["content"] for m in messages)


class _Engine:
    def __init__(self, steps: list[str], delay: float = 0.0) -> None:
        self.steps = steps
        self.delay = delay
        self.aborted: list[str] = []
        self.prompts: list[str] = []
        self.sampling: list[dict[str, Any]] = []

    async def get_tokenizer(self) -> _Tokenizer:
        return _Tokenizer()

    async def generate(
        self, prompt: str, sampling: dict[str, Any], request_id: str
    ) -> AsyncIterator[_Output]:
        self.prompts.append(prompt)
        self.sampling.append(sampling)
        for text in self.steps:
            await asyncio.sleep(self.delay)
            yield _Output(text)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _fake_vllm(engine: _Engine) -> types.ModuleType:
    vllm = types.ModuleType("vllm")
    vllm.AsyncEngineArgs = lambda **kw: kw  # type: ignore[attr-defined]
    vllm.AsyncLLMEngine = types.SimpleNamespace(from_engine_args=lambda args: engine)  # type: ignore[attr-defined]
    vllm.SamplingParams = lambda **kw: kw  # type: ignore[attr-defined]
    params = types.ModuleType("vllm.sampling_params")
    params.StructuredOutputsParams = lambda json: {"json": json}  # type: ignore[attr-defined]
    return vllm, params  # type: ignore[return-value]


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Engine]:
    fake = _Engine(["Hel", "Hello", "Hello world"])
    vllm, params = _fake_vllm(fake)  # type: ignore[misc]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", params)
    yield fake


def _settings(**extra: Any) -> LLMSettings:
    return LLMSettings(llm_backend="vllm", llm_vllm_model="some/model", **extra)


async def test_stream_yields_what_is_new_in_each_cumulative_output(engine: _Engine) -> None:
    llm = make_llm(_settings())
    deltas = [d async for d in llm.stream([{"role": "user", "content": "hi"}], max_tokens=7)]
    assert deltas == ["Hel", "lo", " world"]
    assert engine.prompts == ["hi"]
    assert engine.sampling[0]["max_tokens"] == 7


class _Answer(BaseModel):
    value: int


async def test_structured_constrains_to_the_schema_and_validates(engine: _Engine) -> None:
    engine.steps = ['{"value": "3"}']
    llm = make_llm(_settings())
    answer = await llm.structured([{"role": "user", "content": "n?"}], _Answer)
    assert answer.value == 3
    assert engine.sampling[0]["structured_outputs"]["json"]["title"] == "_Answer"


async def test_the_deadline_aborts_the_generation(engine: _Engine) -> None:
    engine.delay = 0.5
    llm = make_llm(_settings())
    with pytest.raises(LLMError) as caught:
        await llm.chat([{"role": "user", "content": "slow"}], timeout=0.2)
    assert caught.value.reason == "deadline"
    assert len(engine.aborted) == 1


def test_without_vllm_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(LLMError, match="needs the vllm package"):
        make_llm(_settings())


def test_the_model_must_be_named() -> None:
    with pytest.raises(LLMError, match="RAGMESH_LLM_VLLM_MODEL"):
        make_llm(LLMSettings(llm_backend="vllm"))
