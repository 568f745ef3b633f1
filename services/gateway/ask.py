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

import asyncio
import contextlib
import dataclasses
import math
import re
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from meshkit.answering import NO_EVIDENCE_REASON, not_found_text, strip_citations
from meshkit.client import ClientPolicy, Downstream, DownstreamError
from meshkit.errors import deadline_exceeded
from meshkit.evidence_text import passage_sentences
from meshkit.interceptors import deadline_var
from meshkit.settings import GatewaySettings
from ragmesh.extractor.v1 import extractor_pb2, extractor_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2
from services.gateway import metrics
from services.gateway.fusion import Fused
from services.gateway.judge import SentenceJudge
from services.gateway.rerank import RERANKER
from services.gateway.search import ERROR, INVALID_OUTPUT, REASON_OF, Degradation, Searcher, SearchOutcome
from services.gateway.sentences import Scored, Selection, SelectionRules, SupportRules
from services.gateway.validation import SearchParams

EXTRACTOR, NARRATOR = "extractor", "narrator"
LLM, EXTRACTIVE = "llm", "extractive"
# Time kept back from the narrator to build and send the final reply.
REPLY_MARGIN_S = 0.1
# Facts an answer states when the gateway has to write it itself (the narrator is down).
LOCAL_ANSWER_FACTS = 3
# Longest passage start shown among the sources explored, and as a fallback fact.
PREVIEW_CHARS = 240
UNSUPPORTED = "unsupported"
# The gate's "no" (the cross-encoder found no sentence that answers, or the question's words are
# not in the passages read).
GATE_REASON = "no sentence of the passages read answers this question"
# How many of the words no document holds a refusal names.
REFUSAL_TERMS = 5
KEEP_NONE = -math.inf
_MARKERLESS_STOP = re.compile(r"[\s.!?\"')\]]+$")


def gate_refusal(unknown_terms: Sequence[str]) -> str:
    """Why the gate said no, naming the question's words that no document of the collection
    holds: the caller sees what the documents never mention (or a typo of theirs)."""
    if not unknown_terms:
        return GATE_REASON
    named = ", ".join(f'"{term}"' for term in unknown_terms[:REFUSAL_TERMS])
    return f"{GATE_REASON}; no document mentions {named}"


def _cites_strongest(sentences: Sequence[narrator_pb2.Sentence], selection: Selection) -> bool:
    """Whether an answer cites a passage the judged extractive answer would cite (source n is
    passage n - 1): a small model that leans on weaker passages cites the answering document
    less often than the extractive answer does."""
    strongest = {item.passage + 1 for item in selection.answer}
    return not strongest or any(n in strongest for s in sentences for n in s.sources)


@dataclass(frozen=True)
class AskParams:
    search: SearchParams
    # Passages read for evidence.
    passages: int
    mode: str  # llm or extractive
    history: list[narrator_pb2.ChatTurn]
    include_facts: bool


@dataclass(frozen=True)
class Evidence:
    """A passage read for the answer; its 1-based position is its citation number."""

    result: Fused
    chunk: sparse_pb2.ChunkText

    @property
    def score(self) -> float:
        return self.result.rerank_score if self.result.rerank_score is not None else self.result.score


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


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


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


def _unchecked(exc: DownstreamError) -> Degradation:
    """The cross-encoder could not judge sentences: the answer rests on the lexical checks."""
    return Degradation(
        RERANKER,
        REASON_OF.get(exc.reason, ERROR),
        exc.target,
        f"sentences checked lexically only: {exc.target}: {exc.reason}: {exc.message}",
    )


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
            searched = await self.searcher.search(params.search)
        # The extractor and narrator answer the question that was searched (a follow-up's
        # standalone rewrite); the narrator also gets the conversation.
        params = dataclasses.replace(
            params, search=dataclasses.replace(params.search, query=searched.plan.searched_query)
        )
        timings.update(searched.timings)
        timings["search"] = timings.pop("total", _ms(time.perf_counter() - started))
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
                selection = await self._select(params, evidence, searched.unknown_terms, degradations)
                if selection is not None:
                    timings["judge"] = _ms(time.perf_counter() - judge_started)
                if selection is not None and not selection.answered:
                    gate_reason = gate_refusal(searched.unknown_terms)
                elif selection is not None and params.mode == EXTRACTIVE:
                    facts = selection_facts(selection.facts, evidence)
                    stated = selection_facts(selection.answer, evidence)
                else:
                    facts = await self._extract(params, evidence, degradations)
                    if selection is not None:
                        facts = await self._supported_facts(facts, evidence, selection, degradations)
            timings["extract"] = _ms(time.perf_counter() - extract_started)
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
            if selection is not None:
                support_started = time.perf_counter()
                answer = await self._checked(answer, request, evidence, selection, degradations)
                timings["support"] = _ms(time.perf_counter() - support_started)
        timings["narrate"] = _ms(time.perf_counter() - narrate_started)
        timings["total"] = _ms(time.perf_counter() - started)
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
            fact_min_score=s.gateway_ask_fact_min_score,
            max_facts=s.gateway_ask_max_facts,
            sentence_weight=s.gateway_ask_sentence_weight,
            cite_margin=s.gateway_ask_cite_margin,
            max_cited_passages=s.gateway_ask_max_cited,
            sentences_per_passage=s.gateway_ask_sentences_per_passage,
            sentence_margin=s.gateway_ask_sentence_margin,
        )

    def _support_rules(self) -> SupportRules:
        s = self.settings
        return SupportRules(
            s.gateway_ask_support_min_score, s.gateway_ask_support_min_coverage, s.gateway_ask_support_pairs
        )

    async def _select(
        self,
        params: AskParams,
        evidence: list[Evidence],
        unknown_terms: Sequence[str],
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
                unknown_terms=unknown_terms,
            )
        except DownstreamError as exc:
            degradations.append(_unchecked(exc))
            return None

    async def _supported_facts(
        self,
        facts: list[extractor_pb2.Fact],
        evidence: list[Evidence],
        selection: Selection,
        degradations: list[Degradation],
    ) -> list[extractor_pb2.Fact]:
        """The LLM's facts its passage supports (quoted, or the cross-encoder accepts one of the
        passage's sentences as evidence for it); with none left, the cross-encoder's own."""
        texts = {item.chunk.chunk_id: item.chunk.text for item in evidence}
        checked = [f for f in facts if f.origin == extractor_pb2.FACT_ORIGIN_LLM and f.passage_id in texts]
        unquoted = [f for f in checked if not quoted(f.text, [texts[f.passage_id]])]
        rules = self._support_rules()
        assert self.judge is not None
        try:
            scores = await asyncio.gather(
                *(self.judge.support(f.text, [texts[f.passage_id]], rules) for f in unquoted)
            )
        except DownstreamError as exc:
            degradations.append(_unchecked(exc))
            return facts
        unsupported = {
            id(f)
            for f, score in zip(unquoted, scores, strict=True)
            if score.get(0, KEEP_NONE) < rules.min_score
        }
        kept = [f for f in facts if id(f) not in unsupported]
        return kept or selection_facts(selection.facts, evidence)

    async def _checked(
        self,
        answer: narrator_pb2.Answer,
        request: narrator_pb2.NarrateRequest,
        evidence: list[Evidence],
        selection: Selection,
        degradations: list[Degradation],
    ) -> narrator_pb2.Answer:
        """Every answer sentence checked against the passages it cites: a quote is supported as
        it is; any other sentence is scored by the cross-encoder against the passages' sentences
        and kept (its score reported), rebound to the passage read that supports it best, or
        dropped. When nothing is left, the cross-encoder's extractive answer stands instead."""
        if not answer.answered or not answer.sentences:
            return answer
        if request.mode == narrator_pb2.NARRATION_MODE_LLM and answer.mode != narrator_pb2.NARRATION_MODE_LLM:
            # The LLM failed and the narrator (or the gateway for it) stated the extractor's
            # facts; the judged sentences make the better extractive answer. The failure is
            # already a degradation.
            return self._judged_answer(answer, request, evidence, selection, answer.degraded_reason)
        texts = [item.chunk.text for item in evidence]
        pending = _mark_quotes(answer, texts)
        if not pending:
            return self._unless_off_strongest(answer, request, evidence, selection, degradations)
        rules = self._support_rules()
        assert self.judge is not None
        try:
            scores = await asyncio.gather(
                *(
                    self.judge.support(s.text, texts, rules, preferred=[n - 1 for n in s.sources])
                    for s in pending
                )
            )
        except DownstreamError as exc:
            degradations.append(_unchecked(exc))
            return answer
        verdict = {
            id(s): bound_sources(list(s.sources), score, rules.min_score)
            for s, score in zip(pending, scores, strict=True)
        }
        kept: list[narrator_pb2.Sentence] = []
        for sentence in answer.sentences:
            if id(sentence) not in verdict:
                kept.append(sentence)
                continue
            sources, score = verdict[id(sentence)]
            if not sources:
                answer.rejected.append(narrator_pb2.Rejected(text=sentence.text, reason=UNSUPPORTED))
                continue
            text = sentence.text if list(sentence.sources) == sources else _recited(sentence.text, sources)
            kept.append(
                narrator_pb2.Sentence(
                    text=text,
                    sources=sources,
                    support_score=score,
                    support_check=narrator_pb2.SUPPORT_CHECK_CROSS_ENCODER,
                )
            )
        if not kept:
            return self._judged_instead(
                answer,
                request,
                evidence,
                selection,
                degradations,
                "no sentence of the answer is supported by the passages it cites",
                "no supported sentence",
            )
        checked = with_sentences(answer, kept, list(request.sources))
        return self._unless_off_strongest(checked, request, evidence, selection, degradations)

    def _unless_off_strongest(
        self,
        answer: narrator_pb2.Answer,
        request: narrator_pb2.NarrateRequest,
        evidence: list[Evidence],
        selection: Selection,
        degradations: list[Degradation],
    ) -> narrator_pb2.Answer:
        """An LLM's answer, unless it cites none of the passages the judged extractive answer
        would cite (gateway_ask_llm_cite_strongest): that answer then stands instead."""
        if (
            not self.settings.gateway_ask_llm_cite_strongest
            or answer.mode != narrator_pb2.NARRATION_MODE_LLM
            or _cites_strongest(answer.sentences, selection)
        ):
            return answer
        return self._judged_instead(
            answer,
            request,
            evidence,
            selection,
            degradations,
            "the answer cites none of the passages the cross-encoder found strongest",
            "strongest evidence not cited",
        )

    def _judged_instead(
        self,
        answer: narrator_pb2.Answer,
        request: narrator_pb2.NarrateRequest,
        evidence: list[Evidence],
        selection: Selection,
        degradations: list[Degradation],
        detail: str,
        reason: str,
    ) -> narrator_pb2.Answer:
        """The judged extractive answer in place of the narrator's, with a degradation saying
        why."""
        degradations.append(Degradation(NARRATOR, INVALID_OUTPUT, self.narrator.target, detail))
        return self._judged_answer(answer, request, evidence, selection, f"invalid_output: {reason}")

    @staticmethod
    def _judged_answer(
        answer: narrator_pb2.Answer,
        request: narrator_pb2.NarrateRequest,
        evidence: list[Evidence],
        selection: Selection,
        degraded_reason: str,
    ) -> narrator_pb2.Answer:
        """The judged extractive answer; what the narrator wrote and the check rejected stays
        listed."""
        stated = _narrator_facts(selection_facts(selection.answer, evidence), evidence)
        fallback = stated_answer(stated, list(request.sources))
        _mark_quotes(fallback, [item.chunk.text for item in evidence])
        fallback.rejected.extend(answer.rejected)
        fallback.degraded_reason = degraded_reason
        return fallback

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
            facts=_narrator_facts(facts, evidence),
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


def preview(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1].rstrip() + "…"


def snippet_facts(evidence: list[Evidence]) -> list[extractor_pb2.Fact]:
    """Without the extractor: the first sentence of each document's best passage stands for it
    (the title line, which chunks start with, says nothing the citation does not)."""
    facts = []
    seen: set[str] = set()
    for item in evidence:
        if item.chunk.doc_id in seen:
            continue
        seen.add(item.chunk.doc_id)
        sentences = passage_sentences(item.chunk.text, item.chunk.title)
        if sentences:
            facts.append(
                extractor_pb2.Fact(
                    text=preview(sentences[0]),
                    passage_id=item.chunk.chunk_id,
                    doc_id=item.chunk.doc_id,
                    origin=extractor_pb2.FACT_ORIGIN_SNIPPET,
                    score=item.score,
                )
            )
    return facts


def _narrator_facts(facts: list[extractor_pb2.Fact], evidence: list[Evidence]) -> list[narrator_pb2.Fact]:
    """Facts numbered by their passage's citation number (facts of passages not read left out)."""
    number = {item.chunk.chunk_id: i for i, item in enumerate(evidence, 1)}
    return [
        narrator_pb2.Fact(text=fact.text, source=number[fact.passage_id], score=fact.score)
        for fact in facts
        if fact.passage_id in number
    ]


def selection_facts(chosen: list[Scored], evidence: list[Evidence]) -> list[extractor_pb2.Fact]:
    """The cross-encoder's sentences as extractive facts of their passages, in the given order,
    scored by their log-odds."""
    return [
        extractor_pb2.Fact(
            text=item.text,
            passage_id=evidence[item.passage].chunk.chunk_id,
            doc_id=evidence[item.passage].chunk.doc_id,
            origin=extractor_pb2.FACT_ORIGIN_EXTRACTIVE,
            score=item.score,
        )
        for item in chosen
    ]


def _squashed(text: str) -> str:
    return " ".join(text.split()).lower()


def _mark_quotes(answer: narrator_pb2.Answer, texts: list[str]) -> list[narrator_pb2.Sentence]:
    """Marks each sentence of ``answer`` quoted from a passage it cites (supported as it is);
    returns the others, marked lexical until the cross-encoder judges them."""
    pending = []
    for sentence in answer.sentences:
        if quoted(sentence.text, [texts[n - 1] for n in sentence.sources if 0 < n <= len(texts)]):
            sentence.support_check = narrator_pb2.SUPPORT_CHECK_QUOTED
            sentence.ClearField("support_score")
        else:
            sentence.support_check = narrator_pb2.SUPPORT_CHECK_LEXICAL
            pending.append(sentence)
    return pending


def quoted(sentence: str, passages: list[str]) -> bool:
    """Whether ``sentence`` (its citations and final stop aside) is a stretch of one of
    ``passages``, as written or as its evidence sentences (markup removed, table rows with
    their header): a quote needs no judge."""
    body = _squashed(_MARKERLESS_STOP.sub("", strip_citations(sentence)))
    if not body:
        return False
    return any(
        body in _squashed(text) or body in _squashed(" ".join(passage_sentences(text))) for text in passages
    )


def bound_sources(cited: list[int], support: dict[int, float], min_score: float) -> tuple[list[int], float]:
    """The citation numbers a sentence keeps and its support score: the cited passages that
    support it; else the best-supporting passage read (the sentence is rebound to it); else
    none (it is dropped). ``support`` is keyed by 0-based passage index."""
    kept = [n for n in cited if support.get(n - 1, KEEP_NONE) >= min_score]
    if kept:
        return kept, max(support[n - 1] for n in kept)
    best = max(support, key=lambda i: (support[i], -i), default=None)
    if best is not None and support[best] >= min_score:
        return [best + 1], support[best]
    return [], max(support.values(), default=KEEP_NONE)


def _recited(sentence: str, numbers: list[int]) -> str:
    """``sentence`` with its citation markers replaced by ``numbers``."""
    body = strip_citations(sentence)
    stop = _MARKERLESS_STOP.search(body)
    end = stop.group(0).strip() if stop else ""
    core = body[: stop.start()] if stop else body
    return f"{core} [{', '.join(str(n) for n in numbers)}]{end or '.'}"


def with_sentences(
    answer: narrator_pb2.Answer, sentences: list[narrator_pb2.Sentence], sources: list[narrator_pb2.Source]
) -> narrator_pb2.Answer:
    """``answer`` stating ``sentences``: its text and citations follow them."""
    result = narrator_pb2.Answer()
    result.CopyFrom(answer)
    del result.sentences[:]
    del result.citations[:]
    result.sentences.extend(sentences)
    result.text = " ".join(s.text for s in sentences)
    existing = {c.number: c for c in answer.citations}
    for number in sorted({n for s in sentences for n in s.sources}):
        source = sources[number - 1]
        result.citations.append(
            existing.get(number)
            or narrator_pb2.Citation(
                number=number,
                source_id=source.id,
                doc_id=source.doc_id,
                title=source.title,
                snippet=source.snippet,
            )
        )
    return result


def local_answer(request: narrator_pb2.NarrateRequest) -> narrator_pb2.Answer:
    """The answer the gateway writes when the narrator cannot: the best facts from distinct
    sources, each cited, or that the documents do not say."""
    chosen: list[narrator_pb2.Fact] = []
    for fact in sorted(request.facts, key=lambda f: -f.score):
        if all(fact.source != c.source for c in chosen):
            chosen.append(fact)
        if len(chosen) == LOCAL_ANSWER_FACTS:
            break
    return stated_answer(chosen, list(request.sources))


def stated_answer(chosen: list[narrator_pb2.Fact], sources: list[narrator_pb2.Source]) -> narrator_pb2.Answer:
    """An extractive answer stating ``chosen`` in order, each cited (not found when empty)."""
    answer = narrator_pb2.Answer(mode=narrator_pb2.NARRATION_MODE_EXTRACTIVE)
    if not chosen:
        answer.text = not_found_text(NO_EVIDENCE_REASON)
        return answer
    answer.answered = True
    for fact in chosen:
        text = _recited(fact.text, [fact.source])
        answer.sentences.append(narrator_pb2.Sentence(text=text, sources=[fact.source]))
    return with_sentences(answer, list(answer.sentences), sources)
