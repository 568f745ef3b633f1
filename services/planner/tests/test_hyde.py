from __future__ import annotations

import json

import pytest

from meshkit.llm.factory import LLMError
from services.planner.deterministic import DeterministicPlanner, PoolSizes
from services.planner.hyde import (
    HYDE_MAX_TOKENS,
    MAX_PASSAGE_CHARS,
    HydeWriter,
    WithHyde,
    on_topic,
    resolve_hyde_mode,
    trim_passage,
)
from services.planner.llm import LLMPlanner
from services.planner.plan import HydeMode, PlanInput

from .conftest import FakeLLM

DETERMINISTIC = DeterministicPlanner(PoolSizes(precise=50, exhaustive=80), max_keywords=4)
QUERY = "How do I rotate the TLS certificates?"
PASSAGE = "Certificates are rotated with the renew command. The proxy reloads them without downtime."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PASSAGE, PASSAGE),
        ("  Passage: " + PASSAGE + " A third sentence.", PASSAGE),
        ('"Certificates are rotated weekly."', "Certificates are rotated weekly."),
        ("Certificates are rotated weekly. The proxy then rel", "Certificates are rotated weekly."),
        ("A single unfinished sentence", "A single unfinished sentence"),
        ("Line one\n\nstill line one.", "Line one still line one."),
        ("   ", ""),
        ("Answer:", ""),
    ],
)
def test_trim_passage(text: str, expected: str) -> None:
    assert trim_passage(text) == expected


def test_trim_passage_bounds_the_length() -> None:
    passage = trim_passage("word " * 200 + ".")
    assert 0 < len(passage) <= MAX_PASSAGE_CHARS
    assert passage.endswith("word")


@pytest.mark.parametrize(
    ("requested", "default", "configured", "expected"),
    [
        (None, "supplement", True, HydeMode.SUPPLEMENT),
        (HydeMode.FUSION, "supplement", True, HydeMode.FUSION),
        (HydeMode.OFF, "fusion", True, HydeMode.OFF),
        (HydeMode.FUSION, "fusion", False, HydeMode.OFF),
        (None, "off", True, HydeMode.OFF),
    ],
)
def test_resolve_hyde_mode(
    requested: HydeMode | None, default: str, configured: bool, expected: HydeMode
) -> None:
    assert resolve_hyde_mode(requested, default, configured) is expected


async def test_writer_asks_briefly_and_trims() -> None:
    llm = FakeLLM(chat_reply=PASSAGE + " And more.")
    assert await HydeWriter(llm, timeout_s=4.0).write(QUERY) == PASSAGE
    (call,) = llm.calls
    assert (call.kind, call.max_tokens, call.timeout) == ("chat", HYDE_MAX_TOKENS, 4.0)
    assert QUERY in call.prompt


@pytest.mark.parametrize("text", [" \n", "A short answer, 1-2 sentences."])
async def test_writer_rejects_an_empty_or_off_topic_passage(text: str) -> None:
    with pytest.raises(LLMError) as caught:
        await HydeWriter(FakeLLM(chat_reply=text), timeout_s=4.0).write(QUERY)
    assert caught.value.reason == "invalid_output"


@pytest.mark.parametrize(
    ("text", "query", "expected"),
    [
        ("Metformin can upset the stomach.", "What are the side effects of metformin?", True),
        ("exhaustive", "What are the side effects of metformin?", False),
        ("anything at all", "What is it?", True),
    ],
)
def test_on_topic(text: str, query: str, expected: bool) -> None:
    assert on_topic(text, query) is expected


def with_hyde(llm: FakeLLM, llm_planner: bool = False) -> WithHyde:
    inner = LLMPlanner(llm, DETERMINISTIC, 4, 8.0) if llm_planner else DETERMINISTIC
    return WithHyde(inner, HydeWriter(llm, timeout_s=8.0))


def request(mode: HydeMode) -> PlanInput:
    return PlanInput(QUERY, None, 3, mode)


async def test_deterministic_fusion_gets_a_passage_from_the_llm() -> None:
    llm = FakeLLM(chat_reply=PASSAGE)
    plan = await with_hyde(llm).plan(request(HydeMode.FUSION))
    assert (plan.planner, plan.hyde_mode, plan.hyde_passage) == ("deterministic", HydeMode.FUSION, PASSAGE)


async def test_supplement_and_off_make_no_llm_call() -> None:
    llm = FakeLLM(chat_reply=PASSAGE)
    supplement = await with_hyde(llm).plan(request(HydeMode.SUPPLEMENT))
    off = await with_hyde(llm).plan(request(HydeMode.OFF))
    assert (supplement.hyde_mode, supplement.hyde_passage) == (HydeMode.SUPPLEMENT, "")
    assert (off.hyde_mode, off.hyde_passage) == (HydeMode.OFF, "")
    assert llm.calls == []


async def test_fusion_without_a_passage_says_off() -> None:
    plan = await with_hyde(FakeLLM(chat_reply=LLMError("error", "HTTP 400"))).plan(request(HydeMode.FUSION))
    assert (plan.hyde_mode, plan.hyde_passage) == (HydeMode.OFF, "")


async def test_the_llm_plan_passage_is_used_without_a_second_call() -> None:
    reply = {"strategy": "precise", "variations": [], "keywords": [], "hyde": PASSAGE}
    llm = FakeLLM(json.dumps(reply), chat_reply="unused")
    plan = await with_hyde(llm, llm_planner=True).plan(request(HydeMode.FUSION))
    assert (plan.planner, plan.hyde_mode, plan.hyde_passage) == ("llm", HydeMode.FUSION, PASSAGE)
    assert llm.kinds() == ["structured"]


async def test_a_bad_llm_plan_still_gets_a_passage_from_a_plain_call() -> None:
    llm = FakeLLM("not json", chat_reply=PASSAGE)
    plan = await with_hyde(llm, llm_planner=True).plan(request(HydeMode.FUSION))
    assert plan.fallback is not None and plan.fallback.reason == "invalid_output"
    assert (plan.hyde_mode, plan.hyde_passage) == (HydeMode.FUSION, PASSAGE)
    assert llm.kinds() == ["structured", "chat"]
    assert llm.calls[1].timeout is not None and llm.calls[1].timeout <= 8.0


async def test_an_unreachable_llm_is_not_asked_twice() -> None:
    llm = FakeLLM(LLMError("unavailable", "connection refused"), chat_reply=PASSAGE)
    plan = await with_hyde(llm, llm_planner=True).plan(request(HydeMode.FUSION))
    assert plan.fallback is not None and plan.fallback.reason == "unavailable"
    assert (plan.planner, plan.hyde_mode, plan.hyde_passage) == ("deterministic", HydeMode.OFF, "")
    assert llm.kinds() == ["structured"]
