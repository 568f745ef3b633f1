"""Fakes for the extractor's tests: a scripted LLM implementing meshkit.llm.factory.LLM (replies are
text, parsed leniently like the real client's) and a bag-of-words embed function."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pytest
from pydantic import BaseModel

from meshkit.llm.factory import LLMError, Messages
from meshkit.llm.replies import parse_structured
from meshkit.settings import ExtractorSettings
from meshkit.text.answering import content_words
from ragmesh.embedder.v1 import embedder_pb2
from services.extractor.extractive import EmbedError

ModelT = TypeVar("ModelT", bound=BaseModel)

EMBED_DIM = 512

# A reply: the model's raw text, or an exception to raise. Given the call being answered.
Script = Callable[["Call"], "str | Exception"]


@dataclass
class Call:
    purpose: str  # map, gate or summary, read from the prompt
    prompt: str
    schema: dict[str, Any]
    max_tokens: int | None
    timeout: float | None

    def numbered(self) -> dict[int, str]:
        """The numbered lines of the prompt ([n] text), first text per number."""
        lines: dict[int, str] = {}
        for match in re.finditer(r"^\[(\d+)\] (.*)$", self.prompt, re.MULTILINE):
            lines.setdefault(int(match.group(1)), match.group(2))
        return lines

    @property
    def max_items(self) -> int:
        (prop,) = self.schema["properties"].values()
        return int(prop["maxItems"])


def purpose_of(prompt: str) -> str:
    if "Passages:" in prompt:
        return "map"
    if "Which facts" in prompt:
        return "gate"
    return "summary"


def echo_map(call: Call) -> str:
    """Map replies that copy each passage's text (title removed) as its fact."""
    facts = [{"passage": n, "fact": re.sub(r"^\([^)]*\) ", "", text)} for n, text in call.numbered().items()]
    return json.dumps({"facts": facts})


def default_script(call: Call) -> str:
    if call.purpose == "map":
        return echo_map(call)
    if call.purpose == "gate":
        return json.dumps({"relevant": list(call.numbered())})
    return json.dumps({"facts": []})


@dataclass
class FakeLLM:
    """Answers by ``script`` (default: echo facts, pass every gate, no summary); records
    every call and the most calls in flight at once."""

    script: Script = default_script
    delay_s: float = 0.0
    calls: list[Call] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    def by_purpose(self, purpose: str) -> list[Call]:
        return [c for c in self.calls if c.purpose == purpose]

    async def structured(
        self,
        messages: Messages,
        schema: type[ModelT],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> ModelT:
        prompt = str(messages[-1]["content"])
        call = Call(purpose_of(prompt), prompt, schema.model_json_schema(), max_tokens, timeout)
        self.calls.append(call)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                try:
                    async with asyncio.timeout(timeout):
                        await asyncio.sleep(self.delay_s)
                except TimeoutError:
                    raise LLMError("deadline", "no answer before the deadline") from None
            reply = self.script(call)
        finally:
            self.in_flight -= 1
        if isinstance(reply, Exception):
            raise reply
        return parse_structured(reply, schema)

    async def chat(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> str:
        raise AssertionError("the extractor only makes structured calls")

    async def stream(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[str]:
        raise AssertionError("the extractor only makes structured calls")
        yield ""  # pragma: no cover

    async def aclose(self) -> None:
        return None


def bag_of_words(text: str) -> np.ndarray:
    """A unit vector with one hashed dimension per content word: cosine ~ shared words."""
    vector = np.zeros(EMBED_DIM, dtype=np.float32)
    for word in content_words(text):
        vector[int(hashlib.sha1(word.encode()).hexdigest(), 16) % EMBED_DIM] += 1.0
    norm = np.linalg.norm(vector)
    return vector / norm if norm else vector


@dataclass
class FakeEmbed:
    """Bag-of-words embeddings; ``down`` makes every call fail like an unreachable embedder."""

    down: bool = False
    calls: list[tuple[list[str], int]] = field(default_factory=list)

    async def __call__(self, texts: Sequence[str], kind: embedder_pb2.TextKind) -> np.ndarray:
        self.calls.append((list(texts), int(kind)))
        if self.down:
            raise EmbedError("embedder: unavailable: connection refused")
        return np.stack([bag_of_words(t) for t in texts])


def make_settings(**overrides: Any) -> ExtractorSettings:
    """Test settings: the gate off unless a test turns it on, one LLM slot for determinism."""
    base: dict[str, Any] = {
        "log_format": "text",
        "port": 0,
        "extractor_relevance_gate": False,
        "extractor_llm_concurrency": 1,
        "llm_timeout_s": 5.0,
    }
    return ExtractorSettings(**{**base, **overrides})


@pytest.fixture
def fake_llm() -> FakeLLM:
    return FakeLLM()


@pytest.fixture
def fake_embed() -> FakeEmbed:
    return FakeEmbed()
