"""Answer text helpers (meshkit.text.answering) and LLM reply parsing (meshkit.llm.replies) on hostile text:
the same results as the patterns they replaced (kept here as oracles), in linear time.

Passages are indexed documents, replies come from a model: both are untrusted, and a quadratic
step there holds the GIL of a gateway, extractor or narrator process for as long as it runs."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshkit.llm import replies as llm_replies
from meshkit.llm.factory import LLMError
from meshkit.llm.openai_compat import OpenAICompatibleLLM
from meshkit.llm.replies import extract_json
from meshkit.text import answering
from meshkit.text.answering import CITATION, cited_numbers, content_words, split_sentences, strip_citations

from .test_llm import MESSAGES, Answer, FakeServer, Handler, completion, connect

__all__ = ["connect"]  # the fixture, used by name

MEGABYTE = 1_000_000
# The linear code needs milliseconds; the old patterns needed hours for a megabyte.
BOUND_S = 10.0

# --- the replaced code, as oracles -----------------------------------------------------------


def old_split_sentences(text: str) -> list[str]:
    out: list[str] = []
    for paragraph in answering._PARAGRAPH_BREAK.split(text):
        pieces: list[str] = []
        start = 0
        for match in answering._SENTENCE_END.finditer(paragraph):
            candidate = paragraph[start : match.end()]
            if answering._NO_SPLIT_BEFORE.search(paragraph[start : match.start()]):
                continue
            pieces.append(candidate)
            start = match.end()
        pieces.append(paragraph[start:])
        out += [" ".join(p.split()) for p in pieces if p.strip()]
    return out


def old_strip_citations(sentence: str) -> str:
    return re.sub(r"\s*" + CITATION.pattern, "", sentence).strip()


OLD_FENCE = re.compile(r"```[a-zA-Z]*\s*(.*?)```", re.DOTALL)


def old_extract_json(text: str) -> Any:
    candidates = [text.strip()]
    fence = OLD_FENCE.search(text)
    if fence:
        candidates.append(fence.group(1).strip())
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            pass
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        return value
    raise ValueError("no JSON object in the reply")


def outcome(fn: Callable[[str], Any], text: str) -> Any:
    try:
        return ("ok", fn(text))
    except ValueError:
        return ("error",)


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


SENTENCE_PIECES = [
    ".",
    " ",
    "!",
    "?",
    "[1]",
    "[2, 3]",
    "\n",
    "\n\n",
    '"',
    ")",
    "A",
    "b",
    "e.g",
    "Dr",
    "Fig",
    "et al",
]
SENTENCE_PIECES += ["No", "approx", "ca", "x", "\u3000", "[", "]", ","]
JSON_PIECES = ["{", "}", '"', ":", "1", "[", "]", "`", "```", "json", " ", "\n", ",", "a", '"a"', "null"]


def pieces(alphabet: list[str], max_size: int) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(alphabet), max_size=max_size).map("".join)


# --- same results ------------------------------------------------------------------------------


@settings(max_examples=800, deadline=None)
@given(pieces(SENTENCE_PIECES, 30))
def test_sentences_and_citations_match_the_old_patterns(text: str) -> None:
    assert split_sentences(text) == old_split_sentences(text)
    assert strip_citations(text) == old_strip_citations(text)


@settings(max_examples=800, deadline=None)
@given(pieces(JSON_PIECES, 25))
def test_extract_json_matches_the_old_parser(text: str) -> None:
    assert outcome(extract_json, text) == outcome(old_extract_json, text)
    fence = OLD_FENCE.search(text)
    block = llm_replies._fenced_block(text)
    assert (block.strip() if block is not None else None) == (fence.group(1).strip() if fence else None)


# --- hostile inputs ------------------------------------------------------------------------------


def test_a_megabyte_of_abbreviations_is_split_in_linear_time() -> None:
    # Every candidate end follows an abbreviation, so none splits: the old code re-searched the
    # whole sentence so far at each one.
    sentences, took = timed(split_sentences, "Dr. X " * (MEGABYTE // 6))
    assert took < BOUND_S
    assert len(sentences) == 1
    assert split_sentences("Dr. Smith met Dr. Jones. " * 2) == ["Dr. Smith met Dr. Jones."] * 2


def test_citations_next_to_a_megabyte_space_run_strip_in_linear_time() -> None:
    text = "a" + " " * MEGABYTE + "b [1]" + "\t" * MEGABYTE + "c"
    stripped, took = timed(strip_citations, text)
    assert took < BOUND_S
    assert stripped == "a" + " " * MEGABYTE + "b" + "\t" * MEGABYTE + "c"


@pytest.mark.parametrize(
    "text",
    [
        "." * MEGABYTE,
        "! " * (MEGABYTE // 2),
        ". [1]" * (MEGABYTE // 5) + " x",
        "[1, " * (MEGABYTE // 4),
        "\n \n" * (MEGABYTE // 3),
        "e.g. " * (MEGABYTE // 5),
        "A. " * (MEGABYTE // 3),
    ],
)
def test_sentence_helpers_take_linear_time_on_runs(text: str) -> None:
    started = time.perf_counter()
    split_sentences(text)
    strip_citations(text)
    cited_numbers(text)
    content_words(text)
    assert time.perf_counter() - started < BOUND_S


@pytest.mark.parametrize(
    "reply",
    [
        "```" + " " * MEGABYTE,
        "```json" + "\n" * MEGABYTE + "x",
        "```" + "a" * MEGABYTE,
        "``` " * (MEGABYTE // 4),
    ],
)
def test_an_unclosed_fence_is_read_in_linear_time(reply: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ValueError):
        extract_json(reply)
    assert time.perf_counter() - started < BOUND_S


@pytest.mark.parametrize(
    "reply",
    ["[" * 100_000, '{"a":' * 100_000, "```json\n" + "[" * 100_000 + "```", "prose {" + '"a":[' * 100_000],
)
def test_deeply_nested_json_is_no_json_rather_than_a_crash(reply: str) -> None:
    # json's parser raises RecursionError past the interpreter's depth; that is "no JSON" too.
    with pytest.raises(ValueError):
        extract_json(reply)


def test_embedded_object_search_has_a_linear_budget() -> None:
    # Every '{' starts a parse that reads to the end of the reply: the budget stops the tries.
    reply = '{"a":' * 800 + '"' + "x" * MEGABYTE
    started = time.perf_counter()
    with pytest.raises(ValueError):
        extract_json(reply)
    assert time.perf_counter() - started < 0.25
    # Within the budget the first object that parses is still found.
    assert extract_json("{oops " * 1000 + '{"ok": 1} {"later": 2}') == {"ok": 1}


def raw(body: bytes, content_type: str = "application/json") -> Handler:
    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, content=body)

    return respond


DEEP = b"[" * 100_000


async def test_a_deeply_nested_reply_is_invalid_output_not_a_crash(
    connect: Callable[..., OpenAICompatibleLLM],
) -> None:
    with pytest.raises(LLMError) as caught:
        await connect(FakeServer(completion(DEEP.decode()))).structured(MESSAGES, Answer)
    assert caught.value.reason == "invalid_output"


async def test_a_deeply_nested_completion_body_is_a_clean_llm_error(
    connect: Callable[..., OpenAICompatibleLLM],
) -> None:
    with pytest.raises(LLMError) as caught:
        await connect(FakeServer(raw(DEEP))).chat(MESSAGES)
    assert caught.value.reason == "error"


async def test_a_deeply_nested_stream_event_is_a_clean_llm_error(
    connect: Callable[..., OpenAICompatibleLLM],
) -> None:
    server = FakeServer(raw(b"data: " + DEEP + b"\n\ndata: [DONE]\n\n", "text/event-stream"))
    with pytest.raises(LLMError) as caught:
        async for _ in connect(server).stream(MESSAGES):
            pass
    assert caught.value.reason == "error"
