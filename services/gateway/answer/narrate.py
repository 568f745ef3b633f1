"""The narrator step of an Ask: the answer written from the facts, streamed as it is written
and verified by the narrator. A narrator that fails, is late or breaks mid-stream costs the
answer its prose, not its arrival: the gateway states the best facts itself, each cited, with a
degradation. When the gate refused, the documents do not say, and the narrator is not asked."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from meshkit.rpc.client import Downstream, DownstreamError
from meshkit.text.answering import NO_EVIDENCE_REASON, not_found_text
from ragmesh.extractor.v1 import extractor_pb2
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
from services.gateway.answer.deadlines import scope_left
from services.gateway.answer.text import Evidence, local_answer, narrator_facts, preview
from services.gateway.degradations import (
    DEGENERATE_OUTPUT,
    ERROR,
    Degradation,
    from_error,
    from_reason,
)

NARRATOR = "narrator"
# The narrator's reason for a sentence it dropped because a phrase loops in it (narrator.v1
# Rejected.reason), and how much of the first such sentence a degradation quotes.
DEGENERATE = "degenerate"
DEGENERATE_QUOTE_CHARS = 80


def degenerate_output(answer: narrator_pb2.Answer, target: str) -> Degradation | None:
    """The narrator dropped sentences of the model's answer because a phrase looped in them
    (degenerate generation): a typed degradation, even when the rest of the answer stands, so
    a caller sees that the model misbehaved (a reply with no sentence left also gets the
    narrator's invalid_output one, for the extractive answer that replaced it)."""
    dropped = [r.text for r in answer.rejected if r.reason == DEGENERATE]
    if not dropped:
        return None
    first = dropped[0]
    if len(first) > DEGENERATE_QUOTE_CHARS:
        first = first[: DEGENERATE_QUOTE_CHARS - 1].rstrip() + "\u2026"
    count = f"{len(dropped)} sentence{'s' if len(dropped) > 1 else ''}"
    message = f'{count} of the answer dropped for a phrase looping (degenerate generation): "{first}"'
    return Degradation(NARRATOR, DEGENERATE_OUTPUT, target, message)


def narrate_request(
    query: str,
    evidence: list[Evidence],
    facts: list[extractor_pb2.Fact],
    history: Sequence[narrator_pb2.ChatTurn],
    llm: bool,
) -> narrator_pb2.NarrateRequest:
    """What the narrator writes from: the passages read as numbered sources (their snippets),
    the facts by their source's number, and the conversation."""
    return narrator_pb2.NarrateRequest(
        query=query,
        sources=[
            narrator_pb2.Source(
                id=item.chunk.chunk_id,
                doc_id=item.chunk.doc_id,
                title=item.chunk.title,
                snippet=preview(item.chunk.text),
            )
            for item in evidence
        ],
        facts=narrator_facts(facts, evidence),
        history=history,
        mode=narrator_pb2.NARRATION_MODE_LLM if llm else narrator_pb2.NARRATION_MODE_EXTRACTIVE,
    )


class Narration:
    """The narrator's stream for one Ask, under the step's deadline scope."""

    def __init__(self, narrator: Downstream[narrator_pb2_grpc.NarratorServiceStub]) -> None:
        self.narrator = narrator

    async def stream(
        self, request: narrator_pb2.NarrateRequest, degradations: list[Degradation], gate_reason: str
    ) -> AsyncIterator[str | narrator_pb2.Answer]:
        """The narrator's deltas, then its verified answer (always last); the gateway's own
        extractive answer when the narrator fails or is late. No facts: the documents do not say
        (``gate_reason`` tells why), without asking the narrator."""
        if not request.facts and gate_reason != NO_EVIDENCE_REASON:
            answer = narrator_pb2.Answer(mode=request.mode, text=not_found_text(gate_reason))
            yield answer.text
            yield answer
            return
        narrator = self.narrator
        try:
            async for event in narrator.stream(
                narrator.stub.NarrateStream,
                narrator_pb2.NarrateStreamRequest(request=request),
                timeout=scope_left(),
            ):
                if event.HasField("answer"):
                    degradations.extend(self._reported(event.answer))
                    yield event.answer
                    return
                yield event.delta
        except DownstreamError as exc:
            degradations.append(from_error(NARRATOR, exc))
        else:
            degradations.append(
                Degradation(NARRATOR, ERROR, narrator.target, "the stream ended without an answer")
            )
        yield local_answer(request)

    def _reported(self, answer: narrator_pb2.Answer) -> list[Degradation]:
        """What the narrator's answer says went wrong: its LLM failed (it answered without), and
        the model looped."""
        target = self.narrator.target
        found = [from_reason(NARRATOR, target, answer.degraded_reason)] if answer.degraded_reason else []
        looping = degenerate_output(answer, target)
        return [*found, looping] if looping is not None else found
