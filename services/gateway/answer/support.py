"""The support check: every sentence of a written answer, and every fact the LLM extracted,
against the passages it cites. A quote passes as it is; anything else is scored by the
cross-encoder (the sentence judge) and kept, rebound to the passage read that supports it best,
or dropped. When nothing of an answer survives, or an LLM's answer cites none of the passages
the judged extractive answer would cite, the judged extractive answer stands instead, with a
degradation saying why."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from meshkit.rpc.client import DownstreamError
from meshkit.settings import GatewaySettings
from ragmesh.extractor.v1 import extractor_pb2
from ragmesh.narrator.v1 import narrator_pb2
from services.gateway.answer.judge import SentenceJudge, unchecked
from services.gateway.answer.narrate import NARRATOR
from services.gateway.answer.sentences import Selection, SupportRules
from services.gateway.answer.text import (
    KEEP_NONE,
    Evidence,
    bound_sources,
    mark_quotes,
    narrator_facts,
    quoted,
    recited,
    selection_facts,
    stated_answer,
    with_sentences,
)
from services.gateway.degradations import INVALID_OUTPUT, Degradation

UNSUPPORTED = "unsupported"
# Per sentence checked: the citation numbers it keeps and its support score (no numbers: dropped).
Verdict = tuple[list[int], float]


def _cites_strongest(sentences: Sequence[narrator_pb2.Sentence], selection: Selection) -> bool:
    """Whether an answer cites a passage the judged extractive answer would cite (source n is
    passage n - 1): a small model that leans on weaker passages cites the answering document
    less often than the extractive answer does."""
    strongest = {item.passage + 1 for item in selection.answer}
    return not strongest or any(n in strongest for s in sentences for n in s.sources)


def supported_sentences(
    answer: narrator_pb2.Answer, verdicts: dict[int, Verdict]
) -> list[narrator_pb2.Sentence]:
    """The answer's sentences as the check left them (``verdicts`` by ``id`` of the sentences
    judged; the others, quotes, stand as they are): each judged one with the citations that
    support it and its score, recited when they changed; those without any are listed among
    the answer's rejected, as unsupported."""
    kept: list[narrator_pb2.Sentence] = []
    for sentence in answer.sentences:
        if id(sentence) not in verdicts:
            kept.append(sentence)
            continue
        sources, score = verdicts[id(sentence)]
        if not sources:
            answer.rejected.append(narrator_pb2.Rejected(text=sentence.text, reason=UNSUPPORTED))
            continue
        text = sentence.text if list(sentence.sources) == sources else recited(sentence.text, sources)
        kept.append(
            narrator_pb2.Sentence(
                text=text,
                sources=sources,
                support_score=score,
                support_check=narrator_pb2.SUPPORT_CHECK_CROSS_ENCODER,
            )
        )
    return kept


def judged_answer(
    answer: narrator_pb2.Answer,
    request: narrator_pb2.NarrateRequest,
    evidence: list[Evidence],
    selection: Selection,
    degraded_reason: str,
) -> narrator_pb2.Answer:
    """The judged extractive answer; what the narrator wrote and the check rejected stays
    listed."""
    stated = narrator_facts(selection_facts(selection.answer, evidence), evidence)
    fallback = stated_answer(stated, list(request.sources))
    mark_quotes(fallback, [item.chunk.text for item in evidence])
    fallback.rejected.extend(answer.rejected)
    fallback.degraded_reason = degraded_reason
    return fallback


class SupportCheck:
    """The cross-encoder's verdict on what the extractor and the narrator wrote."""

    def __init__(self, settings: GatewaySettings, judge: SentenceJudge, narrator_target: str) -> None:
        self.settings = settings
        self.judge = judge
        self.narrator_target = narrator_target

    def rules(self) -> SupportRules:
        s = self.settings
        return SupportRules(
            s.calibration.ask_support_min_score,
            s.calibration.ask_support_min_coverage,
            s.gateway_ask_support_pairs,
        )

    async def facts(
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
        rules = self.rules()
        try:
            scores = await asyncio.gather(
                *(self.judge.support(f.text, [texts[f.passage_id]], rules) for f in unquoted)
            )
        except DownstreamError as exc:
            degradations.append(unchecked(exc))
            return facts
        unsupported = {
            id(f)
            for f, score in zip(unquoted, scores, strict=True)
            if score.get(0, KEEP_NONE) < rules.min_score
        }
        kept = [f for f in facts if id(f) not in unsupported]
        return kept or selection_facts(selection.facts, evidence)

    async def answer(
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
            return judged_answer(answer, request, evidence, selection, answer.degraded_reason)
        texts = [item.chunk.text for item in evidence]
        pending = mark_quotes(answer, texts)
        if not pending:
            return self._unless_off_strongest(answer, request, evidence, selection, degradations)
        try:
            verdicts = await self._verdicts(pending, texts)
        except DownstreamError as exc:
            degradations.append(unchecked(exc))
            return answer
        kept = supported_sentences(answer, verdicts)
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

    async def _verdicts(self, pending: list[narrator_pb2.Sentence], texts: list[str]) -> dict[int, Verdict]:
        """Each pending sentence's verdict (by ``id``), its cited passages scored first; all in
        flight together, so the reranker batches them."""
        rules = self.rules()
        scores = await asyncio.gather(
            *(self.judge.support(s.text, texts, rules, preferred=[n - 1 for n in s.sources]) for s in pending)
        )
        return {
            id(s): bound_sources(list(s.sources), score, rules.min_score)
            for s, score in zip(pending, scores, strict=True)
        }

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
        degradations.append(Degradation(NARRATOR, INVALID_OUTPUT, self.narrator_target, detail))
        return judged_answer(answer, request, evidence, selection, f"invalid_output: {reason}")
