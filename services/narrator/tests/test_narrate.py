"""The pipeline with a scripted LLM: streaming, verification, fallbacks, not found."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import REGISTRY

from meshkit.llm.factory import LLMError
from meshkit.settings import NarratorSettings
from meshkit.text.answering import NOT_FOUND_PHRASE
from services.narrator.model import (
    Answer,
    Fact,
    Mode,
    NarrationInput,
    RejectReason,
    Role,
    Turn,
)
from services.narrator.narrate import Event, Narrator, looping
from services.narrator.tests.fakes import FakeLLM, Pause, StreamStep, narration, unavailable

GOOD_REPLY: list[StreamStep] = [
    "The Eiffel Tower is ",
    "330 metres tall [1]. ",
    "It was completed in 1889 [1].",
]

TWO_SOURCES = "The Eiffel Tower is 330 metres tall [1]. Another source says 300 metres tall [3]."


def settings(**overrides: object) -> NarratorSettings:
    base = NarratorSettings(log_format="text", llm_timeout_s=5.0, narrator_min_support=0.5)
    return base.model_copy(update=overrides)


async def run(
    llm: FakeLLM, request: NarrationInput | None = None, **overrides: object
) -> tuple[list[str], Answer]:
    events: list[Event] = [
        e async for e in Narrator(settings(**overrides), llm).narrate(request or narration())
    ]
    *deltas, answer = events
    assert all(isinstance(d, str) for d in deltas), "the answer must be the last event, and only once"
    assert isinstance(answer, Answer)
    return [d for d in deltas if isinstance(d, str)], answer


def streaming(*scripts: Sequence[StreamStep]) -> FakeLLM:
    return FakeLLM(streams=list(scripts))


async def test_the_llm_answer_streams_then_comes_back_verified() -> None:
    llm = streaming(GOOD_REPLY)
    deltas, answer = await run(llm)
    assert deltas == GOOD_REPLY
    assert answer.text == "The Eiffel Tower is 330 metres tall [1]. It was completed in 1889 [1]."
    assert answer.mode is Mode.LLM and answer.answered and answer.degraded_reason == ""
    assert answer.cited == [1]
    call = llm.stream_calls[0]
    assert call["max_tokens"] == 300 and 0 < call["timeout"] <= 5.0
    # One source cited: no contradiction check.
    assert llm.structured_calls == []


async def test_dropped_sentences_are_reported_next_to_the_kept_ones() -> None:
    reply = "The Eiffel Tower is 330 metres tall [1]. Paris is lovely. It is 330 metres tall [7]."
    _, answer = await run(streaming([reply]))
    assert answer.text == "The Eiffel Tower is 330 metres tall [1]."
    assert [r.reason for r in answer.rejected] == [RejectReason.UNCITED, RejectReason.UNKNOWN_SOURCE]


async def test_think_blocks_are_not_streamed() -> None:
    deltas, answer = await run(
        streaming(
            [
                "<think>Height?</think>",
                "<answer>The Eiffel Tower is 330 ",
                "metres tall [1].</answer> I fixed the citations.",
            ]
        )
    )
    assert "".join(deltas) == "The Eiffel Tower is 330 metres tall [1]."
    assert answer.text == "The Eiffel Tower is 330 metres tall [1]."


async def test_no_facts_means_not_found_without_asking_the_llm() -> None:
    llm = streaming()
    deltas, answer = await run(llm, narration(facts=[]))
    assert not answer.answered and answer.text.startswith(NOT_FOUND_PHRASE)
    assert answer.text == "The documents do not say: none of the retrieved passages addresses this question."
    assert deltas == [answer.text] and answer.sentences == [] and answer.cited == []
    assert llm.stream_calls == []


async def test_the_model_marker_means_not_found() -> None:
    deltas, answer = await run(streaming(["NOT_IN_", "DOCUMENTS"]))
    # Deltas are the model's text as written; the final answer is what counts.
    assert deltas == ["NOT_IN_", "DOCUMENTS"]
    assert not answer.answered and answer.mode is Mode.LLM
    assert answer.text.startswith(NOT_FOUND_PHRASE + ":") and answer.degraded_reason == ""
    assert answer.rejected == []


async def test_all_sentences_dropped_falls_back_to_extractive_not_to_not_found() -> None:
    deltas, answer = await run(streaming(["Bananas are yellow. Paris has cafes [9]."]))
    assert deltas == ["Bananas are yellow. Paris has cafes [9]."]
    assert answer.answered and answer.mode is Mode.EXTRACTIVE
    assert answer.degraded_reason == "invalid_output: no verifiable sentence"
    assert answer.text.startswith("The Eiffel Tower is 330 metres tall [1].")
    assert [r.reason for r in answer.rejected] == [RejectReason.UNCITED, RejectReason.UNKNOWN_SOURCE]


async def test_an_empty_reply_falls_back_to_extractive() -> None:
    _, answer = await run(streaming(["  "]))
    assert answer.mode is Mode.EXTRACTIVE and answer.degraded_reason == "invalid_output: empty reply"


async def test_an_llm_error_before_the_first_token_answers_extractively() -> None:
    before = REGISTRY.get_sample_value("ragmesh_narrator_fallbacks_total", {"reason": "unavailable"}) or 0.0
    deltas, answer = await run(streaming([unavailable()]), narrator_extractive_facts=2)
    assert answer.mode is Mode.EXTRACTIVE and answer.answered
    assert answer.degraded_reason == "unavailable: connection refused"
    assert answer.text == (
        "The Eiffel Tower is 330 metres tall [1]. The Eiffel Tower stands in Paris on the Champ de Mars [2]."
    )
    # Nothing was streamed: the answer's text comes as the one delta.
    assert deltas == [answer.text]
    after = REGISTRY.get_sample_value("ragmesh_narrator_fallbacks_total", {"reason": "unavailable"})
    assert after == before + 1


async def test_a_stream_breaking_midway_still_ends_with_an_extractive_answer() -> None:
    llm = streaming(
        ["The Eiffel Tower ", "is 330", LLMError("unavailable", "the stream ended before [DONE]")]
    )
    deltas, answer = await run(llm)
    assert deltas == ["The Eiffel Tower ", "is 330"]
    assert answer.mode is Mode.EXTRACTIVE
    assert answer.degraded_reason == "unavailable: the stream ended before [DONE]"
    assert llm.stream_closed == 1


async def test_an_unexpected_client_error_is_an_extractive_answer_too() -> None:
    _, answer = await run(streaming(["Partial ", RuntimeError("boom")]))
    assert answer.mode is Mode.EXTRACTIVE and answer.degraded_reason.startswith("error: ")
    # The reason reaches the caller: it names the kind of failure, not the exception's text.
    assert "RuntimeError" in answer.degraded_reason and "boom" not in answer.degraded_reason


async def test_a_hung_stream_is_cut_at_the_deadline() -> None:
    llm = streaming(["The Eiffel Tower ", Pause(30)])
    deltas, answer = await run(llm, llm_timeout_s=0.5)
    assert deltas == ["The Eiffel Tower "]
    assert answer.mode is Mode.EXTRACTIVE and answer.degraded_reason.startswith("deadline: ")
    assert llm.stream_closed == 1


async def test_extractive_mode_streams_its_text_once() -> None:
    llm = streaming()
    deltas, answer = await run(llm, narration(mode=Mode.EXTRACTIVE))
    assert deltas == [answer.text]
    assert answer.mode is Mode.EXTRACTIVE and answer.degraded_reason == "" and answer.answered
    assert llm.stream_calls == [] and llm.structured_calls == []


async def test_contradictions_are_checked_when_two_sources_are_cited() -> None:
    reply: list[StreamStep] = [TWO_SOURCES]
    conflict = {"contradictions": [{"source_a": 1, "source_b": 3, "description": "330 m vs 300 m"}]}
    llm = FakeLLM(streams=[reply], structured=[conflict])
    _, answer = await run(llm)
    assert answer.cited == [1, 3]
    assert [(c.description, c.sources) for c in answer.contradictions] == [("330 m vs 300 m", (1, 3))]


async def test_contradictions_fail_quietly_and_can_be_turned_off() -> None:
    reply: list[StreamStep] = [TWO_SOURCES]
    _, answer = await run(FakeLLM(streams=[reply], structured=[unavailable()]))
    assert answer.answered and answer.contradictions == [] and answer.mode is Mode.LLM
    llm = FakeLLM(streams=[reply])
    _, answer = await run(llm, narrator_contradictions=False)
    assert llm.structured_calls == []


async def test_contradictions_are_skipped_when_little_time_is_left() -> None:
    reply: list[StreamStep] = [TWO_SOURCES]
    llm = FakeLLM(streams=[reply])
    _, answer = await run(llm, llm_timeout_s=0.9)
    assert answer.answered and llm.structured_calls == []


async def test_history_reaches_the_prompt_trimmed() -> None:
    history = [Turn(Role.USER, "old " * 100), Turn(Role.USER, "What is the Eiffel Tower?")]
    llm = streaming(GOOD_REPLY)
    await run(llm, narration(history=history), narrator_history_prompt_chars=60)
    prompt = llm.stream_calls[0]["messages"][-1]["content"]
    assert "User: What is the Eiffel Tower?" in prompt and "old old" not in prompt


async def test_facts_with_only_markers_are_not_an_answer() -> None:
    _, answer = await run(streaming(), narration(facts=[Fact("[1]", 1, 1.0)], mode=Mode.EXTRACTIVE))
    assert not answer.answered and answer.text.startswith(NOT_FOUND_PHRASE)


def test_looping_spots_a_reply_repeating_itself() -> None:
    sentence = "Vitamin D supplementation reduces the risk of fractures [1] "
    assert not looping(sentence)
    assert looping(sentence * 4)
    assert not looping("".join(f"Distinct sentence number {i} about towers [1]. " for i in range(8)))


async def test_a_looping_answer_is_stopped_and_verified_once() -> None:
    loop = ["The Eiffel Tower is 330 metres tall [1]. "] * 40
    llm = streaming(loop)
    deltas, answer = await run(llm)
    assert len(deltas) < 10 and llm.stream_closed == 1
    assert answer.text == "The Eiffel Tower is 330 metres tall [1]."
    assert answer.mode is Mode.LLM
