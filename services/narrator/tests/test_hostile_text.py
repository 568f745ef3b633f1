"""The narrator's handling of a model's reply on hostile text: envelope stripping, the streamed
visible text, citation placement, loop detection and verification give what the replaced code
gave (kept here as oracles) and take linear time. A reply is untrusted: a misbehaving model or
LLM server can send anything, and a quadratic step holds the narrator's GIL."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshkit.settings import NarratorSettings
from meshkit.text.answering import strip_citations
from services.narrator import envelope, narrate, verify
from services.narrator.envelope import VisibleText, clean_output
from services.narrator.model import Answer
from services.narrator.narrate import LOOP_MIN_CHARS, LOOP_WINDOW, Narrator
from services.narrator.tests.fakes import FACTS, FakeLLM, narration
from services.narrator.verify import support_texts, with_citation

MEGABYTE = 1_000_000
BOUND_S = 10.0

# --- the replaced code, as oracles -----------------------------------------------------------

OLD_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
OLD_END_PUNCTUATION = re.compile(r"([.!?]+[\"')\]]*)$")


def old_clean_output(text: str) -> str:
    text = OLD_THINK_BLOCK.sub("", text)
    ends = list(envelope._THINK_END.finditer(text))
    if ends:
        text = text[ends[-1].end() :]
    text = envelope._THINK_UNCLOSED.sub("", text)
    found = envelope._ANSWER.search(text)
    if found:
        text = found.group(1)
    return envelope._AFTER_ANSWER.sub("", text).strip()


class OldVisibleText(VisibleText):
    def feed(self, chunk: str) -> str:
        self._pending += chunk
        out: list[str] = []
        while self._pending and not self._closed:
            start = self._pending.find("<")
            if start < 0:
                self._show(out, self._pending)
                self._pending = ""
                break
            self._show(out, self._pending[:start])
            self._pending = self._pending[start:]
            head = self._pending.lower()
            tag = next((t for t in envelope._TAGS if head.startswith(t)), None)
            if tag is not None:
                self._pending = self._pending[len(tag) :]
                self._on_tag(tag)
            elif any(t.startswith(head) for t in envelope._TAGS):
                break
            else:
                self._show(out, "<")
                self._pending = self._pending[1:]
        if self._closed:
            self._pending = ""
        return "".join(out)


def old_with_citation(text: str, numbers: list[int]) -> str:
    body = strip_citations(text)
    end = OLD_END_PUNCTUATION.search(body)
    punctuation = end.group(1) if end else "."
    body = body[: end.start()].rstrip() if end else body
    return f"{body} [{', '.join(str(n) for n in numbers)}]{punctuation}"


def old_looping(text: str) -> bool:
    if len(text) < LOOP_MIN_CHARS:
        return False
    return text[-LOOP_WINDOW:] in text[:-LOOP_WINDOW]


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


TAG_PIECES = ["<think>", "</think>", "<THINK>", "<answer>", "</answer>", "</Answer>", "<th\u0131nk>"]
TAG_PIECES += ["<thi", "nk>", "<", ">", "x", " ", "\n", "\u0130", "<thin\u212a>"]


# --- same results ------------------------------------------------------------------------------


@settings(max_examples=800, deadline=None)
@given(st.lists(st.sampled_from(TAG_PIECES), max_size=20).map("".join), st.integers(1, 9))
def test_envelope_handling_matches_the_old_code(reply: str, step: int) -> None:
    assert clean_output(reply) == old_clean_output(reply)
    new, old = VisibleText(), OldVisibleText()
    for i in range(0, len(reply), step):
        chunk = reply[i : i + step]
        assert new.feed(chunk) == old.feed(chunk)
    assert new.flush() == old.flush()


@settings(max_examples=800, deadline=None)
@given(st.text(st.sampled_from(list(".!?\"')]a [1]\n")), max_size=25))
def test_citation_placement_matches_the_old_pattern(text: str) -> None:
    assert with_citation(text, [1, 2]) == old_with_citation(text, [1, 2])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.text(st.sampled_from(list("ab [1].")), max_size=70), max_size=30))
def test_loop_watch_matches_the_old_check_after_every_delta(deltas: list[str]) -> None:
    watch, reply = narrate.LoopWatch(), ""
    for delta in deltas:
        reply += delta
        assert watch.feed(delta) == old_looping(reply)


# --- hostile replies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        "<think>" * (MEGABYTE // 7),
        "<THINK>x" * (MEGABYTE // 8) + "</think>answer",
        "</think>" * (MEGABYTE // 8),
        "<answer>" * (MEGABYTE // 8),
    ],
)
def test_envelopes_are_stripped_in_linear_time(reply: str) -> None:
    _, took = timed(clean_output, reply)
    assert took < BOUND_S


@pytest.mark.parametrize("reply", ["<" * MEGABYTE, "<th" * (MEGABYTE // 3), "a<b" * (MEGABYTE // 3)])
@pytest.mark.parametrize("step", [MEGABYTE, 7])
def test_visible_text_of_a_reply_full_of_angle_brackets_takes_linear_time(reply: str, step: int) -> None:
    # In one delta (the old feed re-sliced the pending text at every '<') and in small ones.
    reply = reply if step == MEGABYTE else reply[: MEGABYTE // 4]
    visible = VisibleText()
    started = time.perf_counter()
    shown = "".join(visible.feed(reply[i : i + step]) for i in range(0, len(reply), step)) + visible.flush()
    assert time.perf_counter() - started < BOUND_S
    assert shown == reply


@pytest.mark.parametrize(
    "text", ["!" * MEGABYTE + "x", "." * MEGABYTE, "a" + ")" * MEGABYTE, "?)" * MEGABYTE]
)
def test_final_punctuation_is_found_in_linear_time(text: str) -> None:
    cited, took = timed(with_citation, text, [1])
    assert took < BOUND_S
    assert "[1]" in cited


def test_loop_watch_over_a_long_stream_takes_linear_time() -> None:
    deltas = [f"word{i} " for i in range(100_000)]
    watch = narrate.LoopWatch()
    started = time.perf_counter()
    assert not any(watch.feed(delta) for delta in deltas)
    assert time.perf_counter() - started < BOUND_S
    assert watch.feed(deltas[-20] + deltas[-19] + deltas[-18] + deltas[-17] + deltas[-16] + deltas[-15])


async def test_a_long_streamed_reply_is_watched_and_verified_in_linear_time() -> None:
    # 60k deltas, no loop: the old narrator re-joined and rescanned the whole reply per delta.
    deltas = [f"The tower is {i} metres tall [1]. " for i in range(60_000)]
    llm = FakeLLM(streams=[deltas])
    narrator = Narrator(NarratorSettings(log_format="text", llm_timeout_s=60.0), llm)
    started = time.perf_counter()
    events = [e async for e in narrator.narrate(narration())]
    # About 4 s here on a loaded machine; the old narrator took 160 s.
    assert time.perf_counter() - started < 1.5 * BOUND_S
    assert isinstance(events[-1], Answer)
    assert len(events) == len(deltas) + 1


@pytest.mark.parametrize(
    "reply",
    [
        "The Eiffel Tower is 330 metres tall [1]. " + " " * MEGABYTE + "x",
        "- " * (MEGABYTE // 2),
        "It is tall [1" + ", 1" * (MEGABYTE // 3),
        "NOT_IN_DOCUMENTS" + "!" * MEGABYTE,
        "Dr. " * (MEGABYTE // 4),
    ],
)
def test_verification_of_a_hostile_reply_takes_linear_time(reply: str) -> None:
    _, took = timed(verify.verify, reply, 3, support_texts(FACTS), 0.5, 0.6)
    assert took < BOUND_S
