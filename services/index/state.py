"""A collection index's in-memory state (backend, vector table, chunk and document maps, fences,
payloads, sources and their metadata index) and the primitives that change and read it: adding
and removing chunks, planning and applying a replacement, the targets of a delete, document
sources, FAISS id collisions, filtered and exact scoring, catching a rebuilt backend up, and
filling it from a snapshot.

None of it takes a lock or touches the disk: ``CollectionIndex`` (store.py) calls the changing
primitives under its state write lock, after the mutation is in the WAL, and the reading ones
under the read lock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from meshkit.core.errors import failed_precondition
from meshkit.domain.metadata import MetadataIndex
from services.index import mutations as mut
from services.index.backends import Backend, BackendConfig, VectorTable, build_backend, restore_backend
from services.index.records import faiss_id
from services.index.snapshots import LoadedSnapshot

log = logging.getLogger(__name__)

# A filtered ANN search scores the allowed vectors exactly when there are at most this many.
EXACT_FILTER_MAX = 8192


@dataclass
class ReplacePlan:
    remove: set[int]
    upserts: list[mut.ChunkBatch]
    missing: list[str]
    removed: int


@dataclass
class IndexState:
    """Everything searches read; replaced piecewise only under the state write lock."""

    backend: Backend
    table: VectorTable
    # FAISS id -> (chunk id, doc id), and doc id -> FAISS ids of its chunks.
    meta: dict[int, tuple[str, str]] = field(default_factory=dict)
    docs: dict[str, set[int]] = field(default_factory=dict)
    # doc id -> highest fence applied (kept after the document's chunks are gone).
    fences: dict[str, int] = field(default_factory=dict)
    # FAISS id -> the chunk's payload; doc id -> its source (documents with chunks only), and
    # the index of their metadata.
    payloads: dict[int, mut.Payload] = field(default_factory=dict)
    sources: dict[str, mut.Source] = field(default_factory=dict)
    metadata: MetadataIndex = field(default_factory=MetadataIndex)
    # FAISS ids changed while a rebuild works on a copy; None when no rebuild runs.
    touched: set[int] | None = None

    # ----- loading a snapshot -----

    def install(self, snap: LoadedSnapshot, config: BackendConfig) -> None:
        """Fill this (empty) state with a snapshot's chunks, backend, fences and payloads."""
        meta = snap.meta
        fids = np.array([faiss_id(c) for c in meta["chunk_ids"]], dtype=np.int64)
        self.table.put(fids, snap.vectors)
        for fid, chunk_id, doc_id in zip(fids.tolist(), meta["chunk_ids"], meta["doc_ids"], strict=True):
            self.meta[fid] = (chunk_id, doc_id)
            self.docs.setdefault(doc_id, set()).add(fid)
        try:
            backend = restore_backend(meta["index_type"], config, snap.index, meta["backend"], snap.positions)
            if len(backend) != len(fids):
                raise ValueError(f"index holds {len(backend)} vectors, the snapshot {len(fids)} ids")
        except ValueError as exc:
            # The vectors are authoritative; the FAISS file is only a cache of work.
            log.warning("snapshot index unusable, rebuilding from vectors", extra={"reason": str(exc)})
            backend = build_backend("flat", config, fids, snap.vectors)
        self.backend = backend
        self.fences = {str(d): int(f) for d, f in meta.get("fences", {}).items()}
        self.install_payloads(snap)

    def install_payloads(self, snap: LoadedSnapshot) -> None:
        """Payloads and sources of the snapshot; snapshots written before them have none."""
        for chunk_id, raw in snap.payloads.get("chunks", {}).items():
            fid = faiss_id(chunk_id)
            if self.meta.get(fid, ("",))[0] == chunk_id:
                self.payloads[fid] = mut.Payload.from_json(raw)
        for doc_id, raw in snap.payloads.get("sources", {}).items():
            if doc_id in self.docs:
                self.set_source(doc_id, mut.Source.from_json(raw))

    # ----- sources and fences -----

    def prior_sources(self, documents: list[mut.Replacement]) -> dict[str, mut.Source]:
        return {d.doc_id: self.sources[d.doc_id] for d in documents if d.doc_id in self.sources}

    def apply_sources(self, documents: list[mut.Replacement], prior: dict[str, mut.Source]) -> None:
        """After a replacement's chunks are in place: each document that has chunks gets the
        source it brought, or keeps the one it had (a writer that sent none)."""
        for doc in documents:
            source = doc.source if doc.source is not None else prior.get(doc.doc_id)
            if source is not None and doc.doc_id in self.docs:
                self.set_source(doc.doc_id, source)

    def set_source(self, doc_id: str, source: mut.Source) -> None:
        self.sources[doc_id] = source
        self.metadata.put(doc_id, dict(source.metadata))

    def fence_changes(self, documents: list[mut.Replacement]) -> dict[str, int]:
        stored = self.fences
        return {d.doc_id: d.fence for d in documents if d.fence > stored.get(d.doc_id, 0)}

    # ----- planning a mutation -----

    def check_collisions(self, chunk_ids: list[str], collection: str) -> None:
        """Two chunk ids sharing a 60-bit FAISS id would silently overwrite each other."""
        seen: dict[int, str] = {}
        for chunk_id in chunk_ids:
            fid = faiss_id(chunk_id)
            other = seen.setdefault(fid, chunk_id)
            stored = self.meta.get(fid)
            if stored is not None and stored[0] != chunk_id:
                other = stored[0]
            if other != chunk_id:
                log.error("FAISS id collision", extra={"chunk_id": chunk_id, "other": other})
                raise failed_precondition(
                    f"chunk_id {chunk_id} collides with chunk_id {other} in the 60-bit FAISS id space "
                    f"of collection {collection}; refusing to overwrite it"
                )

    def plan_replace(self, documents: list[mut.Replacement]) -> ReplacePlan:
        remove: set[int] = set()
        missing: list[str] = []
        upserted_ids: set[int] = set()
        for doc in documents:
            new_ids = {faiss_id(c) for c in doc.upserts.chunk_ids}
            upserted_ids |= new_ids
            kept: set[int] = set()
            for chunk_id in doc.keep_chunk_ids:
                fid = faiss_id(chunk_id)
                if self.meta.get(fid) == (chunk_id, doc.doc_id):
                    kept.add(fid)
                elif fid not in new_ids:
                    missing.append(chunk_id)
            remove |= self.docs.get(doc.doc_id, set()) - new_ids - kept
        removed = len(remove - upserted_ids)
        return ReplacePlan(remove, [d.upserts for d in documents if d.upserts.chunk_ids], missing, removed)

    def delete_targets(self, chunk_ids: list[str], doc_ids: list[str]) -> set[int]:
        targets = {fid for c in chunk_ids if (fid := faiss_id(c)) in self.meta and self.meta[fid][0] == c}
        for doc_id in doc_ids:
            targets |= self.docs.get(doc_id, set())
        return targets

    # ----- changing the state (under the state write lock) -----

    def apply_plan(self, plan: ReplacePlan) -> None:
        # Removals first: a chunk may move from a replaced document into another one.
        self.remove(plan.remove)
        for batch in plan.upserts:
            self.add(batch)

    def remove(self, fids: Iterable[int]) -> None:
        ids = np.fromiter(fids, dtype=np.int64)
        if not len(ids):
            return
        self.backend.remove(ids)
        self.table.remove(ids)
        for fid in ids.tolist():
            _chunk_id, doc_id = self.meta.pop(fid)
            self.payloads.pop(fid, None)
            members = self.docs[doc_id]
            members.discard(fid)
            if not members:
                # A document without chunks has no source either (a replacement that refills
                # it sets the source again).
                del self.docs[doc_id]
                self.sources.pop(doc_id, None)
                self.metadata.remove(doc_id)
        if self.touched is not None:
            self.touched.update(ids.tolist())

    def add(self, batch: mut.ChunkBatch) -> None:
        ids = np.array([faiss_id(c) for c in batch.chunk_ids], dtype=np.int64)
        self.remove(fid for fid in ids.tolist() if fid in self.meta)  # overwrite = remove + add
        self.backend.add(ids, batch.vectors)
        self.table.put(ids, batch.vectors)
        for fid, chunk_id, doc_id in zip(ids.tolist(), batch.chunk_ids, batch.doc_ids, strict=True):
            self.meta[fid] = (chunk_id, doc_id)
            self.docs.setdefault(doc_id, set()).add(fid)
        for fid, payload in zip(ids.tolist(), batch.payloads, strict=False):
            self.payloads[fid] = payload
        if self.touched is not None:
            self.touched.update(ids.tolist())

    def catch_up(self, backend: Backend) -> None:
        """Replay onto a backend rebuilt from a copy the chunks changed while it was built."""
        touched = self.touched or set()
        self.touched = None
        if not touched:
            return
        ids = np.fromiter(touched, dtype=np.int64, count=len(touched))
        backend.remove(ids)
        live = np.array([fid for fid in ids.tolist() if fid in self.table], dtype=np.int64)
        if len(live):
            backend.add(live, self.table.gather(live))

    # ----- scoring (under the state read lock) -----

    def filtered_search(self, q: np.ndarray, top_k: int, doc_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        allowed_set: set[int] = set()
        for doc_id in doc_ids:
            allowed_set |= self.docs.get(doc_id, set())
        if not allowed_set:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        allowed = np.fromiter(allowed_set, dtype=np.int64, count=len(allowed_set))
        k = min(top_k, len(allowed))
        if self.backend.exact:
            return self.backend.search(q, k, allowed)
        # ANN with a selector can come back short (the allowed vectors may sit outside the
        # probed lists / explored graph); a small allowed set is cheaper to score exactly anyway.
        if len(allowed) > EXACT_FILTER_MAX:
            scores, ids = self.backend.search(q, k, allowed)
            if int((ids >= 0).sum()) >= k:
                return scores, ids
        return self.exact_scores(q, allowed, k)

    def exact_scores(self, q: np.ndarray, allowed: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores = self.table.gather(allowed) @ q[0]
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        order = top[np.argsort(-scores[top], kind="stable")]
        return scores[order], allowed[order]
