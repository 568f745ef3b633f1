"""A narrator answer whose model looped (sentences dropped as "degenerate") reaches the caller of
Ask and AskStream as a typed degradation: stage narrator, reason DEGENERATE_OUTPUT, naming how
many sentences went and quoting the first, while the rest of the answer stands. Also the
contract end to end without servers: the real narrator's verification, its wire form, the
gateway's degradation and its wire form."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from grpc import aio

from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.narrator.v1 import narrator_pb2
from services.gateway import servicer
from services.gateway.answer.narrate import DEGENERATE_QUOTE_CHARS, NARRATOR, degenerate_output
from services.gateway.degradations import DEGENERATE_OUTPUT
from services.gateway.tests import conftest
from services.gateway.tests.conftest import COLLECTION, NARRATOR_DELTAS, running_gateway
from services.narrator.narrate import Narrator
from services.narrator.servicer import answer_to_pb
from services.narrator.tests.fakes import SOURCES, FakeLLM, narration
from services.narrator.tests.test_narrate import settings

LOOPING = "It is a high-end, high-end, high-end, high-end landmark [1]."
DEGENERATE = (gateway_pb2.STAGE_NARRATOR, gateway_pb2.DEGRADATION_REASON_DEGENERATE_OUTPUT)


class LoopingNarrator(conftest.FakeNarrator):
    """The fake narrator's answer, with a sentence it dropped because a phrase looped in it."""

    async def NarrateStream(self, request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        async for event in super().NarrateStream(request, context):
            if event.HasField("answer") and event.answer.answered:
                event.answer.rejected.append(narrator_pb2.Rejected(text=LOOPING, reason="degenerate"))
            yield event


@pytest.fixture
def looping_narrator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "FakeNarrator", LoopingNarrator)


def ask() -> gateway_pb2.AskRequest:
    return gateway_pb2.AskRequest(collection=COLLECTION, query="what is ZX-81?")


def answer_with(*rejected: tuple[str, str]) -> narrator_pb2.Answer:
    return narrator_pb2.Answer(
        text="Fine [1].",
        answered=True,
        rejected=[narrator_pb2.Rejected(text=t, reason=r) for t, r in rejected],
    )


def test_no_degenerate_sentence_no_degradation() -> None:
    assert degenerate_output(answer_with(("Paris is lovely.", "uncited")), "narrator:1") is None


def test_the_degradation_counts_the_sentences_and_quotes_the_first() -> None:
    long = "It is " + "high-end, " * 20 + "a landmark [1]."
    found = degenerate_output(answer_with((long, "degenerate"), (LOOPING, "degenerate")), "narrator:1")
    assert found is not None
    assert (found.stage, found.reason, found.target) == (NARRATOR, DEGENERATE_OUTPUT, "narrator:1")
    assert found.message.startswith("2 sentences of the answer dropped for a phrase looping")
    quoted = found.message.split(": ", 1)[1]
    assert quoted.startswith('"It is high-end, high-end,') and len(quoted) == DEGENERATE_QUOTE_CHARS + 2


@pytest.mark.usefixtures("looping_narrator")
async def test_ask_reports_the_dropped_loop_as_a_typed_degradation() -> None:
    async with running_gateway() as gateway:
        response = await gateway.stub.Ask(ask(), timeout=10)
    assert response.answered and response.answer == "".join(NARRATOR_DELTAS)
    [degradation] = response.degradations
    assert (degradation.stage, degradation.reason) == DEGENERATE
    assert (
        degradation.message
        == f'1 sentence of the answer dropped for a phrase looping (degenerate generation): "{LOOPING}"'
    )


@pytest.mark.usefixtures("looping_narrator")
async def test_ask_stream_reports_it_in_the_final_answer() -> None:
    async with running_gateway() as gateway:
        call = gateway.stub.AskStream(gateway_pb2.AskStreamRequest(request=ask()), timeout=10)
        events = [event async for event in call]
    final = events[-1].answer
    assert final.answered and [(d.stage, d.reason) for d in final.degradations] == [DEGENERATE]


async def test_the_narrators_verdict_becomes_the_gateways_degradation_on_the_wire() -> None:
    reply = (
        "The Eiffel Tower is 330 metres tall [1]. "
        "It stands in Paris as a high-end, high-end, high-end landmark [2]."
    )
    answer = await Narrator(settings(), FakeLLM(streams=[[reply]])).answer(narration())
    wire = answer_to_pb(answer, SOURCES)
    assert wire.text == "The Eiffel Tower is 330 metres tall [1]." and wire.answered
    found = degenerate_output(wire, "narrator:1")
    assert found is not None
    degradation = servicer._degradation_pb(found)
    assert (degradation.stage, degradation.reason) == DEGENERATE
    assert "high-end, high-end" in degradation.message
