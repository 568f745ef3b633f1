"""A collection index's in-memory state: its segments (sealed ones in order, the growing one
last), its documents (docs.DocTable), and the primitives that change and read them: adding and
deleting rows, planning and applying a replacement, the targets of a delete, document sources
and fences, FAISS id collisions, and freezing the growing segment at its size.

None of it takes a lock or touches the disk: ``CollectionIndex`` (store.py) calls the changing
primitives under its state write lock, after the mutation is in the WAL, and the reading ones
under the read lock. Applying a mutation depends only on the state and the mutation (the
growing segment freezes at the same entry on every replica), so replicas agree.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from meshkit.core.errors import failed_precondition
from meshkit.domain.ids import bucket_of
from services.index import mutations as mut
from services.index.docs import DocTable
from services.index.records import IndexPolicy, StoredChunk, faiss_id
from services.index.segment_files import FileRef, encode_payload
from services.index.segments import SEALED, GrowingSegment, Segment, chunk_bytes, fids_of

log = logging.getLogger(__name__)

# Rows grouped by the segment holding them.
Rows = dict[Segment, set[int]]


@dataclass
class ReplacePlan:
    remove: Rows
    upserts: list[mut.ChunkBatch]
    missing: list[str]
    removed: int


@dataclass
class IndexState:
    """Everything searches read; changed only under the collection's state write lock."""

    policy: IndexPolicy
    docs: DocTable = field(default_factory=DocTable)
    segments: list[Segment] = field(default_factory=list)
    next_sid: int = 0
    # Committed runs of document records (docs.py), oldest first.
    doc_runs: list[FileRef] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.segments:
            self.new_growing()

    # ----- segments -----

    @property
    def growing(self) -> GrowingSegment:
        segment = self.segments[-1]
        assert isinstance(segment, GrowingSegment)
        return segment

    def new_growing(self) -> GrowingSegment:
        segment = GrowingSegment(self.next_sid, self.policy.dimension, self.policy.segment_rows)
        self.next_sid += 1
        self.segments.append(segment)
        return segment

    def maybe_freeze(self) -> bool:
        """Freeze the growing segment once it holds more than ``segment_rows`` rows (checked
        after a whole entry: every replica freezes at the same one) and start a new one."""
        if self.growing.rows <= self.policy.segment_rows:
            return False
        self.growing.freeze()
        self.new_growing()
        return True

    @property
    def chunks(self) -> int:
        return sum(s.live_count for s in self.segments)

    def index_type(self) -> str:
        """An explicit policy type, or (auto) the index of the largest sealed segment."""
        if self.policy.index_type != "auto":
            return self.policy.index_type
        sealed = [s for s in self.segments if s.state == SEALED]
        return max(sealed, key=lambda s: s.rows).backend_kind if sealed else "flat"

    # ----- lookups (read lock) -----

    def live_rows_of_fids(self, fids: np.ndarray) -> list[tuple[Segment, np.ndarray, np.ndarray]]:
        """(segment, indices into ``fids``, rows) of the live rows holding those FAISS ids."""
        found = []
        for segment in self.segments:
            index, rows = segment.locate(fids)
            if len(rows):
                found.append((segment, index, rows))
        return found

    def locate(self, chunk_ids: list[str]) -> dict[str, tuple[Segment, int]]:
        """Where each chunk id of ``chunk_ids`` is live (exactly that id)."""
        if not chunk_ids:
            return {}
        wanted = chunk_bytes(chunk_ids)
        found: dict[str, tuple[Segment, int]] = {}
        fids = np.array([faiss_id(c) for c in chunk_ids], dtype=np.int64)
        for segment, index, rows in self.live_rows_of_fids(fids):
            for i, row in zip(index.tolist(), rows.tolist(), strict=True):
                if np.array_equal(segment.chunks[row], wanted[i]):
                    found[chunk_ids[i]] = (segment, row)
        return found

    def doc_rows(self, doc_id: str) -> list[tuple[Segment, np.ndarray]]:
        state = self.docs.get(doc_id)
        if state is None or not state.live:
            return []
        found = [(s, s.rows_of(state.num)) for s in self.segments]
        return [(s, rows) for s, rows in found if len(rows)]

    def stored_chunks(self, chunk_ids: list[str]) -> list[StoredChunk]:
        """The stored chunks of ``chunk_ids`` held here, in request order (a chunk written
        without a payload comes back with an empty one)."""
        where = self.locate(chunk_ids)
        return [self.stored(*where[c]) for c in chunk_ids if c in where]

    def stored(self, segment: Segment, row: int) -> StoredChunk:
        doc_id = segment.doc_id(row)
        source = self.docs.source(doc_id) or mut.Source()
        return StoredChunk(segment.chunk_id(row), doc_id, segment.payload(row), source)

    def chunk_ids_of(self, doc_id: str) -> list[str]:
        return sorted(s.chunk_id(r) for s, rows in self.doc_rows(doc_id) for r in rows.tolist())

    # ----- sources and fences -----

    def prior_sources(self, documents: list[mut.Replacement]) -> dict[str, mut.Source]:
        found = {d.doc_id: self.docs.source(d.doc_id) for d in documents}
        return {d: s for d, s in found.items() if s is not None}

    def apply_sources(self, documents: list[mut.Replacement], prior: dict[str, mut.Source]) -> None:
        """After a replacement's chunks are in place: each document that has chunks gets the
        source it brought, or keeps the one it had (a writer that sent none)."""
        for doc in documents:
            source = doc.source if doc.source is not None else prior.get(doc.doc_id)
            state = self.docs.get(doc.doc_id)
            if source is not None and state is not None and state.live:
                self.docs.set_source(doc.doc_id, source)

    def fence_changes(self, documents: list[mut.Replacement]) -> dict[str, int]:
        return {d.doc_id: d.fence for d in documents if d.fence > self.docs.fence(d.doc_id)}

    def apply_fences(self, fences: dict[str, int]) -> None:
        for doc_id, fence in fences.items():
            self.docs.set_fence(doc_id, fence)

    # ----- planning a mutation -----

    def check_collisions(self, chunk_ids: list[str], collection: str) -> None:
        """Two chunk ids sharing a 60-bit FAISS id would silently overwrite each other."""
        fids = np.array([faiss_id(c) for c in chunk_ids], dtype=np.int64)
        stored: dict[int, str] = {}
        for segment, _index, rows in self.live_rows_of_fids(fids):
            for row in rows.tolist():
                stored[int(fids_of(segment.chunks[row : row + 1])[0])] = segment.chunk_id(row)
        seen: dict[int, str] = {}
        for fid, chunk_id in zip(fids.tolist(), chunk_ids, strict=True):
            other = seen.setdefault(fid, chunk_id)
            if stored.get(fid, chunk_id) != chunk_id:
                other = stored[fid]
            if other != chunk_id:
                log.error("FAISS id collision", extra={"chunk_id": chunk_id, "other": other})
                raise failed_precondition(
                    f"chunk_id {chunk_id} collides with chunk_id {other} in the 60-bit FAISS id space "
                    f"of collection {collection}; refusing to overwrite it"
                )

    def plan_replace(self, documents: list[mut.Replacement]) -> ReplacePlan:
        remove: Rows = defaultdict(set)
        removed_fids: set[int] = set()
        missing: list[str] = []
        upserted: set[int] = set()
        for doc in documents:
            new_ids = {faiss_id(c) for c in doc.upserts.chunk_ids}
            upserted |= new_ids
            kept: set[int] = set()
            where = self.locate(doc.keep_chunk_ids)
            for chunk_id in doc.keep_chunk_ids:
                fid = faiss_id(chunk_id)
                loc = where.get(chunk_id)
                if loc is not None and loc[0].doc_id(loc[1]) == doc.doc_id:
                    kept.add(fid)
                elif fid not in new_ids:
                    missing.append(chunk_id)
            for segment, rows in self.doc_rows(doc.doc_id):
                for row, fid in zip(rows.tolist(), fids_of(segment.chunks[rows]).tolist(), strict=True):
                    if fid not in new_ids and fid not in kept:
                        remove[segment].add(row)
                        removed_fids.add(fid)
        upserts = [d.upserts for d in documents if d.upserts.chunk_ids]
        return ReplacePlan(dict(remove), upserts, missing, len(removed_fids - upserted))

    def delete_targets(self, chunk_ids: list[str], doc_ids: list[str]) -> Rows:
        targets: Rows = defaultdict(set)
        for segment, row in self.locate(chunk_ids).values():
            targets[segment].add(row)
        for doc_id in doc_ids:
            for segment, rows in self.doc_rows(doc_id):
                targets[segment].update(rows.tolist())
        return dict(targets)

    # ----- changing the state (state write lock) -----

    def apply_plan(self, plan: ReplacePlan) -> None:
        # Removals first: a chunk may move from a replaced document into another one.
        self.remove(plan.remove)
        for batch in plan.upserts:
            self.add(batch)

    def remove(self, targets: Rows) -> None:
        for segment, rows in targets.items():
            if not rows:
                continue
            ordered = np.array(sorted(rows), dtype=np.int64)
            counts = Counter(segment.doc_id(r) for r in ordered.tolist())
            segment.mark_dead(ordered)
            for doc_id, n in counts.items():
                self.docs.remove_live(doc_id, n)

    def add(self, batch: mut.ChunkBatch) -> None:
        """Append the batch to the growing segment; a chunk id already live anywhere is an
        overwrite: its old row is deleted (within the batch the last occurrence wins)."""
        last = {faiss_id(c): i for i, c in enumerate(batch.chunk_ids)}
        keep = sorted(last.values())
        if not keep:
            return
        chunk_ids = [batch.chunk_ids[i] for i in keep]
        doc_ids = [batch.doc_ids[i] for i in keep]
        fids = np.array([faiss_id(c) for c in chunk_ids], dtype=np.int64)
        old: Rows = defaultdict(set)
        for segment, _index, rows in self.live_rows_of_fids(fids):
            old[segment].update(rows.tolist())
        self.remove(dict(old))
        nums = {d: self.docs.add_live(d, n).num for d, n in Counter(doc_ids).items()}
        buckets = {d: bucket_of(d) for d in nums}
        payloads = [batch.payloads[i] for i in keep] if batch.payloads else []
        self.growing.append(
            chunk_bytes(chunk_ids),
            [nums[d] for d in doc_ids],
            doc_ids,
            np.ascontiguousarray(batch.vectors[keep], dtype=np.float32),
            np.array([buckets[d] for d in doc_ids], dtype=np.uint16),
            [encode_payload(p) for p in payloads] if payloads else [b""] * len(keep),
        )
