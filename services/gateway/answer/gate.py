"""The evidence gate of an Ask: whether the passages read answer the question, by the
cross-encoder's verdict on their sentences (sentences.select, through judge.py), under the
topicality floor, and with the question's words the collection lacks. It also picks the
sentences an extractive answer states. A judge that is off, unused (rerank off) or failing
leaves no verdict: the lexical path answers, with a degradation saying so."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from meshkit.rpc.client import DownstreamError
from meshkit.settings import GatewaySettings
from services.gateway.answer.judge import SentenceJudge, unchecked
from services.gateway.answer.sentences import Selection, SelectionRules
from services.gateway.answer.text import Evidence
from services.gateway.degradations import Degradation
from services.gateway.search import SearchOutcome
from services.gateway.validation import BM25, SearchParams, TopicalityFloor

# The gate's "no" (the cross-encoder found no sentence that answers, or the question's words are
# not in the passages read).
GATE_REASON = "no sentence of the passages read answers this question"
OFF_TOPIC_REASON = "no passage of the collection is about this question"
# How many of the words no document holds a refusal names.
REFUSAL_TERMS = 5


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


class EvidenceGate:
    """The gate as configured: its rules and topicality floor from the settings, its judge the
    cross-encoder (None: no reranker tier, so no gate)."""

    def __init__(self, settings: GatewaySettings, judge: SentenceJudge | None) -> None:
        self.settings = settings
        self.judge = judge
        self.topicality = TopicalityFloor.parse(
            settings.calibration.ask_gate_min_similarity, settings.calibration.ask_gate_similarity_models
        )

    def search_params(self, search: SearchParams) -> SearchParams:
        """The search of an Ask: with the sentence judge on, a question the topicality floor
        will refuse is not reranked (the refusal comes without the reranker's half second)."""
        if self.judge is None or not self.settings.gateway_ask_sentence_check:
            return search
        return dataclasses.replace(search, skip_rerank_off_topic=self.topicality)

    async def verdict(
        self,
        search: SearchParams,
        evidence: list[Evidence],
        searched: SearchOutcome,
        degradations: list[Degradation],
    ) -> Selection | None:
        """The cross-encoder's verdict on the passages' sentences (see sentences.select); None
        when it is off, was not used for the search (rerank off) or fails: the lexical path then
        answers, with a degradation saying the sentences were not checked."""
        judge = self.judge
        if judge is None or not self.settings.gateway_ask_sentence_check or not search.rerank:
            return None
        try:
            return await judge.select(
                search.query,
                [(item.chunk.title, item.chunk.text) for item in evidence],
                [item.score for item in evidence],
                self.rules(),
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

    def refusal(self, selection: Selection, unknown_terms: Sequence[str]) -> str:
        return gate_refusal(selection, unknown_terms, self.settings.calibration.ask_gate_min_similarity)

    def rules(self) -> SelectionRules:
        s = self.settings
        return SelectionRules(
            gate_min_score=s.calibration.ask_gate_min_score,
            gate_coverage_weight=s.calibration.ask_gate_coverage_weight,
            gate_unknown_weight=s.calibration.ask_gate_unknown_weight,
            gate_novel_weight=s.calibration.ask_gate_novel_weight,
            gate_unknown_penalty=s.calibration.ask_gate_unknown_penalty,
            fact_min_score=s.calibration.ask_fact_min_score,
            max_facts=s.gateway_ask_max_facts,
            sentence_weight=s.calibration.ask_sentence_weight,
            cite_margin=s.calibration.ask_cite_margin,
            max_cited_passages=s.gateway_ask_max_cited,
            sentences_per_passage=s.gateway_ask_sentences_per_passage,
            sentence_margin=s.calibration.ask_sentence_margin,
            gate_min_similarity=s.calibration.ask_gate_min_similarity,
            fact_passage_weight=s.calibration.ask_fact_passage_weight,
        )

    def _calibrated_similarity(self, searched: SearchOutcome) -> float | None:
        """The search's best cosine when the topicality floor was calibrated for the model that
        embedded the question; None otherwise (another model's cosines live on another scale:
        its floor is unknown, so none is applied)."""
        return self.topicality.similarity(searched.similarity, searched.embedder_model)
