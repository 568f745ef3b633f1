"""A scripted LLM implementing meshkit.llm.factory.LLM, and the evidence the tests answer from."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from meshkit.llm.factory import LLMError, Messages
from meshkit.llm.replies import parse_structured
from services.narrator.model import Fact, Mode, NarrationInput, Source, Turn

ModelT = TypeVar("ModelT", bound=BaseModel)


@dataclass(frozen=True)
class Pause:
    """A stream step that waits (a slow or hung model)."""

    seconds: float


# A stream script: text deltas, pauses, and an exception raised where it stands.
StreamStep = str | Pause | BaseException
# A structured reply: the model's raw text, a JSON-able value, or an exception to raise.
StructuredReply = str | dict[str, Any] | BaseException


class FakeLLM:
    def __init__(
        self,
        streams: Iterable[Sequence[StreamStep]] = (),
        structured: Iterable[StructuredReply] = (),
    ) -> None:
        self.streams = deque(streams)
        self.structured_replies = deque(structured)
        self.stream_calls: list[dict[str, Any]] = []
        self.structured_calls: list[dict[str, Any]] = []
        self.closed = False
        self.stream_closed = 0

    async def chat(self, messages: Messages, **options: Any) -> str:
        raise AssertionError("the narrator does not use chat")

    async def structured(self, messages: Messages, schema: type[ModelT], **options: Any) -> ModelT:
        self.structured_calls.append({"messages": list(messages), "schema": schema, **options})
        reply = self.structured_replies.popleft() if self.structured_replies else {"contradictions": []}
        if isinstance(reply, BaseException):
            raise reply
        return parse_structured(reply if isinstance(reply, str) else json.dumps(reply), schema)

    async def stream(self, messages: Messages, **options: Any) -> AsyncIterator[str]:
        self.stream_calls.append({"messages": list(messages), **options})
        script = self.streams.popleft()
        try:
            for step in script:
                if isinstance(step, BaseException):
                    raise step
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                else:
                    yield step
        finally:
            self.stream_closed += 1

    async def aclose(self) -> None:
        self.closed = True


def unavailable() -> LLMError:
    return LLMError("unavailable", "connection refused")


SOURCES = [
    Source("c-1", "eiffel", "Eiffel Tower", "The Eiffel Tower is 330 metres tall."),
    Source("c-2", "paris", "Paris guide", "The tower stands on the Champ de Mars."),
    Source("c-3", "almanac", "Old almanac", "The Eiffel Tower is 300 metres tall."),
]
FACTS = [
    Fact("The Eiffel Tower is 330 metres tall.", 1, 0.9),
    Fact("The Eiffel Tower was completed in 1889.", 1, 0.8),
    Fact("The Eiffel Tower stands in Paris on the Champ de Mars.", 2, 0.7),
    Fact("The Eiffel Tower is 300 metres tall.", 3, 0.5),
]
QUERY = "How tall is the Eiffel Tower?"


def narration(
    *,
    facts: list[Fact] | None = None,
    history: list[Turn] | None = None,
    mode: Mode = Mode.LLM,
    max_tokens: int = 300,
) -> NarrationInput:
    return NarrationInput(
        query=QUERY,
        sources=list(SOURCES),
        facts=list(FACTS if facts is None else facts),
        history=history or [],
        mode=mode,
        max_tokens=max_tokens,
    )
