"""The LLM tier as the answering stages see it: the ``LLM`` protocol (chat, structured, stream),
``LLMError`` with a typed reason (unavailable, deadline, breaker_open, error, invalid_output),
which callers turn into a degradation (skip the LLM stage), and ``make_llm``, which picks the
configured backend: an OpenAI-compatible server (meshkit.llm_openai, the default) or an
in-process vLLM engine (meshkit.llm_vllm). Parsing a model's reply into JSON or a validated
schema is meshkit.llm_replies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from meshkit.settings import LLMSettings

ModelT = TypeVar("ModelT", bound=BaseModel)

Messages = Sequence[Mapping[str, Any]]


class LLMError(Exception):
    """An LLM call that did not succeed, with why: unavailable, deadline, breaker_open, error
    (the server refused the request or answered nonsense), or invalid_output (the model's text
    does not fit the schema; ``raw`` holds it)."""

    def __init__(
        self, reason: str, message: str, *, status: int | None = None, raw: str | None = None
    ) -> None:
        super().__init__(f"llm: {reason}: {message}")
        self.reason = reason
        self.message = message
        self.status = status
        self.raw = raw


class LLM(Protocol):
    """What the answering stages need from the LLM tier, whatever serves it. Every call raises
    LLMError on failure; ``stream`` yields content deltas."""

    async def chat(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> str: ...

    async def structured(
        self,
        messages: Messages,
        schema: type[ModelT],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> ModelT: ...

    def stream(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...


def make_llm(settings: LLMSettings, *, target: str = "llm") -> LLM:
    """The configured LLM backend: an OpenAI-compatible server (default) or, on GPU images, an
    in-process vLLM engine (each imported only when configured, so CPU installs never need vllm)."""
    if settings.llm_backend == "vllm":
        from meshkit.llm_vllm import VLLMEngineLLM

        return VLLMEngineLLM(settings)
    from meshkit.llm_openai import OpenAICompatibleLLM

    return OpenAICompatibleLLM(settings, target=target)
