"""gRPC face of the narrator: request validation and the mapping between the wire and the
pipeline (narrate.py), which knows nothing of protobuf.

Validation rules (what callers can rely on):
- ``query``: a non-whitespace character and at most narrator_max_query_chars (INVALID_ARGUMENT).
- ``sources``: at most narrator_max_sources (RESOURCE_EXHAUSTED); ids 1..MAX_ITEM_ID_CHARS characters
  and unique, doc ids at most MAX_ITEM_ID_CHARS (INVALID_ARGUMENT); titles at most MAX_TITLE_CHARS and
  snippets at most narrator_max_snippet_chars (RESOURCE_EXHAUSTED).
- ``facts``: at most narrator_max_facts (RESOURCE_EXHAUSTED); text non-empty (INVALID_ARGUMENT)
  and at most narrator_max_fact_chars (RESOURCE_EXHAUSTED); ``source`` in 1..len(sources) and a
  finite ``score`` (INVALID_ARGUMENT).
- ``history``: at most narrator_max_history_turns turns and narrator_max_history_chars in all
  (RESOURCE_EXHAUSTED); each turn a user or assistant one with content (INVALID_ARGUMENT).
- ``mode`` a known mode (INVALID_ARGUMENT); ``max_tokens`` at most narrator_max_tokens_limit
  (RESOURCE_EXHAUSTED).
An LLM failure is never an error: the answer is then extractive and says why (degraded_reason).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence

from grpc import aio

from meshkit.core.errors import invalid_argument, resource_exhausted
from meshkit.domain.ids import MAX_ITEM_ID_CHARS, check_item_list
from meshkit.llm.factory import LLM, make_llm
from meshkit.rpc.identity import GATEWAY, OPS, Callers, allow
from meshkit.rpc.server import ITEM_OVERHEAD_BYTES, ServiceSpec, text_request_bytes
from meshkit.settings import NarratorSettings
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
from services.narrator.model import (
    Answer,
    Fact,
    Mode,
    NarrationInput,
    Role,
    Sentence,
    Source,
    SupportCheck,
    Turn,
)
from services.narrator.narrate import Narrator

SERVICE_NAME = "narrator"
MAX_TITLE_CHARS = 1000

_MODE_FROM_PB = {
    narrator_pb2.NARRATION_MODE_LLM: Mode.LLM,
    narrator_pb2.NARRATION_MODE_EXTRACTIVE: Mode.EXTRACTIVE,
}
_MODE_TO_PB = {mode: pb for pb, mode in _MODE_FROM_PB.items()}
_ROLE_FROM_PB = {narrator_pb2.ROLE_USER: Role.USER, narrator_pb2.ROLE_ASSISTANT: Role.ASSISTANT}


def validate(request: narrator_pb2.NarrateRequest, settings: NarratorSettings) -> NarrationInput:
    """The request as the pipeline's input; ServiceError when any field is out of bounds."""
    query = request.query
    if not query.strip():
        raise invalid_argument("query is empty")
    if len(query) > settings.narrator_max_query_chars:
        raise invalid_argument(
            f"query has {len(query)} characters; the limit is {settings.narrator_max_query_chars}"
        )
    sources = validate_sources(request.sources, settings)
    facts = validate_facts(request.facts, len(sources), settings)
    history = validate_history(request.history, settings)
    if request.mode == narrator_pb2.NARRATION_MODE_UNSPECIFIED:
        mode = Mode(settings.narrator_mode)
    elif request.mode in _MODE_FROM_PB:
        mode = _MODE_FROM_PB[request.mode]
    else:
        raise invalid_argument(f"unknown mode {request.mode}")
    if request.max_tokens > settings.narrator_max_tokens_limit:
        raise resource_exhausted(
            f"max_tokens is {request.max_tokens}; the limit is {settings.narrator_max_tokens_limit}"
        )
    return NarrationInput(
        query=query,
        sources=sources,
        facts=facts,
        history=history,
        mode=mode,
        max_tokens=request.max_tokens or settings.narrator_max_tokens,
    )


def validate_sources(sources: Sequence[narrator_pb2.Source], settings: NarratorSettings) -> list[Source]:
    check_item_list([s.id for s in sources], "sources", settings.narrator_max_sources)
    for i, source in enumerate(sources):
        if len(source.doc_id) > MAX_ITEM_ID_CHARS:
            raise invalid_argument(f"sources[{i}].doc_id is longer than {MAX_ITEM_ID_CHARS} characters")
        if len(source.title) > MAX_TITLE_CHARS:
            raise resource_exhausted(
                f"sources[{i}].title has {len(source.title)} characters; the limit is {MAX_TITLE_CHARS}"
            )
        if len(source.snippet) > settings.narrator_max_snippet_chars:
            raise resource_exhausted(
                f"sources[{i}].snippet has {len(source.snippet)} characters; "
                f"the limit is {settings.narrator_max_snippet_chars}"
            )
    return [Source(s.id, s.doc_id, s.title, s.snippet) for s in sources]


def validate_facts(
    facts: Sequence[narrator_pb2.Fact], source_count: int, settings: NarratorSettings
) -> list[Fact]:
    if len(facts) > settings.narrator_max_facts:
        raise resource_exhausted(
            f"{len(facts)} facts in one call; the limit is {settings.narrator_max_facts}"
        )
    for i, fact in enumerate(facts):
        if not fact.text.strip():
            raise invalid_argument(f"facts[{i}].text is empty")
        if len(fact.text) > settings.narrator_max_fact_chars:
            raise resource_exhausted(
                f"facts[{i}].text has {len(fact.text)} characters; "
                f"the limit is {settings.narrator_max_fact_chars}"
            )
        if not 1 <= fact.source <= source_count:
            raise invalid_argument(
                f"facts[{i}].source is {fact.source}; it must be a source number 1..{source_count}"
            )
        if not math.isfinite(fact.score):
            raise invalid_argument(f"facts[{i}].score must be a finite number")
    return [Fact(f.text.strip(), f.source, f.score) for f in facts]


def validate_history(history: Sequence[narrator_pb2.ChatTurn], settings: NarratorSettings) -> list[Turn]:
    if len(history) > settings.narrator_max_history_turns:
        raise resource_exhausted(
            f"{len(history)} history turns; the limit is {settings.narrator_max_history_turns}"
        )
    total = sum(len(turn.content) for turn in history)
    if total > settings.narrator_max_history_chars:
        raise resource_exhausted(
            f"history has {total} characters; the limit is {settings.narrator_max_history_chars}"
        )
    for i, turn in enumerate(history):
        if turn.role not in _ROLE_FROM_PB:
            raise invalid_argument(f"history[{i}].role must be ROLE_USER or ROLE_ASSISTANT")
        if not turn.content.strip():
            raise invalid_argument(f"history[{i}].content is empty")
    return [Turn(_ROLE_FROM_PB[t.role], t.content) for t in history]


def answer_to_pb(answer: Answer, sources: Sequence[Source]) -> narrator_pb2.Answer:
    return narrator_pb2.Answer(
        text=answer.text,
        sentences=[sentence_pb(s) for s in answer.sentences],
        citations=[citation_to_pb(n, sources[n - 1]) for n in answer.cited],
        contradictions=[
            narrator_pb2.Contradiction(description=c.description, sources=c.sources)
            for c in answer.contradictions
        ],
        answered=answer.answered,
        mode=_MODE_TO_PB[answer.mode],
        degraded_reason=answer.degraded_reason,
        rejected=[narrator_pb2.Rejected(text=r.text, reason=r.reason.value) for r in answer.rejected],
    )


_CHECK_PB = {
    SupportCheck.LEXICAL: narrator_pb2.SUPPORT_CHECK_LEXICAL,
    SupportCheck.QUOTED: narrator_pb2.SUPPORT_CHECK_QUOTED,
}


def sentence_pb(sentence: Sentence) -> narrator_pb2.Sentence:
    return narrator_pb2.Sentence(
        text=sentence.text,
        sources=sentence.sources,
        support_check=_CHECK_PB[sentence.check],
        support_score=sentence.support,
    )


def citation_to_pb(number: int, source: Source) -> narrator_pb2.Citation:
    return narrator_pb2.Citation(
        number=number,
        source_id=source.id,
        doc_id=source.doc_id,
        title=source.title,
        snippet=source.snippet,
    )


class NarratorServicer(narrator_pb2_grpc.NarratorServiceServicer):
    def __init__(self, settings: NarratorSettings, llm: LLM) -> None:
        self.settings = settings
        self.llm = llm
        self.narrator = Narrator(settings, llm)

    async def stop(self) -> None:
        await self.llm.aclose()

    async def Narrate(
        self, request: narrator_pb2.NarrateRequest, context: aio.ServicerContext
    ) -> narrator_pb2.NarrateResponse:
        narration = validate(request, self.settings)
        answer = await self.narrator.answer(narration)
        return narrator_pb2.NarrateResponse(answer=answer_to_pb(answer, narration.sources))

    async def NarrateStream(
        self, request: narrator_pb2.NarrateStreamRequest, context: aio.ServicerContext
    ) -> AsyncIterator[narrator_pb2.NarrateStreamResponse]:
        if not request.HasField("request"):
            raise invalid_argument("request is missing")
        narration = validate(request.request, self.settings)
        async for event in self.narrator.narrate(narration):
            if isinstance(event, str):
                yield narrator_pb2.NarrateStreamResponse(delta=event)
            else:
                yield narrator_pb2.NarrateStreamResponse(answer=answer_to_pb(event, narration.sources))


# Who may call the narrator (RAGMESH_SERVICE_AUTH=mtls).
CALLERS: Callers = {"Narrate": allow(GATEWAY, OPS), "NarrateStream": allow(GATEWAY, OPS)}


def max_request_bytes(settings: NarratorSettings) -> int:
    """The largest legal Narrate: the most sources and facts at their longest, a full history
    and a query."""
    s = settings
    sources = text_request_bytes(s.narrator_max_sources, s.narrator_max_snippet_chars, ITEM_OVERHEAD_BYTES)
    facts = text_request_bytes(s.narrator_max_facts, s.narrator_max_fact_chars, 64)
    talk = text_request_bytes(
        s.narrator_max_history_turns, 0, 64, s.narrator_max_history_chars + s.narrator_max_query_chars
    )
    return sources + facts + talk


def build_spec(settings: NarratorSettings, llm: LLM | None = None) -> tuple[ServiceSpec, NarratorServicer]:
    """The service spec for run_service/start_service; ``llm`` lets tests inject a fake."""
    servicer = NarratorServicer(settings, llm if llm is not None else make_llm(settings))

    def register(server: aio.Server) -> None:
        narrator_pb2_grpc.add_NarratorServiceServicer_to_server(servicer, server)

    spec = ServiceSpec(
        name=SERVICE_NAME,
        grpc_services=[narrator_pb2.DESCRIPTOR.services_by_name["NarratorService"].full_name],
        register=register,
        on_start=[],
        on_stop=[servicer.stop],
        multiprocess_safe=True,
        callers=CALLERS,
        max_request_bytes=max_request_bytes(settings),
        # Each call holds an LLM generation for seconds; more at once only queues behind the LLM tier.
        max_concurrent_rpcs=128,
    )
    return spec, servicer
