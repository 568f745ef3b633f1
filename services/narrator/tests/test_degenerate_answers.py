"""Degenerate generation in the narrator's answers: a sentence in which a phrase loops is dropped
(reason "degenerate") and the rest of the answer stands; a reply with nothing else left falls
back to the extractive answer like any unverifiable one; the loop is held back from the stream;
sentences looping together, and the sentence a looping reply was stopped in, go too. The
scripted LLM writes sentences that cite their source and share its words, which the lexical
support check alone passes."""

from __future__ import annotations

import re

from prometheus_client import REGISTRY

from meshkit.text.answering import coverage, strip_citations
from services.narrator.model import Answer, Mode, RejectReason
from services.narrator.narrate import Event, Narrator
from services.narrator.tests.fakes import FACTS, FakeLLM, StreamStep, narration
from services.narrator.tests.test_narrate import settings
from services.narrator.tests.test_service import Server, request, script, server, split, stream_events
from services.narrator.verify import support_texts, verify

__all__ = ["server"]  # the gRPC server fixture, shared with test_service

GOOD = "The Eiffel Tower is 330 metres tall [1]."
LOOPING = "It stands in Paris as a high-end, high-end, high-end, high-end landmark [2]."
MIN_SUPPORT = 0.5


async def run(*steps: StreamStep) -> tuple[list[str], Answer]:
    llm = FakeLLM(streams=[list(steps)])
    events: list[Event] = [e async for e in Narrator(settings(), llm).narrate(narration())]
    *deltas, answer = events
    assert isinstance(answer, Answer)
    return [d for d in deltas if isinstance(d, str)], answer


def reasons(answer: Answer) -> list[tuple[str, RejectReason]]:
    return [(r.text, r.reason) for r in answer.rejected]


def rejected_total(reason: str) -> float:
    labels = {"reason": reason}
    return REGISTRY.get_sample_value("ragmesh_narrator_sentences_rejected_total", labels) or 0.0


def tokens_like_a_model(text: str) -> list[str]:
    """``text`` in deltas the way a model streams it: a word (with the space before it) or a
    punctuation mark at a time."""
    return re.findall(r"\s*\w+|\s*[^\w\s]", text)


def test_the_looping_sentence_would_pass_the_support_check_alone() -> None:
    share = coverage(strip_citations(LOOPING), support_texts(FACTS)[2])
    assert share >= MIN_SUPPORT


async def test_a_looping_sentence_is_dropped_and_the_rest_of_the_answer_stands() -> None:
    before = rejected_total("degenerate")
    deltas, answer = await run(
        f"{GOOD} ", "It stands in Paris as a high-end, ", LOOPING.split("high-end, ", 1)[1]
    )
    assert answer.text == GOOD
    assert answer.mode is Mode.LLM and answer.answered and answer.degraded_reason == ""
    assert reasons(answer) == [(LOOPING, RejectReason.DEGENERATE)]
    # The stream showed the first copy and none of the loop.
    shown = "".join(deltas)
    assert shown.startswith(f"{GOOD} It stands in Paris as a high-end,") and shown.count("high-end") == 1
    assert rejected_total("degenerate") == before + 1


async def test_a_loop_streamed_token_by_token_is_held_back_before_it_is_shown() -> None:
    held_before = REGISTRY.get_sample_value("ragmesh_narrator_degenerate_held_back_total") or 0.0
    deltas, answer = await run(*tokens_like_a_model(f"{GOOD} {LOOPING}"))
    assert answer.text == GOOD and reasons(answer) == [(LOOPING, RejectReason.DEGENERATE)]
    shown = "".join(deltas)
    assert "high-end, high" not in shown and shown.count("high-end") == 1
    assert REGISTRY.get_sample_value("ragmesh_narrator_degenerate_held_back_total") == held_before + 1


async def test_a_reply_that_is_all_loop_falls_back_to_the_extractive_answer() -> None:
    deltas, answer = await run("The Eiffel Tower is a tall, tall, tall, tall tower [1].")
    assert answer.mode is Mode.EXTRACTIVE and answer.answered
    assert answer.degraded_reason == "invalid_output: no verifiable sentence"
    assert answer.text.startswith(GOOD)
    assert [r.reason for r in answer.rejected] == [RejectReason.DEGENERATE]
    assert "tall, tall" not in "".join(deltas)


async def test_the_sentence_a_looping_reply_was_stopped_in_is_dropped() -> None:
    # A clause too long to count within MAX_PERIOD tokens: the loop watch stops the reply
    # mid-way through its second copy, and that unfinished sentence is the loop.
    clause = "the Eiffel Tower is 330 metres tall and was completed in 1889 and stands in Paris and "
    llm = FakeLLM(streams=[[f"{GOOD} ", "It is said that ", *([clause] * 6)]])
    answer = await Narrator(settings(), llm).answer(narration())
    assert answer.text == GOOD
    assert [r.reason for r in answer.rejected] == [RejectReason.DEGENERATE]
    assert llm.stream_closed == 1


async def test_a_reply_saying_one_sentence_over_and_over_is_repeated_not_degenerate() -> None:
    # The loop watch stops it mid-way through a copy: that unfinished copy is a repeat too.
    llm = FakeLLM(streams=[tokens_like_a_model(f"{GOOD} " * 8)])
    answer = await Narrator(settings(), llm).answer(narration())
    assert answer.text == GOOD and answer.rejected
    assert {r.reason for r in answer.rejected} == {RejectReason.REPEATED}
    assert llm.stream_closed == 1


def test_sentences_looping_together_are_dropped_past_the_first_copy() -> None:
    reply = (
        "The Eiffel Tower is 330 metres tall [1]. Tower is 330 metres tall, tower is 330 [1]. "
        "Metres tall, tower is 330 metres tall [1]. It was completed in 1889 [1]."
    )
    result = verify(reply, 3, support_texts(FACTS), MIN_SUPPORT, 0.6)
    assert [s.text for s in result.sentences] == [GOOD, "It was completed in 1889 [1]."]
    assert [(r.text, r.reason) for r in result.rejected] == [
        ("Tower is 330 metres tall, tower is 330 [1].", RejectReason.DEGENERATE),
        ("Metres tall, tower is 330 metres tall [1].", RejectReason.DEGENERATE),
    ]


def test_an_unfinished_last_sentence_is_kept_when_the_reply_did_not_loop() -> None:
    reply = f"{GOOD} It was completed in 1889 [1]"
    for looped, kept in ((False, 2), (True, 1)):
        result = verify(reply, 3, support_texts(FACTS), MIN_SUPPORT, 0.6, looped=looped)
        assert len(result.sentences) == kept


async def test_the_unary_call_reports_the_degenerate_sentence(server: Server) -> None:
    script(server, f"{GOOD} {LOOPING}")
    answer = (await server.stub.Narrate(request())).answer
    assert answer.text == GOOD and answer.answered and answer.degraded_reason == ""
    assert [(r.text, r.reason) for r in answer.rejected] == [(LOOPING, "degenerate")]


async def test_the_stream_reports_it_and_shows_no_loop(server: Server) -> None:
    script(server, *tokens_like_a_model(f"{GOOD} {LOOPING}"))
    deltas, answer = split(await stream_events(server, request()))
    assert answer.text == GOOD
    assert [r.reason for r in answer.rejected] == ["degenerate"]
    assert "".join(deltas).count("high-end") == 1
