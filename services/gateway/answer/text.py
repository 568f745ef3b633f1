"""The answer as text: the passages read (their 1-based position is their citation number),
facts drawn from them, sentences recited with their citation markers, the quote test that
needs no judge, and the answers the gateway states itself (from judged sentences, or from the
best facts when the narrator cannot write)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from meshkit.text.answering import NO_EVIDENCE_REASON, not_found_text, strip_citations
from meshkit.text.evidence import passage_sentences
from meshkit.text.extractive import best_facts
from ragmesh.extractor.v1 import extractor_pb2
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.sparse.v1 import sparse_pb2
from services.gateway.answer.sentences import Scored
from services.gateway.fusion import Fused

# Facts an answer states when the gateway has to write it itself (the narrator is down).
LOCAL_ANSWER_FACTS = 3
# Longest passage start shown among the sources explored, and as a fallback fact.
PREVIEW_CHARS = 240
KEEP_NONE = -math.inf
_MARKERLESS_STOP = re.compile(r"[\s.!?\"')\]]+$")


@dataclass(frozen=True)
class Evidence:
    """A passage read for the answer; its 1-based position is its citation number."""

    result: Fused
    chunk: sparse_pb2.ChunkText

    @property
    def score(self) -> float:
        return self.result.rerank_score if self.result.rerank_score is not None else self.result.score


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


def narrator_facts(facts: list[extractor_pb2.Fact], evidence: list[Evidence]) -> list[narrator_pb2.Fact]:
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


def mark_quotes(answer: narrator_pb2.Answer, texts: list[str]) -> list[narrator_pb2.Sentence]:
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


def recited(sentence: str, numbers: list[int]) -> str:
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
    """The answer the gateway writes when the narrator cannot: the best facts, each cited (the
    narrator's own extractive choice, meshkit.text.extractive), or that the documents do not say."""
    return stated_answer(best_facts(list(request.facts), LOCAL_ANSWER_FACTS), list(request.sources))


def stated_answer(chosen: list[narrator_pb2.Fact], sources: list[narrator_pb2.Source]) -> narrator_pb2.Answer:
    """An extractive answer stating ``chosen`` in order, each cited (not found when empty)."""
    answer = narrator_pb2.Answer(mode=narrator_pb2.NARRATION_MODE_EXTRACTIVE)
    if not chosen:
        answer.text = not_found_text(NO_EVIDENCE_REASON)
        return answer
    answer.answered = True
    for fact in chosen:
        text = recited(fact.text, [fact.source])
        answer.sentences.append(narrator_pb2.Sentence(text=text, sources=[fact.source]))
    return with_sentences(answer, list(answer.sentences), sources)
