"""Extracting the rows of a set of virtual buckets (meshkit.domain.ids.bucket_of) from a
collection's segments: what moving buckets between shards will copy. Every row carries its
document's bucket, so one bucket's rows are a numpy selection per segment; nothing is scanned
row by row."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from meshkit.domain.ids import bucket_of
from services.index import mutations as mut
from services.index.state import IndexState


@dataclass
class BucketExport:
    """Live rows of the buckets asked for (row i: ``chunk_ids[i]`` of ``doc_ids[i]``), and the
    fence and source of every document they hold, or that is a tombstone of those buckets."""

    chunk_ids: list[str] = field(default_factory=list)
    doc_ids: list[str] = field(default_factory=list)
    buckets: list[int] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    payloads: list[mut.Payload] = field(default_factory=list)
    fences: dict[str, int] = field(default_factory=dict)
    sources: dict[str, mut.Source] = field(default_factory=dict)

    def matrix(self, dimension: int) -> np.ndarray:
        return np.concatenate(self.vectors) if self.vectors else np.zeros((0, dimension), np.float32)

    def batch(self, dimension: int) -> mut.ChunkBatch:
        """The rows as one batch to write elsewhere."""
        return mut.ChunkBatch(
            list(self.chunk_ids), list(self.doc_ids), self.matrix(dimension), list(self.payloads)
        )


def export_buckets(state: IndexState, buckets: Iterable[int]) -> BucketExport:
    """The rows of ``buckets`` (read lock held by the caller)."""
    wanted = np.array(sorted(set(buckets)), dtype=np.uint16)
    out = BucketExport()
    for segment in state.segments:
        n = segment.rows
        rows = np.nonzero(np.isin(segment.buckets[:n], wanted) & ~segment.dead[:n])[0]
        if not len(rows):
            continue
        out.vectors.append(np.array(segment.vectors()[rows], dtype=np.float32))
        out.buckets += segment.buckets[rows].astype(int).tolist()
        for row in rows.tolist():
            out.chunk_ids.append(segment.chunk_id(row))
            out.doc_ids.append(segment.doc_id(row))
            out.payloads.append(segment.payload(row))
    for doc_id in dict.fromkeys(out.doc_ids):
        doc = state.docs.get(doc_id)
        if doc is not None:
            if doc.fence:
                out.fences[doc_id] = doc.fence
            if doc.source is not None:
                out.sources[doc_id] = doc.source
    # Tombstones (a fence, no rows) move with their bucket too: they still refuse stale writers.
    wanted_set = set(wanted.tolist())
    for doc_id, doc in state.docs.docs.items():
        if not doc.live and doc.fence and bucket_of(doc_id) in wanted_set:
            out.fences[doc_id] = doc.fence
    return out
