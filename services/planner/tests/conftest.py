"""A fake LLM implementing meshkit's ``LLM`` protocol: canned replies or errors, no network.
Structured replies go through meshkit's own lenient parser, as the real client's do."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from meshkit.llm.factory import LLMError, Messages, ModelT
from meshkit.llm.replies import parse_structured


@dataclass
class Call:
    kind: str  # chat or structured
    messages: list[dict[str, Any]]
    schema: type[BaseModel] | None
    max_tokens: int | None
    timeout: float | None

    @property
    def prompt(self) -> str:
        return "\n".join(str(m["content"]) for m in self.messages)


@dataclass
class FakeLLM:
    # The reply text, or the error to raise.
    structured_reply: str | LLMError = "{}"
    chat_reply: str | LLMError = ""
    calls: list[Call] = field(default_factory=list)
    closed: bool = False

    async def chat(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> str:
        self.calls.append(Call("chat", [dict(m) for m in messages], None, max_tokens, timeout))
        if isinstance(self.chat_reply, LLMError):
            raise self.chat_reply
        return self.chat_reply

    async def structured(
        self,
        messages: Messages,
        schema: type[ModelT],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> ModelT:
        self.calls.append(Call("structured", [dict(m) for m in messages], schema, max_tokens, timeout))
        if isinstance(self.structured_reply, LLMError):
            raise self.structured_reply
        return parse_structured(self.structured_reply, schema)

    async def stream(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[str]:
        yield await self.chat(messages, max_tokens=max_tokens, temperature=temperature, timeout=timeout)

    async def aclose(self) -> None:
        self.closed = True

    def kinds(self) -> list[str]:
        return [c.kind for c in self.calls]
