"""A search over a collection's segments: every segment (growing: exact; sealed: its ANN index,
or exact when small or flat) returns its best ``top_k`` live rows and the lists are merged.

A filter (doc ids, metadata clauses) is applied before ranking: it becomes the set of allowed
documents (the metadata inverted index), then the allowed live rows of each segment (numpy over
the segment's document numbers), and each segment ranks only those: exactly when they are few
(or the segment is exact), else through FAISS with an ID selector, rescored exactly when the ANN
comes back short. So ``top_k`` filtered results come back whenever that many exist.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from meshkit.domain.metadata import Clause, narrows
from services.index.records import Hit, StoredChunk
from services.index.segments import Segment
from services.index.state import IndexState

# A filtered ANN search scores a segment's allowed rows exactly when there are at most this many.
EXACT_FILTER_MAX = 8192


@dataclass
class Found:
    """The merged best rows of one search: row i is ``rows[i]`` of ``segments[i]``."""

    scores: np.ndarray
    segments: list[Segment]
    rows: list[int]

    def hits(self) -> list[Hit]:
        return [
            Hit(s.chunk_id(r), s.doc_id(r), float(score))
            for s, r, score in zip(self.segments, self.rows, self.scores.tolist(), strict=True)
        ]

    def stored(self, state: IndexState, count: int) -> list[StoredChunk]:
        return [state.stored(s, r) for s, r in zip(self.segments[:count], self.rows[:count], strict=True)]


def allowed_numbers(state: IndexState, doc_ids: list[str] | None, clauses: tuple[Clause, ...]) -> np.ndarray:
    """Global numbers of the documents with chunks a filter allows, sorted. The metadata index
    is keyed by number, so a filter costs what its clauses match, not a lookup per document."""
    docs = state.docs
    nums: Collection[int] | None = None
    if doc_ids:
        found = (docs.get(d) for d in doc_ids)
        nums = {s.num for s in found if s is not None and s.live}
    if clauses:
        if nums is None and not narrows(clauses):
            nums = docs.live_numbers()
        nums = docs.metadata.matching(clauses, nums)
    # Documents with metadata have a source, hence chunks; a stale one has no live rows anyway.
    allowed = np.fromiter(nums or (), dtype=np.int64)
    allowed.sort()
    return allowed


def _ann_filtered(
    segment: Segment, query: np.ndarray, k: int, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The segment's ANN index restricted to ``rows``; exact over them when it comes back short
    (the allowed rows may sit outside the probed lists / explored graph)."""
    k = min(k, len(rows))
    scores, found = segment.backend().search(query, k, rows)
    if len(found) >= k:
        return scores, found
    return segment.exact(query, k, rows)


def search(
    state: IndexState, query: np.ndarray, top_k: int, doc_ids: list[str] | None, clauses: tuple[Clause, ...]
) -> Found:
    """The best ``top_k`` live rows of the collection for ``query`` (1, dimension)."""
    nums = allowed_numbers(state, doc_ids, clauses) if doc_ids or clauses else None
    if nums is not None and not len(nums):
        return Found(np.zeros(0, np.float32), [], [])
    searched = [(i, s) for i, s in enumerate(state.segments) if s.live_count]
    allowed = {i: s.rows_of_docs(nums) for i, s in searched} if nums is not None else {}
    # Few allowed rows in all: scoring them exactly is cheaper than any index, and exact.
    exact = nums is not None and sum(len(r) for r in allowed.values()) <= EXACT_FILTER_MAX
    scores: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    for i, segment in searched:
        if nums is None:
            got_scores, got_rows = segment.search(query, top_k)
        elif not len(allowed[i]):
            continue
        elif exact or segment.backend().exact:
            got_scores, got_rows = segment.exact(query, top_k, allowed[i])
        else:
            got_scores, got_rows = _ann_filtered(segment, query, top_k, allowed[i])
        scores.append(got_scores.astype(np.float32, copy=False))
        owners.append(np.full(len(got_rows), i, dtype=np.int64))
        rows.append(got_rows)
    if not scores:
        return Found(np.zeros(0, np.float32), [], [])
    merged = np.concatenate(scores)
    order = np.argsort(-merged, kind="stable")[:top_k]
    segment_of = np.concatenate(owners)[order].tolist()
    return Found(merged[order], [state.segments[i] for i in segment_of], np.concatenate(rows)[order].tolist())
