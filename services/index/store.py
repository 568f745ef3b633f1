"""One collection's dense index on this shard: FAISS backend + side store + WAL + snapshots.

Write path (the shard's log applier calls it for every entry of the replicated log, in order):
validate against the current state, append the mutation to the WAL (fsynced, with the log
position it came from), then apply it in memory. A crash before the fsync loses nothing the log
does not still hold; a crash after it is repaired by replaying the WAL on top of the latest
snapshot. Every step depends only on the state and the mutation, so replicas applying the same
log agree.

Payloads: each chunk keeps the text and location its writer sent, each document its title,
source URI and metadata (``Source``), so results can be shown and cited without the sparse
service; they are logged, snapshotted and replayed with the vectors. Metadata is indexed
(meshkit.metadata) and a search's metadata filter becomes the set of allowed documents before
FAISS ranks anything, so ``top_k`` is honoured.

Fences: each document keeps the highest fence a replacement brought it (also once its chunks
are gone: a tombstone). A replacement with a lower fence is refused (``stale_doc_ids``) and
changes nothing; an equal one is applied again (a writer's retry); fence 0 is unfenced (Upsert,
Delete, callers without a claim) and leaves the stored fence as it is.

Locks (always taken in this order):
- ``_write_lock`` serialises mutations, and lets a snapshot see a state and a WAL position
  that match;
- ``_state`` (readers-writer) guards the in-memory state: searches share it, applying a
  mutation or swapping in a rebuilt backend takes it alone, briefly (never across an fsync
  or a snapshot write).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from meshkit.errors import failed_precondition
from meshkit.fsutil import fsync_dir, write_atomic
from meshkit.metadata import Clause, MetadataIndex
from services.index import mutations as mut
from services.index.backends import (
    Backend,
    BackendConfig,
    HNSWBackend,
    IVFBackend,
    VectorTable,
    build_backend,
    restore_backend,
)
from services.index.metrics import (
    PENDING_WAL,
    REBUILDS,
    SEARCH_LATENCY,
    SNAPSHOT_SECONDS,
    SNAPSHOTS,
    VECTORS,
    WAL_APPEND_LATENCY,
    WAL_APPENDS,
    WAL_TORN_TAILS,
)
from services.index.rwlock import RWLock
from services.index.snapshots import (
    LoadedSnapshot,
    SnapshotData,
    current_snapshot_dir,
    prune,
    read_snapshot,
    write_snapshot,
)
from services.index.wal import WriteAheadLog

log = logging.getLogger(__name__)

IndexType = Literal["auto", "flat", "ivf", "hnsw"]
IDENTITY_FILE = "collection.json"
# Hex chars of a chunk id that make its FAISS id: 60 bits, so it is always a positive int64.
_FAISS_ID_HEX = 15
# Explicit 'ivf' stays exact below this size: k-means on a handful of vectors is noise.
MIN_IVF_VECTORS = 1000
# Retrain IVF when the collection has grown (or shrunk) this much since it was trained.
IVF_RETRAIN_FACTOR = 4
# Auto falls back to exact search below this share of index_ann_threshold (hysteresis).
AUTO_SHRINK_RATIO = 0.5
# HNSW is rebuilt once deleted-but-present entries exceed this share of its graph.
HNSW_TOMBSTONE_RATIO = 0.2
# A filtered ANN search scores the allowed vectors exactly when there are at most this many.
EXACT_FILTER_MAX = 8192


def faiss_id(chunk_id: str) -> int:
    return int(chunk_id[:_FAISS_ID_HEX], 16)


class CollectionMismatch(RuntimeError):
    """Data on disk belongs to another layout (dimension, shard count, collection)."""


@dataclass(frozen=True)
class IndexPolicy:
    dimension: int
    index_type: IndexType = "auto"
    ann_threshold: int = 50_000
    ivf_nprobe: int = 16
    hnsw_m: int = 32
    hnsw_ef_search: int = 128

    def backend_config(self) -> BackendConfig:
        return BackendConfig(self.dimension, self.ivf_nprobe, self.hnsw_m, self.hnsw_ef_search)


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    doc_id: str
    score: float


@dataclass(frozen=True)
class StoredChunk:
    chunk_id: str
    doc_id: str
    payload: mut.Payload
    source: mut.Source


@dataclass(frozen=True)
class ReplaceResult:
    upserted: int
    removed: int
    missing_chunk_ids: list[str]
    stale_doc_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DocumentEntry:
    doc_id: str
    fence: int
    chunk_ids: list[str]


@dataclass(frozen=True)
class CollectionStats:
    chunks: int
    documents: int
    index_type: str
    dimension: int
    sequence: int
    snapshot_sequence: int
    log_position: int = 0

    @property
    def pending_wal_records(self) -> int:
        return self.sequence - self.snapshot_sequence


@dataclass(frozen=True)
class SnapshotOutcome:
    sequence: int
    directory: Path | None
    written: bool


@dataclass
class _ReplacePlan:
    remove: set[int]
    upserts: list[mut.ChunkBatch]
    missing: list[str]
    removed: int


@dataclass
class _State:
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


class CollectionIndex:
    def __init__(
        self, name: str, directory: Path, policy: IndexPolicy, *, shard: int = 0, shard_count: int = 1
    ) -> None:
        self.name = name
        self.directory = directory
        self.policy = policy
        self.shard = shard
        self.shard_count = shard_count
        config = policy.backend_config()
        initial: Backend = build_backend(
            "hnsw" if policy.index_type == "hnsw" else "flat",
            config,
            np.zeros(0, dtype=np.int64),
            np.zeros((0, policy.dimension), dtype=np.float32),
        )
        self._s = _State(initial, VectorTable(policy.dimension))
        self._state = RWLock()
        self._write_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._rebuild_lock = threading.Lock()
        self._wal = WriteAheadLog(directory / "wal")
        self._applied_seq = 0
        self._snapshot_seq = 0
        # Log position of the last entry applied here, and the log it belongs to (snapshots).
        self._log_pos = 0
        # Where in the log the current snapshot ends, and which log that is.
        self._snapshot_log_pos = 0
        self.snapshot_log_id = ""
        self._snapshot_dir: Path | None = None
        self._layout_changed = False
        # FAISS ids changed while a rebuild works on a copy; None when no rebuild runs.
        self._touched: set[int] | None = None
        self.last_snapshot_at = time.monotonic()

    # ----- opening -----

    @classmethod
    def open(
        cls, name: str, directory: Path, policy: IndexPolicy, *, shard: int = 0, shard_count: int = 1
    ) -> CollectionIndex:
        """Load the current snapshot, replay the WAL after it, and get ready for writes."""
        index = cls(name, directory, policy, shard=shard, shard_count=shard_count)
        index._check_identity()
        snapshot_dir = current_snapshot_dir(directory)
        if snapshot_dir is not None:
            index._install(read_snapshot(snapshot_dir))
            index._snapshot_dir = snapshot_dir
        prune(directory, keep=snapshot_dir)
        replayed = index._wal.recover(index._snapshot_seq, index._replay)
        if index._wal.torn_bytes_dropped:
            WAL_TORN_TAILS.inc()
        index._publish_gauges()
        log.info(
            "collection loaded",
            extra={
                "collection": name,
                "chunks": len(index._s.table),
                "snapshot_sequence": index._snapshot_seq,
                "wal_replayed": replayed,
                "index_type": index._s.backend.kind,
            },
        )
        return index

    def _check_identity(self) -> None:
        identity = {
            "collection": self.name,
            "dimension": self.policy.dimension,
            "shard": self.shard,
            "shard_count": self.shard_count,
        }
        path = self.directory / IDENTITY_FILE
        if path.exists():
            stored = json.loads(path.read_text())
            if stored != identity:
                raise CollectionMismatch(
                    f"{self.directory} holds {stored}, this process is configured for {identity}: "
                    "refusing to mix layouts (reshard or re-index into a fresh data dir)"
                )
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(identity).encode())
        fsync_dir(self.directory.parent)

    def _install(self, snap: LoadedSnapshot) -> None:
        meta = snap.meta
        expected = (
            ("dimension", self.policy.dimension),
            ("shard", self.shard),
            ("shard_count", self.shard_count),
        )
        for key, want in expected:
            if meta[key] != want:
                raise CollectionMismatch(f"snapshot of {self.name} has {key}={meta[key]}, expected {want}")
        fids = np.array([faiss_id(c) for c in meta["chunk_ids"]], dtype=np.int64)
        s = self._s
        s.table.put(fids, snap.vectors)
        for fid, chunk_id, doc_id in zip(fids.tolist(), meta["chunk_ids"], meta["doc_ids"], strict=True):
            s.meta[fid] = (chunk_id, doc_id)
            s.docs.setdefault(doc_id, set()).add(fid)
        try:
            backend = restore_backend(
                meta["index_type"], self.policy.backend_config(), snap.index, meta["backend"], snap.positions
            )
            if len(backend) != len(fids):
                raise ValueError(f"index holds {len(backend)} vectors, the snapshot {len(fids)} ids")
        except ValueError as exc:
            # The vectors are authoritative; the FAISS file is only a cache of work.
            log.warning("snapshot index unusable, rebuilding from vectors", extra={"reason": str(exc)})
            backend = build_backend("flat", self.policy.backend_config(), fids, snap.vectors)
        s.backend = backend
        s.fences = {str(d): int(f) for d, f in meta.get("fences", {}).items()}
        self._install_payloads(snap)
        self._applied_seq = self._snapshot_seq = snap.sequence
        self._log_pos = self._snapshot_log_pos = int(meta.get("log_pos", 0))
        self.snapshot_log_id = str(meta.get("log", ""))

    def _install_payloads(self, snap: LoadedSnapshot) -> None:
        """Payloads and sources of the snapshot; snapshots written before them have none."""
        s = self._s
        for chunk_id, raw in snap.payloads.get("chunks", {}).items():
            fid = faiss_id(chunk_id)
            if s.meta.get(fid, ("",))[0] == chunk_id:
                s.payloads[fid] = mut.Payload.from_json(raw)
        for doc_id, raw in snap.payloads.get("sources", {}).items():
            if doc_id in s.docs:
                self._set_source(doc_id, mut.Source.from_json(raw))

    def _replay(self, seq: int, payload: bytes) -> None:
        record = mut.decode_record(payload, self.policy.dimension)
        mutation = record.mutation
        with self._state.write():
            if isinstance(mutation, mut.Upsert):
                self._add(mutation.chunks)
            elif isinstance(mutation, mut.Replace):
                prior = self._prior_sources(mutation.documents)
                self._apply_plan(self._plan_replace(mutation.documents))
                self._s.fences.update(self._fence_changes(mutation.documents))
                self._apply_sources(mutation.documents, prior)
            else:
                self._remove(self._delete_targets(mutation.chunk_ids, mutation.doc_ids))
            self._applied_seq = seq
            self._log_pos = max(self._log_pos, record.pos)

    def close(self) -> None:
        with self._write_lock:
            self._wal.close()

    # ----- writes -----

    # ``pos`` is the log position of the entry being applied (0: not from a log).

    def upsert(self, chunks: mut.ChunkBatch, pos: int = 0) -> int:
        if not chunks.chunk_ids:
            return 0
        with self._write_lock:
            self._check_collisions(chunks.chunk_ids)
            seq = self._log(mut.Upsert(chunks), pos)
            with self._state.write():
                self._add(chunks)
                self._applied(seq, pos)
        self._publish_gauges()
        return len(chunks.chunk_ids)

    def replace_documents(self, documents: list[mut.Replacement], pos: int = 0) -> ReplaceResult:
        with self._write_lock:
            with self._state.read():
                stored = self._s.fences
                stale = [d.doc_id for d in documents if 0 < d.fence < stored.get(d.doc_id, 0)]
                accepted = [d for d in documents if not 0 < d.fence < stored.get(d.doc_id, 0)]
            self._check_collisions([c for d in accepted for c in d.upserts.chunk_ids])
            with self._state.read():
                plan = self._plan_replace(accepted)
                fences = self._fence_changes(accepted)
                prior = self._prior_sources(accepted)
                sources_changed = any(d.source not in (None, prior.get(d.doc_id)) for d in accepted)
            upserted = sum(len(b.chunk_ids) for b in plan.upserts)
            if plan.remove or upserted or fences or sources_changed:
                seq = self._log(mut.Replace(accepted), pos)
                with self._state.write():
                    self._apply_plan(plan)
                    self._s.fences.update(fences)
                    self._apply_sources(accepted, prior)
                    self._applied(seq, pos)
        self._publish_gauges()
        return ReplaceResult(upserted, plan.removed, plan.missing, stale)

    def delete(self, chunk_ids: list[str], doc_ids: list[str], pos: int = 0) -> int:
        with self._write_lock:
            with self._state.read():
                targets = self._delete_targets(chunk_ids, doc_ids)
            if not targets:
                return 0  # nothing to do, nothing to log
            seq = self._log(mut.Delete(chunk_ids, doc_ids), pos)
            with self._state.write():
                self._remove(targets)
                self._applied(seq, pos)
        self._publish_gauges()
        return len(targets)

    def _applied(self, seq: int, pos: int) -> None:
        self._applied_seq = seq
        self._log_pos = max(self._log_pos, pos)

    def _prior_sources(self, documents: list[mut.Replacement]) -> dict[str, mut.Source]:
        return {d.doc_id: self._s.sources[d.doc_id] for d in documents if d.doc_id in self._s.sources}

    def _apply_sources(self, documents: list[mut.Replacement], prior: dict[str, mut.Source]) -> None:
        """After a replacement's chunks are in place: each document that has chunks gets the
        source it brought, or keeps the one it had (a writer that sent none)."""
        for doc in documents:
            source = doc.source if doc.source is not None else prior.get(doc.doc_id)
            if source is not None and doc.doc_id in self._s.docs:
                self._set_source(doc.doc_id, source)

    def _set_source(self, doc_id: str, source: mut.Source) -> None:
        self._s.sources[doc_id] = source
        self._s.metadata.put(doc_id, dict(source.metadata))

    def _fence_changes(self, documents: list[mut.Replacement]) -> dict[str, int]:
        stored = self._s.fences
        return {d.doc_id: d.fence for d in documents if d.fence > stored.get(d.doc_id, 0)}

    def _log(self, mutation: mut.Mutation, pos: int = 0) -> int:
        started = time.perf_counter()
        seq = self._wal.append(mut.encode(mutation, pos=pos))
        WAL_APPEND_LATENCY.observe(time.perf_counter() - started)
        WAL_APPENDS.labels(mut.op_name(mutation)).inc()
        return seq

    def _check_collisions(self, chunk_ids: list[str]) -> None:
        """Two chunk ids sharing a 60-bit FAISS id would silently overwrite each other."""
        seen: dict[int, str] = {}
        for chunk_id in chunk_ids:
            fid = faiss_id(chunk_id)
            other = seen.setdefault(fid, chunk_id)
            stored = self._s.meta.get(fid)
            if stored is not None and stored[0] != chunk_id:
                other = stored[0]
            if other != chunk_id:
                log.error("FAISS id collision", extra={"chunk_id": chunk_id, "other": other})
                raise failed_precondition(
                    f"chunk_id {chunk_id} collides with chunk_id {other} in the 60-bit FAISS id space "
                    f"of collection {self.name}; refusing to overwrite it"
                )

    def _plan_replace(self, documents: list[mut.Replacement]) -> _ReplacePlan:
        s = self._s
        remove: set[int] = set()
        missing: list[str] = []
        upserted_ids: set[int] = set()
        for doc in documents:
            new_ids = {faiss_id(c) for c in doc.upserts.chunk_ids}
            upserted_ids |= new_ids
            kept: set[int] = set()
            for chunk_id in doc.keep_chunk_ids:
                fid = faiss_id(chunk_id)
                if s.meta.get(fid) == (chunk_id, doc.doc_id):
                    kept.add(fid)
                elif fid not in new_ids:
                    missing.append(chunk_id)
            remove |= s.docs.get(doc.doc_id, set()) - new_ids - kept
        removed = len(remove - upserted_ids)
        return _ReplacePlan(remove, [d.upserts for d in documents if d.upserts.chunk_ids], missing, removed)

    def _apply_plan(self, plan: _ReplacePlan) -> None:
        # Removals first: a chunk may move from a replaced document into another one.
        self._remove(plan.remove)
        for batch in plan.upserts:
            self._add(batch)

    def _delete_targets(self, chunk_ids: list[str], doc_ids: list[str]) -> set[int]:
        s = self._s
        targets = {fid for c in chunk_ids if (fid := faiss_id(c)) in s.meta and s.meta[fid][0] == c}
        for doc_id in doc_ids:
            targets |= s.docs.get(doc_id, set())
        return targets

    # Both primitives run under the state write lock.

    def _remove(self, fids: Iterable[int]) -> None:
        s = self._s
        ids = np.fromiter(fids, dtype=np.int64)
        if not len(ids):
            return
        s.backend.remove(ids)
        s.table.remove(ids)
        for fid in ids.tolist():
            _chunk_id, doc_id = s.meta.pop(fid)
            s.payloads.pop(fid, None)
            members = s.docs[doc_id]
            members.discard(fid)
            if not members:
                # A document without chunks has no source either (a replacement that refills
                # it sets the source again).
                del s.docs[doc_id]
                s.sources.pop(doc_id, None)
                s.metadata.remove(doc_id)
        if self._touched is not None:
            self._touched.update(ids.tolist())

    def _add(self, batch: mut.ChunkBatch) -> None:
        s = self._s
        ids = np.array([faiss_id(c) for c in batch.chunk_ids], dtype=np.int64)
        self._remove(fid for fid in ids.tolist() if fid in s.meta)  # overwrite = remove + add
        s.backend.add(ids, batch.vectors)
        s.table.put(ids, batch.vectors)
        for fid, chunk_id, doc_id in zip(ids.tolist(), batch.chunk_ids, batch.doc_ids, strict=True):
            s.meta[fid] = (chunk_id, doc_id)
            s.docs.setdefault(doc_id, set()).add(fid)
        for fid, payload in zip(ids.tolist(), batch.payloads, strict=False):
            s.payloads[fid] = payload
        if self._touched is not None:
            self._touched.update(ids.tolist())

    # ----- reads -----

    def search(
        self,
        query: np.ndarray,
        top_k: int,
        doc_ids: list[str] | None = None,
        clauses: tuple[Clause, ...] = (),
    ) -> list[Hit]:
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)
        started = time.perf_counter()
        with self._state.read():
            s = self._s
            if clauses:
                universe = set(doc_ids) if doc_ids else s.docs.keys()
                doc_ids = sorted(s.metadata.matching(clauses, universe))
                scores, ids = self._filtered_search(q, top_k, doc_ids)
            elif doc_ids:
                scores, ids = self._filtered_search(q, top_k, doc_ids)
            else:
                k = min(top_k, len(s.table))
                scores, ids = s.backend.search(q, k, None) if k else (np.zeros(0), np.zeros(0, np.int64))
            hits = [
                Hit(*s.meta[fid], float(score))
                for score, fid in zip(scores.tolist(), ids.tolist(), strict=True)
                if fid >= 0
            ]
            kind = s.backend.kind
        filtered = str(bool(doc_ids) or bool(clauses)).lower()
        SEARCH_LATENCY.labels(kind, filtered).observe(time.perf_counter() - started)
        return hits

    def _filtered_search(
        self, q: np.ndarray, top_k: int, doc_ids: list[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        s = self._s
        allowed_set: set[int] = set()
        for doc_id in doc_ids:
            allowed_set |= s.docs.get(doc_id, set())
        if not allowed_set:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        allowed = np.fromiter(allowed_set, dtype=np.int64, count=len(allowed_set))
        k = min(top_k, len(allowed))
        if s.backend.exact:
            return s.backend.search(q, k, allowed)
        # ANN with a selector can come back short (the allowed vectors may sit outside the
        # probed lists / explored graph); a small allowed set is cheaper to score exactly anyway.
        if len(allowed) > EXACT_FILTER_MAX:
            scores, ids = s.backend.search(q, k, allowed)
            if int((ids >= 0).sum()) >= k:
                return scores, ids
        return self._exact_scores(q, allowed, k)

    def _exact_scores(self, q: np.ndarray, allowed: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores = self._s.table.gather(allowed) @ q[0]
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        order = top[np.argsort(-scores[top], kind="stable")]
        return scores[order], allowed[order]

    def get_chunks(self, chunk_ids: list[str]) -> list[StoredChunk]:
        """The stored payload and document source of each chunk held here, in request order
        (chunks written without a payload come back with an empty one)."""
        with self._state.read():
            s = self._s
            found = []
            for chunk_id in chunk_ids:
                fid = faiss_id(chunk_id)
                entry = s.meta.get(fid)
                if entry is None or entry[0] != chunk_id:
                    continue
                payload = s.payloads.get(fid, mut.Payload())
                found.append(StoredChunk(chunk_id, entry[1], payload, s.sources.get(entry[1], mut.Source())))
            return found

    def stats(self) -> CollectionStats:
        with self._state.read():
            s = self._s
            return CollectionStats(
                chunks=len(s.table),
                documents=len(s.docs),
                index_type=s.backend.kind,
                dimension=self.policy.dimension,
                sequence=self._applied_seq,
                snapshot_sequence=self._snapshot_seq,
                log_position=self._log_pos,
            )

    def list_documents(self, after: str, limit: int) -> list[DocumentEntry]:
        """Documents in doc_id order after ``after``: those with chunks here and tombstones
        (fenced documents whose chunks are gone), each with its fence and sorted chunk ids."""
        with self._state.read():
            s = self._s
            names = sorted(d for d in set(s.docs) | set(s.fences) if d > after)[:limit]
            return [
                DocumentEntry(
                    doc_id,
                    s.fences.get(doc_id, 0),
                    sorted(s.meta[fid][0] for fid in s.docs.get(doc_id, ())),
                )
                for doc_id in names
            ]

    @property
    def log_position(self) -> int:
        """Log position of the last entry applied to this collection (lock-free read)."""
        return self._log_pos

    @property
    def recovered_cleanly(self) -> bool:
        return not self._wal.torn_bytes_dropped

    def restart_log(self) -> None:
        """The log was recreated: positions of the old one mean nothing any more."""
        with self._write_lock:
            self._log_pos = 0

    def _publish_gauges(self) -> None:
        VECTORS.labels(self.name).set(len(self._s.table))
        PENDING_WAL.labels(self.name).set(self._applied_seq - self._snapshot_seq)

    # ----- snapshots -----

    @property
    def dirty(self) -> bool:
        return self._applied_seq > self._snapshot_seq or self._layout_changed

    # Lock-free reads of single fields, for the event loop's bookkeeping.

    @property
    def snapshot_directory(self) -> Path | None:
        return self._snapshot_dir

    @property
    def snapshot_sequence(self) -> int:
        return self._snapshot_seq

    @property
    def snapshot_log_position(self) -> int:
        return self._snapshot_log_pos

    @property
    def pending_wal_records(self) -> int:
        return self._applied_seq - self._snapshot_seq

    def snapshot(
        self, *, force: bool = False, log_position: Callable[[], int] | None = None, log_id: str = ""
    ) -> SnapshotOutcome:
        """Write a snapshot of the current state, switch CURRENT to it, drop the WAL it covers.

        ``log_position()`` (read while writes are held) says how far in the log the shard has
        applied every entry: the snapshot covers up to the later of it and this collection's
        own last entry, which is where a replica restoring it resumes the log.

        Only the copy happens under the locks; the (slow) write runs while searches and new
        writes go on, and the WAL records they add land in a fresh segment that stays."""
        with self._snapshot_lock:
            with self._write_lock:
                if not self.dirty and not force and self._snapshot_dir is not None:
                    return SnapshotOutcome(self._snapshot_seq, self._snapshot_dir, written=False)
                with self._state.read():
                    data = self._copy_for_snapshot()
                    if log_position is not None:
                        data.log_pos = max(data.log_pos, log_position())
                    data.log_id = log_id
                    self._layout_changed = False
                keep_from = self._wal.rotate()
            started = time.perf_counter()
            try:
                directory = write_snapshot(self.directory, data)
            except BaseException:
                SNAPSHOTS.labels("error").inc()
                with self._write_lock:
                    self._layout_changed = True
                raise
            SNAPSHOT_SECONDS.observe(time.perf_counter() - started)
            with self._write_lock:
                self._snapshot_seq = data.sequence
                self._snapshot_dir = directory
                self._snapshot_log_pos = data.log_pos
                self.snapshot_log_id = data.log_id
                self._wal.drop_segments_before(keep_from)
            prune(self.directory, keep=directory)
            self.last_snapshot_at = time.monotonic()
            SNAPSHOTS.labels("ok").inc()
            self._publish_gauges()
            log.info(
                "snapshot written",
                extra={"collection": self.name, "sequence": data.sequence, "chunks": len(data.chunk_ids)},
            )
            return SnapshotOutcome(data.sequence, directory, written=True)

    def _copy_for_snapshot(self) -> SnapshotData:
        s = self._s
        fids, vectors = s.table.live()
        pairs = [s.meta[fid] for fid in fids.tolist()]
        return SnapshotData(
            collection=self.name,
            sequence=self._applied_seq,
            dimension=self.policy.dimension,
            shard=self.shard,
            shard_count=self.shard_count,
            index_type=s.backend.kind,
            backend=s.backend.state(),
            chunk_ids=[p[0] for p in pairs],
            doc_ids=[p[1] for p in pairs],
            vectors=vectors,
            fences=dict(s.fences),
            log_pos=self._log_pos,
            payloads={
                "chunks": {s.meta[fid][0]: p.to_json() for fid, p in s.payloads.items()},
                "sources": {doc_id: src.to_json() for doc_id, src in s.sources.items()},
            },
        )

    # ----- rebuilds -----

    def rebuild_target(self) -> str | None:
        """The index type this collection should be rebuilt as now, or None if it is fine."""
        with self._state.read():
            return self._rebuild_target()

    def _rebuild_target(self) -> str | None:
        backend, n, policy = self._s.backend, len(self._s.table), self.policy
        if policy.index_type == "hnsw":
            stale = not isinstance(backend, HNSWBackend) or backend.garbage_ratio() > HNSW_TOMBSTONE_RATIO
            return "hnsw" if stale else None
        if policy.index_type == "flat":
            return None if backend.kind == "flat" else "flat"
        if policy.index_type == "ivf":
            want = "ivf" if n >= MIN_IVF_VECTORS else "flat"
        elif isinstance(backend, IVFBackend):
            want = "flat" if n < policy.ann_threshold * AUTO_SHRINK_RATIO else "ivf"
        else:
            want = "ivf" if n > policy.ann_threshold else "flat"
        if want != backend.kind:
            return want
        if isinstance(backend, IVFBackend) and not (
            backend.trained_on / IVF_RETRAIN_FACTOR <= n <= backend.trained_on * IVF_RETRAIN_FACTOR
        ):
            return "ivf"
        return None

    def rebuild(self) -> bool:
        """Rebuild the backend as ``rebuild_target()`` if one is due. Training and building work
        on a copy without blocking searches or writes; changes made meanwhile are replayed onto
        the new backend before it is swapped in. Returns whether a rebuild happened."""
        if not self._rebuild_lock.acquire(blocking=False):
            return False
        try:
            with self._state.read():
                target = self._rebuild_target()
                if target is None:
                    return False
                fids, vectors = self._s.table.live()
                self._touched = set()
            started = time.perf_counter()
            try:
                backend = build_backend(target, self.policy.backend_config(), fids, vectors)
            except BaseException:
                with self._state.write():
                    self._touched = None
                raise
            with self._state.write():
                self._catch_up(backend)
                self._s.backend = backend
                self._layout_changed = True
            REBUILDS.labels(target).inc()
            log.info(
                "index rebuilt",
                extra={
                    "collection": self.name,
                    "index_type": target,
                    "vectors": len(fids),
                    "seconds": round(time.perf_counter() - started, 3),
                },
            )
            return True
        finally:
            self._rebuild_lock.release()

    def _catch_up(self, backend: Backend) -> None:
        touched = self._touched or set()
        self._touched = None
        if not touched:
            return
        ids = np.fromiter(touched, dtype=np.int64, count=len(touched))
        backend.remove(ids)
        live = np.array([fid for fid in ids.tolist() if fid in self._s.table], dtype=np.int64)
        if len(live):
            backend.add(live, self._s.table.gather(live))
