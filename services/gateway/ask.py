"""One Ask: search (plan, legs, fusion, rerank), keep the passages that are evidence, extract
facts from them (extractor), write and verify the cited answer (narrator).

Each stage runs under its share of the caller's deadline (the search a fixed share, extraction
a share of what is left, narration the rest), so a slow LLM costs the answer's quality, never
its arrival: a failed or late extractor gives the passages' first sentences as facts, a failed
or late narrator gives an extractive answer from those facts, each with a degradation. The
stream form yields progress per stage and the narrator's text as it is written; the unary
form is the same run with the text deltas ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from meshkit.core.errors import deadline_exceeded
from meshkit.rpc.client import ClientPolicy, Downstream, DownstreamError
from meshkit.rpc.interceptors import deadline_var
from meshkit.settings import GatewaySettings
from meshkit.text.answering import NO_EVIDENCE_REASON, not_found_text
from ragmesh.extractor.v1 import extractor_pb2, extractor_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
from services.gateway import metrics
from services.gateway.answer_text import (
    Evidence,
    local_answer,
    narrator_facts,
    preview,
    selection_facts,
    snippet_facts,
)
from services.gateway.degradations import DEGENERATE_OUTPUT, ERROR, REASON_OF, Degradation
from services.gateway.judge import SentenceJudge
from services.gateway.metrics import ms
from services.gateway.search import Searcher, SearchOutcome
from services.gateway.sentences import Selection, SelectionRules, TopicalityFloor
from services.gateway.support import NARRATOR, SupportCheck, unchecked
from services.gateway.validation import BM25, SearchParams

EXTRACTOR = "extractor"
LLM, EXTRACTIVE = "llm", "extractive"
# Time kept back from the narrator to build and send the final reply.
REPLY_MARGIN_S = 0.1
# The gate's "no" (the cross-encoder found no sentence that answers, or the question's words are
# not in the passages read).
GATE_REASON = "no sentence of the passages read answers this question"
OFF_TOPIC_REASON = "no passage of the collection is about this question"
# How many of the words no document holds a refusal names.
REFUSAL_TERMS = 5
# The narrator's reason for a sentence it dropped because a phrase loops in it (narrator.v1
# Rejected.reason), and how much of the first such sentence a degradation quotes.
DEGENERATE = "degenerate"
DEGENERATE_QUOTE_CHARS = 80


def gate_refusal(selection: Selection, unknown_terms: Sequence[str], floor: float) -> str:
    """Why the gate said no: the question is off the collection's topic (no passage comes within
    the similarity ``floor`` of it), or no sentence answers it, naming the question's words that
    no document of the collection holds (what the documents never mention, or a typo)."""
    reason = GATE_REASON
    if selection.off_topic and selection.similarity is not None:
        reason = f"{OFF_TOPIC_REASON} (best similarity {selection.similarity:.3f}, under {floor:.2f})"
    if not unknown_terms:
        return reason
    named = ", ".join(f'"{term}"' for term in unknown_terms[:REFUSAL_TERMS])
    return f"{reason}; no document mentions {named}"


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


@contextlib.contextmanager
def _deadline_scope(deadline: float) -> Iterator[None]:
    """Downstream calls made inside see ``deadline`` as the caller's (never a later one)."""
    current = deadline_var.get()
    token = deadline_var.set(deadline if current is None else min(current, deadline))
    try:
        yield
    finally:
        deadline_var.reset(token)


def _scope_left() -> float:
    """Seconds left in the current deadline scope (a stage's share; see _deadline_scope). Passed
    as the call's timeout: without one the client would cap the call at its default timeout,
    far shorter than an LLM stage's share."""
    deadline = deadline_var.get()
    assert deadline is not None, "called outside a deadline scope"
    return deadline - time.monotonic()


def _degradation(stage: str, target: str, reason_text: str) -> Degradation:
    """A stage's own "<reason>: <detail>" report (its LLM failed, it carried on without)."""
    reason, _, detail = reason_text.partition(":")
    return Degradation(
        stage, REASON_OF.get(reason.strip(), ERROR), target, reason_text if not detail else detail.strip()
    )


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


def _from_error(stage: str, exc: DownstreamError) -> Degradation:
    return Degradation(
        stage, REASON_OF.get(exc.reason, ERROR), exc.target, f"{exc.target}: {exc.reason}: {exc.message}"
    )


class Asker:
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
        self.judge = SentenceJudge(reranker) if reranker is not None else None
        self.support = SupportCheck(settings, self.judge, narrator.target) if self.judge is not None else None
        self.topicality = TopicalityFloor.parse(
            settings.gateway_ask_gate_min_similarity, settings.gateway_ask_gate_similarity_models
        )

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

    def _end(self) -> float:
        now = time.monotonic()
        inbound = deadline_var.get()
        end = now + self.settings.gateway_ask_timeout_s if inbound is None else inbound
        if end <= now:
            raise deadline_exceeded("the deadline passed before the ask started")
        return end

    async def run(self, params: AskParams) -> AsyncIterator[AskEvent]:
        started = time.perf_counter()
        end = self._end()
        timings: dict[str, float] = {}
        search_end = time.monotonic() + (end - time.monotonic()) * self.settings.gateway_ask_search_share
        with _deadline_scope(search_end):
            searched = await self.searcher.search(self._search_params(params))
        # The extractor and narrator answer the question that was searched (a follow-up's
        # standalone rewrite); the narrator also gets the conversation.
        params = dataclasses.replace(
            params, search=dataclasses.replace(params.search, query=searched.plan.searched_query)
        )
        timings.update(searched.timings)
        timings["search"] = timings.pop("total", ms(time.perf_counter() - started))
        evidence = self._evidence(searched, params)
        yield Progress("search", timings["search"], len(evidence))

        degradations = list(searched.degradations)
        facts: list[extractor_pb2.Fact] = []
        stated: list[extractor_pb2.Fact] | None = None
        selection: Selection | None = None
        gate_reason = NO_EVIDENCE_REASON
        if evidence:
            extract_started = time.perf_counter()
            extract_end = (
                time.monotonic() + (end - time.monotonic()) * self.settings.gateway_ask_extract_share
            )
            with _deadline_scope(extract_end):
                judge_started = time.perf_counter()
                selection = await self._select(params, evidence, searched, degradations)
                if selection is not None:
                    timings["judge"] = ms(time.perf_counter() - judge_started)
                if selection is not None and not selection.answered:
                    floor = self.settings.gateway_ask_gate_min_similarity
                    gate_reason = gate_refusal(selection, searched.unknown_terms, floor)
                elif selection is not None and params.mode == EXTRACTIVE:
                    facts = selection_facts(selection.facts, evidence)
                    stated = selection_facts(selection.answer, evidence)
                else:
                    facts = await self._extract(params, evidence, degradations)
                    if selection is not None and self.support is not None:
                        facts = await self.support.facts(facts, evidence, selection, degradations)
            timings["extract"] = ms(time.perf_counter() - extract_started)
            yield Progress("extract", timings["extract"], len(facts))

        narrate_started = time.perf_counter()
        answer: narrator_pb2.Answer | None = None
        request = self._narrate_request(params, evidence, facts if stated is None else stated)
        with _deadline_scope(end - REPLY_MARGIN_S):
            async for event in self._narrate(request, degradations, gate_reason):
                if isinstance(event, str):
                    yield Delta(event)
                else:
                    answer = event
            assert answer is not None
            if selection is not None and self.support is not None:
                support_started = time.perf_counter()
                answer = await self.support.answer(answer, request, evidence, selection, degradations)
                timings["support"] = ms(time.perf_counter() - support_started)
        timings["narrate"] = ms(time.perf_counter() - narrate_started)
        timings["total"] = ms(time.perf_counter() - started)
        for stage in ("extract", "narrate"):
            if stage in timings:
                metrics.STAGE_SECONDS.labels(stage).observe(timings[stage] / 1000)
        for item in degradations[len(searched.degradations) :]:
            metrics.DEGRADATIONS.labels(item.stage, item.reason).inc()
        yield Done(AskOutcome(searched, evidence, facts, answer, degradations, timings))

    def _evidence(self, searched: SearchOutcome, params: AskParams) -> list[Evidence]:
        """The passages worth reading: hydrated, and when the cross-encoder scored them, scoring
        at least the evidence floor (a passage it finds irrelevant is not evidence; with none
        left the answer is that the documents do not say). Scored also covers the reranker's
        fallback, when nothing passed its own threshold; unscored results of a scored search are
        those under that threshold. Without scores (reranker off or down) nothing is gated."""
        floor = self.settings.gateway_ask_min_rerank_score
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

    def _selection_rules(self) -> SelectionRules:
        s = self.settings
        return SelectionRules(
            gate_min_score=s.gateway_ask_gate_min_score,
            gate_coverage_weight=s.gateway_ask_gate_coverage_weight,
            gate_unknown_weight=s.gateway_ask_gate_unknown_weight,
            gate_novel_weight=s.gateway_ask_gate_novel_weight,
            gate_unknown_penalty=s.gateway_ask_gate_unknown_penalty,
            fact_min_score=s.gateway_ask_fact_min_score,
            max_facts=s.gateway_ask_max_facts,
            sentence_weight=s.gateway_ask_sentence_weight,
            cite_margin=s.gateway_ask_cite_margin,
            max_cited_passages=s.gateway_ask_max_cited,
            sentences_per_passage=s.gateway_ask_sentences_per_passage,
            sentence_margin=s.gateway_ask_sentence_margin,
            gate_min_similarity=s.gateway_ask_gate_min_similarity,
            fact_passage_weight=s.gateway_ask_fact_passage_weight,
        )

    def _search_params(self, params: AskParams) -> SearchParams:
        """The search of an Ask: with the sentence judge on, a question the topicality floor
        will refuse is not reranked (the refusal comes without the reranker's half second)."""
        if self.judge is None or not self.settings.gateway_ask_sentence_check:
            return params.search
        return dataclasses.replace(params.search, skip_rerank_off_topic=self.topicality)

    def _calibrated_similarity(self, searched: SearchOutcome) -> float | None:
        """The search's best cosine when the topicality floor was calibrated for the model that
        embedded the question; None otherwise (another model's cosines live on another scale:
        its floor is unknown, so none is applied)."""
        return self.topicality.similarity(searched.similarity, searched.embedder_model)

    async def _select(
        self,
        params: AskParams,
        evidence: list[Evidence],
        searched: SearchOutcome,
        degradations: list[Degradation],
    ) -> Selection | None:
        """The cross-encoder's verdict on the passages' sentences (see sentences.select); None
        when it is off, was not used for the search (rerank off) or fails: the lexical path then
        answers, with a degradation saying the sentences were not checked."""
        if self.judge is None or not self.settings.gateway_ask_sentence_check or not params.search.rerank:
            return None
        try:
            return await self.judge.select(
                params.search.query,
                [(item.chunk.title, item.chunk.text) for item in evidence],
                [item.score for item in evidence],
                self._selection_rules(),
                max_passages=self.settings.gateway_ask_sentence_passages,
                max_pairs=self.settings.gateway_ask_sentence_pairs,
                unknown_terms=searched.unknown_terms,
                similarity=self._calibrated_similarity(searched),
                novel_terms=searched.novel_terms,
                words_checked=BM25 in searched.leg_lists,
            )
        except DownstreamError as exc:
            degradations.append(unchecked(exc))
            return None

    async def _extract(
        self, params: AskParams, evidence: list[Evidence], degradations: list[Degradation]
    ) -> list[extractor_pb2.Fact]:
        request = extractor_pb2.ExtractRequest(
            query=params.search.query,
            passages=[
                extractor_pb2.Passage(
                    id=item.chunk.chunk_id,
                    doc_id=item.chunk.doc_id,
                    title=item.chunk.title,
                    text=item.chunk.text,
                    score=item.score,
                )
                for item in evidence
            ],
            mode=extractor_pb2.EXTRACTION_MODE_LLM
            if params.mode == LLM
            else extractor_pb2.EXTRACTION_MODE_EXTRACTIVE,
        )
        extractor = self.extractor
        try:
            reply = await extractor.call(
                extractor.stub.Extract, request, timeout=_scope_left(), idempotent=params.mode == EXTRACTIVE
            )
        except DownstreamError as exc:
            degradations.append(_from_error(EXTRACTOR, exc))
            return snippet_facts(evidence)
        if reply.degraded_reason:
            degradations.append(_degradation(EXTRACTOR, extractor.target, reply.degraded_reason))
        return list(reply.facts)

    def _narrate_request(
        self, params: AskParams, evidence: list[Evidence], facts: list[extractor_pb2.Fact]
    ) -> narrator_pb2.NarrateRequest:
        return narrator_pb2.NarrateRequest(
            query=params.search.query,
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
            history=params.history,
            mode=narrator_pb2.NARRATION_MODE_LLM
            if params.mode == LLM
            else narrator_pb2.NARRATION_MODE_EXTRACTIVE,
        )

    async def _narrate(
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
                timeout=_scope_left(),
            ):
                if event.HasField("answer"):
                    if event.answer.degraded_reason:
                        degradations.append(
                            _degradation(NARRATOR, narrator.target, event.answer.degraded_reason)
                        )
                    looping = degenerate_output(event.answer, narrator.target)
                    if looping is not None:
                        degradations.append(looping)
                    yield event.answer
                    return
                yield event.delta
        except DownstreamError as exc:
            degradations.append(_from_error(NARRATOR, exc))
        else:
            degradations.append(
                Degradation(NARRATOR, ERROR, narrator.target, "the stream ended without an answer")
            )
        yield local_answer(request)
