"""The narration pipeline: stream the LLM's answer, verify it, and fall back to the extractive
answer whenever the LLM's is unusable. Emits the visible text as it comes (str) and then exactly
one Answer, always last, whatever happened on the way. A phrase looping in the text is held back
from the stream (degenerate.RepeatGate) and its sentence dropped by verification."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator

from meshkit.llm.factory import LLM, LLMError, Messages
from meshkit.rpc.client import remaining_budget
from meshkit.settings import NarratorSettings
from meshkit.text.answering import NO_EVIDENCE_REASON
from services.narrator import metrics
from services.narrator.compose import build_messages, prompt_facts
from services.narrator.contradictions import find_contradictions
from services.narrator.degenerate import RepeatGate
from services.narrator.envelope import VisibleText
from services.narrator.extractive import extractive_answer
from services.narrator.model import (
    MODEL_NOT_FOUND_REASON,
    Answer,
    Contradiction,
    Mode,
    NarrationInput,
    Rejection,
    not_found_answer,
)
from services.narrator.verify import support_texts, verify

log = logging.getLogger("ragmesh.narrator")

# Time kept back from the LLM for verification and the final answer, so a deadline fallback
# still reaches the caller before its deadline does.
FINAL_ANSWER_MARGIN_S = 0.25
# Less time than this left after the answer: the contradiction check is skipped.
MIN_CONTRADICTION_BUDGET_S = 1.0
NO_VERIFIABLE_SENTENCE = "no verifiable sentence"
# Greedy decoding in small models falls into loops ("X [1]. X [2]. X [3]...") that run to
# max_tokens: once the last LOOP_WINDOW characters already appeared earlier in the reply, the
# generation is stopped and what came before is verified. Checked only past LOOP_MIN_CHARS.
LOOP_WINDOW = 48
LOOP_MIN_CHARS = 160


def looping(text: str) -> bool:
    """Whether the reply so far ends by repeating an earlier stretch of itself."""
    return LoopWatch().feed(text)


class LoopWatch:
    """``looping`` over a reply that grows delta by delta, in time linear in its length: each
    LOOP_WINDOW-char stretch lying wholly before the last LOOP_WINDOW chars is remembered once
    (by its hash), so a delta is checked against a set instead of re-joining and rescanning the
    whole reply, which was quadratic over a long stream."""

    def __init__(self) -> None:
        self._seen: set[int] = set()
        self._length = 0
        # The reply from _buffer_start on: the stretches not yet remembered and the tail.
        self._buffer = ""
        self._buffer_start = 0
        self._next = 0  # where the next stretch to remember starts

    def feed(self, delta: str) -> bool:
        """Add ``delta``; whether the reply now ends by repeating an earlier stretch."""
        self._buffer += delta
        self._length += len(delta)
        while self._next + 2 * LOOP_WINDOW <= self._length:
            at = self._next - self._buffer_start
            self._seen.add(hash(self._buffer[at : at + LOOP_WINDOW]))
            self._next += 1
        keep_from = min(self._next, self._length - LOOP_WINDOW)
        if keep_from > self._buffer_start:
            self._buffer = self._buffer[keep_from - self._buffer_start :]
            self._buffer_start = keep_from
        return self._length >= LOOP_MIN_CHARS and hash(self._buffer[-LOOP_WINDOW:]) in self._seen


Event = str | Answer


class Narrator:
    def __init__(self, settings: NarratorSettings, llm: LLM) -> None:
        self.settings = settings
        self.llm = llm

    async def narrate(self, request: NarrationInput) -> AsyncGenerator[Event, None]:
        """Text deltas, then the final Answer. When no text was streamed (extractive, not found,
        a failure before the first token) the answer's text is sent as one delta first, so a
        reader of the deltas alone still sees the answer."""
        started = time.monotonic()
        streamed = False
        async for event in self._events(request):
            if isinstance(event, str):
                if not streamed:
                    metrics.FIRST_DELTA_SECONDS.observe(time.monotonic() - started)
                    streamed = True
                yield event
                continue
            if not streamed:
                yield event.text
            record(event, started)
            yield event

    async def answer(self, request: NarrationInput) -> Answer:
        """The final answer alone (the unary call)."""
        async with contextlib.aclosing(self.narrate(request)) as events:
            async for event in events:
                if isinstance(event, Answer):
                    return event
        raise AssertionError("narrate ended without an answer")  # pragma: no cover

    async def _events(self, request: NarrationInput) -> AsyncIterator[Event]:
        if not request.facts:
            yield not_found_answer(NO_EVIDENCE_REASON, request.mode)
        elif request.mode is Mode.EXTRACTIVE:
            yield extractive_answer(request.facts, self.settings.narrator_extractive_facts)
        else:
            async for event in self._llm_events(request):
                yield event

    async def _llm_events(self, request: NarrationInput) -> AsyncIterator[Event]:
        settings = self.settings
        messages = build_messages(
            request.query,
            request.sources,
            request.facts,
            request.history,
            fact_chars=settings.narrator_prompt_fact_chars,
            history_chars=settings.narrator_history_prompt_chars,
        )
        parts: list[str] = []
        visible = VisibleText()
        gate = RepeatGate()
        loop_watch = LoopWatch()
        looped = False
        try:
            async with contextlib.aclosing(self._stream(messages, request.max_tokens)) as stream:
                async for chunk in stream:
                    parts.append(chunk)
                    text = gate.feed(visible.feed(chunk))
                    if text:
                        yield text
                    if loop_watch.feed(chunk):
                        metrics.LOOPS_STOPPED.inc()
                        looped = True
                        break
        except LLMError as exc:
            yield self._fallback(request, exc.reason, exc.message)
            return
        tail = gate.feed(visible.flush()) + gate.flush()
        if tail:
            yield tail
        if gate.found:
            metrics.DEGENERATE_HELD_BACK.inc(len(gate.found))
        yield await self._verified(request, "".join(parts), looped)

    async def _stream(self, messages: Messages, max_tokens: int) -> AsyncGenerator[str, None]:
        """The LLM's deltas under the inbound deadline; every failure, a deadline or a broken
        stream included, surfaces as LLMError."""
        budget = remaining_budget(self.settings.llm_timeout_s) - FINAL_ANSWER_MARGIN_S
        if budget <= 0:
            raise LLMError("deadline", "no time left for the LLM")
        deadline = asyncio.get_running_loop().time() + budget
        stream = self.llm.stream(messages, max_tokens=max_tokens, timeout=budget)
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        chunk = await anext(stream)
                except StopAsyncIteration:
                    return
                except TimeoutError as exc:
                    raise LLMError("deadline", f"no complete answer within {budget:.1f}s") from exc
                except LLMError:
                    raise
                except Exception as exc:
                    # The caller is owed an answer even when the client misbehaves.
                    log.exception("llm stream failed")
                    raise LLMError("error", f"the LLM stream failed ({type(exc).__name__})") from exc
                yield chunk
        finally:
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()

    async def _verified(self, request: NarrationInput, reply: str, looped: bool) -> Answer:
        settings = self.settings
        result = verify(
            reply,
            len(request.sources),
            support_texts(request.facts),
            settings.narrator_min_support,
            settings.narrator_bind_support,
            looped=looped,
        )
        if not result.sentences:
            if result.not_found:
                return not_found_answer(MODEL_NOT_FOUND_REASON, Mode.LLM, result.rejected)
            # Evidence exists: an unusable reply is the model's failure, not "the documents do not say".
            message = NO_VERIFIABLE_SENTENCE if result.rejected else "empty reply"
            return self._fallback(request, "invalid_output", message, result.rejected)
        answer = Answer(
            text=" ".join(s.text for s in result.sentences),
            sentences=result.sentences,
            mode=Mode.LLM,
            answered=True,
            rejected=result.rejected,
        )
        return dataclasses.replace(answer, contradictions=await self._contradictions(request, answer.cited))

    async def _contradictions(self, request: NarrationInput, cited: list[int]) -> list[Contradiction]:
        settings = self.settings
        if not settings.narrator_contradictions or len(cited) < 2:
            return []
        timeout = remaining_budget(settings.llm_timeout_s) - FINAL_ANSWER_MARGIN_S
        if timeout < MIN_CONTRADICTION_BUDGET_S:
            metrics.CONTRADICTION_CHECKS.labels("skipped").inc()
            return []
        facts = prompt_facts(
            [f for f in request.facts if f.source in cited], settings.narrator_prompt_fact_chars
        )
        found = await find_contradictions(
            self.llm, request.query, request.sources, facts, cited, timeout=timeout
        )
        metrics.CONTRADICTION_CHECKS.labels("found" if found else "none").inc()
        return found

    def _fallback(
        self, request: NarrationInput, reason: str, message: str, rejected: list[Rejection] | None = None
    ) -> Answer:
        metrics.FALLBACKS.labels(reason).inc()
        log.warning("llm answer unusable, answering extractively", extra={"reason": reason, "error": message})
        return extractive_answer(
            request.facts,
            self.settings.narrator_extractive_facts,
            degraded_reason=f"{reason}: {message}",
            rejected=rejected,
        )


def record(answer: Answer, started: float) -> None:
    metrics.ANSWERS.labels(answer.mode.value, str(answer.answered).lower()).inc()
    for rejection in answer.rejected:
        metrics.SENTENCES_REJECTED.labels(rejection.reason.value).inc()
    metrics.REQUEST_SECONDS.labels(answer.mode.value).observe(time.monotonic() - started)
