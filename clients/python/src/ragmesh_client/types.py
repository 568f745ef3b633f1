"""Typed results of the ragmesh client: plain frozen dataclasses, never protobuf messages.

Each response keeps the message it came from as ``raw`` (excluded from repr and comparison) for
callers that need a field this layer does not map yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Degradation:
    """A stage that did not contribute; the response came from the others."""

    # planner, embedder, index, sparse, reranker, hyde, extractor, narrator.
    stage: str
    # unavailable, deadline, breaker_open, error, invalid_output.
    reason: str
    message: str
    # Retrieval legs that lost input because of it: dense, bm25, exact.
    legs: tuple[str, ...] = ()
    # What served instead ("index_payload"), or "" for nothing.
    fallback: str = ""


@dataclass(frozen=True)
class Not:
    """A filter value: the key is not set to ``value`` (documents without the key match too)."""

    value: str


@dataclass(frozen=True)
class Exists:
    """A filter value: the key is set, to anything (use the ``EXISTS`` instance)."""


EXISTS = Exists()


@dataclass(frozen=True)
class Location:
    """Where a chunk lies in its document."""

    heading_path: tuple[str, ...] = ()
    ordinal: int = 0
    char_start: int = 0
    char_end: int = 0


@dataclass(frozen=True)
class SearchResult:
    chunk_id: str
    doc_id: str
    # The score the results are ordered by, non-increasing down the list (compare within one
    # response): the fused score in fused order, the reranker/fusion blend when reranked.
    score: float
    text: str
    title: str
    source_uri: str
    metadata: dict[str, str]
    location: Location
    fused_score: float
    fused_rank: int
    rerank_score: float | None = None
    # 1-based rank of the result in each retrieval leg that returned it.
    leg_ranks: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchResponse:
    results: tuple[SearchResult, ...]
    degradations: tuple[Degradation, ...]
    # The results are in the cross-encoder's judgement (false: fused order).
    reranked: bool
    # The query the legs searched (a follow-up's standalone rewrite, or the query).
    searched_query: str
    unknown_terms: tuple[str, ...]
    # Milliseconds per stage (planner, embed, dense, bm25, ..., total).
    timings: dict[str, float]
    request_id: str = ""
    raw: Any = field(default=None, repr=False, compare=False)
    # The unknown_terms no indexed word is one edit from: not misspellings but subjects the
    # collection never mentions.
    novel_terms: tuple[str, ...] = ()


@dataclass(frozen=True)
class Citation:
    """A source an answer cites as [number]."""

    number: int
    doc_id: str
    chunk_id: str
    title: str
    snippet: str
    source_uri: str
    metadata: dict[str, str]
    location: Location


@dataclass(frozen=True)
class Sentence:
    """A sentence of the verified answer with the sources it cites and how well they support it."""

    text: str
    # Citation numbers.
    sources: tuple[int, ...]
    # lexical, quoted or cross_encoder: the strongest check it passed.
    support_check: str
    # On that check's scale; None for quoted sentences.
    support_score: float | None


@dataclass(frozen=True)
class Source:
    """A passage read while answering, best first."""

    chunk_id: str
    doc_id: str
    title: str
    preview: str
    cited: bool
    rerank_score: float | None = None


@dataclass(frozen=True)
class Answer:
    # The verified answer, with its [n] citation markers.
    text: str
    # False when the documents do not answer the question (the text says so).
    answered: bool
    citations: tuple[Citation, ...]
    sentences: tuple[Sentence, ...]
    sources: tuple[Source, ...]
    degradations: tuple[Degradation, ...]
    # llm or extractive: the mode actually used.
    mode: str
    searched_query: str
    # Sources that disagree: (description, citation numbers).
    contradictions: tuple[tuple[str, tuple[int, ...]], ...]
    timings: dict[str, float]
    request_id: str = ""
    raw: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class AskProgress:
    """A stage of the answer finished (plan, search, extract)."""

    stage: str
    ms: float
    count: int


@dataclass(frozen=True)
class AskDelta:
    """Answer text as it is written (unverified: the final Answer is what was verified)."""

    text: str


# One event of ask_stream: progress, text, and last the verified answer.
AskEvent = AskProgress | AskDelta | Answer


@dataclass(frozen=True)
class Document:
    """A document to ingest. ``format``: markdown, text, html or pdf (``""``: from the file name
    for ingest_files, else text)."""

    doc_id: str
    content: bytes | str
    title: str = ""
    format: str = ""
    source_uri: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Submitted:
    doc_id: str
    # queued, unchanged (the same bytes are already indexed) or rejected (see reason).
    outcome: str
    content_sha256: str
    # Why the document was rejected (empty, undecodable, too large, bad id...); "" otherwise.
    reason: str = ""


class IngestResult(tuple[Submitted, ...]):
    """What ``ingest`` returns: a ``Submitted`` per document, in request order (it is a tuple of
    them), with the outcomes picked out. The API judges each document on its own: a rejected
    one is listed here with its reason while the others are stored and queued."""

    def _with(self, outcome: str) -> tuple[Submitted, ...]:
        return tuple(s for s in self if s.outcome == outcome)

    @property
    def queued(self) -> tuple[Submitted, ...]:
        return self._with("queued")

    @property
    def unchanged(self) -> tuple[Submitted, ...]:
        return self._with("unchanged")

    @property
    def rejected(self) -> tuple[Submitted, ...]:
        return self._with("rejected")

    @property
    def accepted(self) -> tuple[Submitted, ...]:
        """Stored and queued, or already indexed: every document that was not rejected."""
        return tuple(s for s in self if s.outcome != "rejected")


@dataclass(frozen=True)
class DocumentStatus:
    collection: str
    doc_id: str
    # queued, processing, indexed, failed, deleting, deleted.
    state: str
    reason: str
    attempts: int
    chunks: int
    content_sha256: str
    updated_at: datetime | None


@dataclass(frozen=True)
class CollectionCalibration:
    """The search choices calibrated for a collection (``ragmesh calibrate``) and what they were
    chosen on: the gateway applies them to searches that leave them unset."""

    rerank: bool
    # Leg name ("dense", "bm25", "exact") -> default RRF weight.
    weights: Mapping[str, float]
    # None: the server default.
    keep_fused_margin: float | None = None
    queries: int = 0
    documents: int = 0
    # System -> nDCG@10 on the pseudo-queries.
    measured: Mapping[str, float] = field(default_factory=dict)
    # reranked - fused on the pseudo-queries, with its 95% paired-bootstrap interval.
    rerank_gain: float = 0.0
    rerank_gain_low: float = 0.0
    rerank_gain_high: float = 0.0
    method: str = ""
    # Set by the server.
    calibrated_at: datetime | None = None
    embedder_sha256: str = ""


@dataclass(frozen=True)
class CollectionStatus:
    collection: str
    queued: int
    processing: int
    indexed: int
    failed: int
    deleting: int
    chunks: int
    calibration: CollectionCalibration | None = None


@dataclass(frozen=True)
class DeadLetter:
    sequence: int
    collection: str
    doc_id: str
    reason: str
    attempts: int
    failed_at: datetime | None


@dataclass(frozen=True)
class DeadLetterPage:
    dead_letters: tuple[DeadLetter, ...]
    # Pass as after_sequence for the next page; 0 when there are no more.
    next_after_sequence: int


@dataclass(frozen=True)
class ReplayResult:
    replayed: int
    superseded: int
    # Continue from here; 0 when this batch reached the end.
    next_after_sequence: int


@dataclass(frozen=True)
class DocumentSummary:
    """A document of a collection as ``list_documents`` reports it."""

    doc_id: str
    # queued, processing, indexed, failed, deleting (deleted documents are not listed).
    state: str
    # The source_uri of its latest submission.
    source_uri: str
    # sha256 of the bytes indexed, or of those pending.
    content_sha256: str


@dataclass(frozen=True)
class ReindexProgress:
    """Where a collection's reindex stands after one step (see ``reindex_step``)."""

    collection: str
    # building (the new generation is filling; readers use the old one), retiring (readers
    # switched; the old generation is being deleted) or done (no reindex in progress).
    phase: str
    # The generation readers use.
    serving_generation: int
    # The generation being built (building) or deleted (retiring); 0 when done.
    other_generation: int
    # building: documents the new generation must hold, how many it holds at their current
    # version, how many wait for a worker there, how many failed there (dead letters: the switch
    # waits until they are replayed and indexed).
    documents: int
    indexed: int
    pending: int
    failed: int
    # retiring: documents of the old generation not deleted yet.
    retiring: int
    # The embedder (model id) of the serving generation, and of the one being built once known.
    serving_model: str
    building_model: str
    raw: Any = field(default=None, repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.phase == "done"

    @property
    def stuck_on_failures(self) -> bool:
        """Building, nothing left in flight, and documents failed in the new generation: the
        switch waits until they are replayed (``replay_dead_letters``) and indexed."""
        return self.phase == "building" and self.failed > 0 and self.pending == 0
