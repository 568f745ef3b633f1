"""One Ask, step by step: search (plan, legs, fusion, rerank), keep the passages that are
evidence, the evidence gate (gate.py), then an extractive answer from the judged sentences or
the extractor's facts (extract.py, checked by support.py), the narrator's cited answer
(narrate.py), and the support check of what it wrote.

Each step runs under its share of the caller's deadline (deadlines.py), so a slow LLM costs the
answer's quality, never its arrival: a failed or late extractor gives the passages' first
sentences as facts, a failed or late narrator gives an extractive answer from those facts,
each with a degradation. The stream form yields progress per step and the narrator's text as it
is written; the unary form is the same run with the text deltas ignored.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from meshkit.rpc.client import ClientPolicy, Downstream
from meshkit.settings import GatewaySettings
from meshkit.text.answering import NO_EVIDENCE_REASON
from ragmesh.extractor.v1 import extractor_pb2, extractor_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
from services.gateway import metrics
from services.gateway.answer.deadlines import REPLY_MARGIN_S, ask_end, deadline_scope, share_of
from services.gateway.answer.extract import EXTRACTOR, Extraction
from services.gateway.answer.gate import EvidenceGate
from services.gateway.answer.judge import SentenceJudge
from services.gateway.answer.narrate import NARRATOR, Narration, narrate_request
from services.gateway.answer.sentences import Selection
from services.gateway.answer.support import SupportCheck
from services.gateway.answer.text import Evidence, selection_facts
from services.gateway.degradations import Degradation
from services.gateway.metrics import ms
from services.gateway.search import Searcher, SearchOutcome
from services.gateway.validation import SearchParams

LLM, EXTRACTIVE = "llm", "extractive"


@dataclass(frozen=True)
class AskParams:
    search: SearchParams
    # Passages read for evidence.
    passages: int
    mode: str  # llm or extractive
    history: list[narrator_pb2.ChatTurn]
    include_facts: bool


@dataclass
class AskOutcome:
    search: SearchOutcome
    evidence: list[Evidence]
    facts: list[extractor_pb2.Fact]
    answer: narrator_pb2.Answer
    degradations: list[Degradation]
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Progress:
    stage: str
    ms: float
    count: int


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Done:
    outcome: AskOutcome


AskEvent = Progress | Delta | Done


@dataclass
class Draft:
    """What the answer may draw on once the gate has spoken."""

    # The facts (what include_facts returns, and, unless ``stated``, what the narrator writes from).
    facts: list[extractor_pb2.Fact] = field(default_factory=list)
    # Extractive answers: exactly what the answer states, in order (the judged sentences).
    stated: list[extractor_pb2.Fact] | None = None
    # The cross-encoder's verdict; None when the judge is off, was not used or failed.
    selection: Selection | None = None
    # Why the documents do not say, should nothing be left to say.
    gate_reason: str = NO_EVIDENCE_REASON

    def told(self) -> list[extractor_pb2.Fact]:
        """What the narrator is given to state."""
        return self.facts if self.stated is None else self.stated


def compose_extractive(selection: Selection, evidence: list[Evidence]) -> Draft:
    """The judged sentences as the answer: the gate's facts, and the sentences it chose to state
    (the extractor is not called)."""
    return Draft(
        facts=selection_facts(selection.facts, evidence),
        stated=selection_facts(selection.answer, evidence),
        selection=selection,
    )


def as_searched(params: AskParams, searched: SearchOutcome) -> AskParams:
    """The extractor and narrator answer the question that was searched (a follow-up's
    standalone rewrite); the narrator also gets the conversation."""
    query = searched.plan.searched_query
    return dataclasses.replace(params, search=dataclasses.replace(params.search, query=query))


def observe(timings: dict[str, float], degradations: list[Degradation]) -> None:
    """The Ask's own steps and degradations in the metrics (the search counted its own)."""
    for stage in ("extract", "narrate"):
        if stage in timings:
            metrics.STAGE_SECONDS.labels(stage).observe(timings[stage] / 1000)
    for item in degradations:
        metrics.DEGRADATIONS.labels(item.stage, item.reason).inc()


class Asker:
    """Runs one Ask's steps in order: search, gate, compose, narrate, check."""

    def __init__(
        self,
        settings: GatewaySettings,
        searcher: Searcher,
        extractor: Downstream[extractor_pb2_grpc.ExtractorServiceStub],
        narrator: Downstream[narrator_pb2_grpc.NarratorServiceStub],
    ) -> None:
        self.settings = settings
        self.searcher = searcher
        self.extractor = extractor
        self.narrator = narrator
        reranker = searcher.backends.reranker
        judge = SentenceJudge(reranker) if reranker is not None else None
        self.gate = EvidenceGate(settings, judge)
        self.support = SupportCheck(settings, judge, narrator.target) if judge is not None else None
        self.extraction = Extraction(extractor)
        self.narration = Narration(narrator)

    @classmethod
    def from_settings(cls, settings: GatewaySettings, searcher: Searcher) -> Asker:
        policy = ClientPolicy.from_settings(settings)
        size = settings.max_message_bytes
        return cls(
            settings,
            searcher,
            Downstream(
                EXTRACTOR, settings.extractor_address, extractor_pb2_grpc.ExtractorServiceStub, policy, size
            ),
            Downstream(
                NARRATOR, settings.narrator_address, narrator_pb2_grpc.NarratorServiceStub, policy, size
            ),
        )

    async def close(self) -> None:
        await self.extractor.close()
        await self.narrator.close()

    async def run(self, params: AskParams) -> AsyncIterator[AskEvent]:
        started = time.perf_counter()
        end = ask_end(self.settings.gateway_ask_timeout_s)
        with deadline_scope(share_of(end, self.settings.gateway_ask_search_share)):
            searched = await self.searcher.search(self.gate.search_params(params.search))
        params = as_searched(params, searched)
        timings = dict(searched.timings)
        timings["search"] = timings.pop("total", ms(time.perf_counter() - started))
        evidence = self._evidence(searched, params)
        yield Progress("search", timings["search"], len(evidence))

        degradations = list(searched.degradations)
        draft = Draft()
        if evidence:
            extract_end = share_of(end, self.settings.gateway_ask_extract_share)
            with metrics.timed(timings, "extract"), deadline_scope(extract_end):
                draft = await self._draft(params, evidence, searched, degradations, timings)
            yield Progress("extract", timings["extract"], len(draft.facts))

        request = narrate_request(
            params.search.query, evidence, draft.told(), params.history, params.mode == LLM
        )
        answer: narrator_pb2.Answer | None = None
        with metrics.timed(timings, "narrate"), deadline_scope(end - REPLY_MARGIN_S):
            async for event in self.narration.stream(request, degradations, draft.gate_reason):
                if isinstance(event, str):
                    yield Delta(event)
                else:
                    answer = event
            assert answer is not None
            answer = await self._checked(answer, request, evidence, draft.selection, degradations, timings)
        timings["total"] = ms(time.perf_counter() - started)
        observe(timings, degradations[len(searched.degradations) :])
        yield Done(AskOutcome(searched, evidence, draft.facts, answer, degradations, timings))

    def _evidence(self, searched: SearchOutcome, params: AskParams) -> list[Evidence]:
        """The passages worth reading: hydrated, and when the cross-encoder scored them, scoring
        at least the evidence floor (a passage it finds irrelevant is not evidence; with none
        left the answer is that the documents do not say). Scored also covers the reranker's
        fallback, when nothing passed its own threshold; unscored results of a scored search are
        those under that threshold. Without scores (reranker off or down) nothing is gated."""
        floor = self.settings.calibration.ask_min_rerank_score
        scored = any(result.rerank_score is not None for result in searched.results)
        found: list[Evidence] = []
        for result in searched.results:
            chunk = searched.chunks.get(result.chunk_id)
            if chunk is None:
                continue
            if scored and (result.rerank_score is None or result.rerank_score < floor):
                continue
            found.append(Evidence(result, chunk))
        return found[: params.passages]

    async def _draft(
        self,
        params: AskParams,
        evidence: list[Evidence],
        searched: SearchOutcome,
        degradations: list[Degradation],
        timings: dict[str, float],
    ) -> Draft:
        """The gate's verdict first; when it lets the question through, the judged sentences
        themselves (extractive mode) or the extractor's facts."""
        judge_started = time.perf_counter()
        selection = await self.gate.verdict(params.search, evidence, searched, degradations)
        if selection is not None:
            timings["judge"] = ms(time.perf_counter() - judge_started)
        if selection is not None and not selection.answered:
            refusal = self.gate.refusal(selection, searched.unknown_terms)
            return Draft(selection=selection, gate_reason=refusal)
        if selection is not None and params.mode == EXTRACTIVE:
            return compose_extractive(selection, evidence)
        return await self._compose_with_extractor(params, evidence, selection, degradations)

    async def _compose_with_extractor(
        self,
        params: AskParams,
        evidence: list[Evidence],
        selection: Selection | None,
        degradations: list[Degradation],
    ) -> Draft:
        """The extractor's facts (by the LLM in llm mode); with a verdict to hold them to, only
        those their passages support."""
        facts = await self.extraction.facts(params.search.query, params.mode == LLM, evidence, degradations)
        if selection is not None and self.support is not None:
            facts = await self.support.facts(facts, evidence, selection, degradations)
        return Draft(facts=facts, selection=selection)

    async def _checked(
        self,
        answer: narrator_pb2.Answer,
        request: narrator_pb2.NarrateRequest,
        evidence: list[Evidence],
        selection: Selection | None,
        degradations: list[Degradation],
        timings: dict[str, float],
    ) -> narrator_pb2.Answer:
        """The narrator's answer after the support check (when there is a verdict to check it
        by: the judge on and answering)."""
        if selection is None or self.support is None:
            return answer
        with metrics.timed(timings, "support"):
            return await self.support.answer(answer, request, evidence, selection, degradations)
