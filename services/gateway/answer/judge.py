"""The cross-encoder as a judge of sentences, through the reranker's Rerank call.

Why the gateway and Rerank: the gateway already calls the reranker (no new edge in the call
graph, caller allow-lists or NetworkPolicies), it holds the full passages (the extractor and
narrator see only facts and snippets), and a Rerank call is already a batch of pairs for one
claim. The support check's pairs have one claim per answer sentence, so it sends one call per
sentence, concurrently: the reranker's micro-batcher runs them as one model batch.

Everything here raises DownstreamError when the reranker fails; the gate and the support check
turn that into the lexical-only path and a ``reranker`` degradation (``unchecked``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from meshkit.rpc.client import Downstream, DownstreamError
from meshkit.rpc.interceptors import deadline_var
from meshkit.text.answering import strip_citations
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc
from services.gateway.answer.sentences import (
    Candidate,
    Scored,
    Selection,
    SelectionRules,
    SupportRules,
    best_support,
    candidates,
    is_off_topic,
    select,
    support_candidates,
)
from services.gateway.degradations import ERROR, REASON_OF, Degradation
from services.gateway.rerank import RERANKER

# Every pair comes back: the judge wants each score, not the reranker's threshold.
KEEP_ALL = -1.0e30


def unchecked(exc: DownstreamError) -> Degradation:
    """The cross-encoder could not judge sentences: the answer rests on the lexical checks."""
    return Degradation(
        RERANKER,
        REASON_OF.get(exc.reason, ERROR),
        exc.target,
        f"sentences checked lexically only: {exc.target}: {exc.reason}: {exc.message}",
    )


class SentenceJudge:
    def __init__(self, reranker: Downstream[reranker_pb2_grpc.RerankerServiceStub]) -> None:
        self.reranker = reranker

    async def score(self, claim: str, texts: Sequence[str]) -> list[float]:
        """The cross-encoder's log-odds of each text being evidence for ``claim``."""
        if not texts:
            return []
        request = reranker_pb2.RerankRequest(
            query=claim,
            passages=[reranker_pb2.Passage(id=str(i), text=t) for i, t in enumerate(texts)],
            min_score=KEEP_ALL,
            fallback_count=len(texts),
        )
        deadline = deadline_var.get()
        timeout = None if deadline is None else deadline - time.monotonic()
        reply = await self.reranker.call(self.reranker.stub.Rerank, request, timeout=timeout, idempotent=True)
        scores: list[float | None] = [None] * len(texts)
        for result in reply.results:
            if result.input_index < len(texts):
                scores[result.input_index] = result.score
        if any(s is None for s in scores):
            raise DownstreamError(
                self.reranker.target, "error", None, "the reply left some sentences unscored"
            )
        return [float(s) for s in scores if s is not None]

    async def select(
        self,
        query: str,
        passages: Sequence[tuple[str, str]],
        passage_scores: Sequence[float],
        rules: SelectionRules,
        *,
        max_passages: int,
        max_pairs: int,
        unknown_terms: Sequence[str] = (),
        similarity: float | None = None,
        novel_terms: Sequence[str] = (),
        words_checked: bool = True,
    ) -> Selection:
        """Score the passages' (title, text) candidate sentences against the question; select()
        with the passages' own (reranker) scores, the question's words the collection lacks (and
        of those, the ones that are no misspelling; ``words_checked``: whether they were looked
        up) and its best dense cosine."""
        found = candidates(
            query, passages, max_passages=max_passages, max_sentences=max_pairs, max_pairs=max_pairs
        )
        if is_off_topic(similarity, rules):
            # Refused whatever the sentences score: no model run spent on them.
            found = []
        scores = await self.score(query, [c.text for c in found])
        texts = [text for _, text in passages[:max_passages]]
        judged = [Scored(c, s) for c, s in zip(found, scores, strict=True)]
        return select(
            query,
            judged,
            texts,
            passage_scores[:max_passages],
            rules,
            unknown_terms,
            similarity,
            novel_terms,
            words_checked=words_checked,
        )

    async def support(
        self,
        sentence: str,
        passage_texts: Sequence[str],
        rules: SupportRules,
        *,
        preferred: Sequence[int] = (),
    ) -> dict[int, float]:
        """Per passage (index into ``passage_texts``), how well its best sentence supports
        ``sentence`` (log-odds); passages with no sentence scored are absent. The ``preferred``
        passages (those it cites) get their closest sentences scored first. Claims run in
        flight together (asyncio.gather) share one model batch at the reranker."""
        found: list[Candidate] = support_candidates(sentence, passage_texts, rules, preferred)
        scores = await self.score(strip_citations(sentence), [c.text for c in found])
        return best_support([Scored(c, s) for c, s in zip(found, scores, strict=True)])
