"""The no-LLM path: each passage's best sentences, ranked by embedding similarity to the
question (lexical overlap when the embedder is down), and the raw-snippet fallback that
stands in for a passage whose LLM entry was malformed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from meshkit.text.answering import coverage, split_sentences
from meshkit.text.evidence import passage_sentences
from ragmesh.embedder.v1 import embedder_pb2
from services.extractor.facts import EXTRACTIVE, Fact, Source

# ``embed(texts, kind)``: one row per text; raises EmbedError.
Embed = Callable[[Sequence[str], embedder_pb2.TextKind], Awaitable[np.ndarray]]

# A fact longer than this is cut: it must fit the narrator's prompt next to many others.
MAX_FACT_CHARS = 1000
SNIPPET_CHARS = 400
# Sentences of one passage considered: bounds embedding work on a huge passage, and the
# evidence of a retrieved chunk is rarely past its first few dozen sentences.
MAX_SENTENCES_PER_PASSAGE = 40
# Share of a typical gap between neighbouring passages' scores that a perfectly similar
# sentence adds: similarity orders a passage's sentences and breaks near-ties between passages,
# but does not overturn the earlier stage's order (good passages still dominate).
SENTENCE_WEIGHT = 0.5


class EmbedError(Exception):
    """The embedder could not embed the texts (down, too slow or a malformed reply)."""


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters at a word boundary when there is one nearby."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    return cut[:space] if space > limit // 2 else cut


def candidate_sentences(text: str, title: str = "") -> list[str]:
    """The sentences of a passage worth ranking: the first MAX_SENTENCES_PER_PASSAGE with a
    content word, other than the title line (all of them when none is left), each cut to
    MAX_FACT_CHARS."""
    sentences = passage_sentences(text, title)[:MAX_SENTENCES_PER_PASSAGE] or split_sentences(text)[:1]
    return [clip(s, MAX_FACT_CHARS) for s in sentences] or [clip(text, MAX_FACT_CHARS)]


def snippet(source: Source, query: str) -> str:
    """The passage's raw evidence: its sentence sharing most words with the question (the
    first on ties), extended with the sentences after it up to SNIPPET_CHARS."""
    sentences = candidate_sentences(source.text, source.title)
    if not sentences:
        return clip(source.text, SNIPPET_CHARS)
    best = max(range(len(sentences)), key=lambda i: (coverage(query, sentences[i]), -i))
    text = sentences[best]
    for following in sentences[best + 1 :]:
        if len(text) + 1 + len(following) > SNIPPET_CHARS:
            break
        text = f"{text} {following}"
    return clip(text, SNIPPET_CHARS)


def rank_gap(sources: Sequence[Source]) -> float:
    """The typical score gap between neighbouring passages: the unit sentence similarity is
    weighted in, whatever the scale of the earlier stage's scores (log-odds, RRF...)."""
    scores = [s.score for s in sources]
    if len(scores) < 2 or max(scores) == min(scores):
        return 1.0
    return (max(scores) - min(scores)) / (len(scores) - 1)


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


async def embedding_similarities(query: str, texts: Sequence[str], embed: Embed) -> list[float]:
    """Cosine similarity of each text to the query; EmbedError when the embedder fails."""
    query_rows, text_rows = await asyncio.gather(
        embed([query], embedder_pb2.TEXT_KIND_QUERY), embed(texts, embedder_pb2.TEXT_KIND_PASSAGE)
    )
    if query_rows.shape[0] != 1 or text_rows.shape != (len(texts), query_rows.shape[1]):
        raise EmbedError(f"unexpected embedding shapes {query_rows.shape} and {text_rows.shape}")
    sims = _unit_rows(text_rows) @ _unit_rows(query_rows)[0]
    return [float(x) for x in sims]


def lexical_similarities(query: str, texts: Sequence[str]) -> list[float]:
    """Share of the question's content words each text contains."""
    return [coverage(query, text) for text in texts]


async def best_sentences(
    query: str, sources: Sequence[Source], per_passage: int, embed: Embed
) -> tuple[list[Fact], str]:
    """The best ``per_passage`` sentences of each source as EXTRACTIVE facts, and why the
    embedder was not used ("" when it was)."""
    if not sources:
        return [], ""
    candidates = await asyncio.to_thread(lambda: [candidate_sentences(s.text, s.title) for s in sources])
    texts = [sentence for sentences in candidates for sentence in sentences]
    embedder_error = ""
    try:
        sims = await embedding_similarities(query, texts, embed)
    except EmbedError as exc:
        embedder_error = str(exc) or type(exc).__name__
        sims = await asyncio.to_thread(lexical_similarities, query, texts)
    weight = SENTENCE_WEIGHT * rank_gap(sources)
    facts: list[Fact] = []
    offset = 0
    for source, sentences in zip(sources, candidates, strict=True):
        own = sims[offset : offset + len(sentences)]
        offset += len(sentences)
        # Best similarity first; earlier sentences win ties (they tend to carry the topic).
        chosen = sorted(range(len(sentences)), key=lambda i: (-own[i], i))[:per_passage]
        facts.extend(
            Fact(sentences[i], source, EXTRACTIVE, source.score + weight * max(own[i], 0.0)) for i in chosen
        )
    return facts, embedder_error
