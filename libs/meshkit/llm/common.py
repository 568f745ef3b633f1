"""The types every LLM backend shares: the ``LLM`` protocol (chat, structured, stream),
``LLMError`` with a typed reason, ``Messages`` and ``ModelT``. A module of their own so the
backends (meshkit.llm.openai_compat, meshkit.llm.vllm) and the reply parsers (meshkit.llm.replies)
need not import meshkit.llm.factory, which imports the backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

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
