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
(meshkit.domain.metadata) and a search's metadata filter becomes the set of allowed documents before
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

Beside it: records.py (the values it takes and gives back), state.py (the in-memory state and
its lock-free primitives), rebuild_policy.py (when to rebuild the backend, as what).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from meshkit.domain.metadata import Clause
from meshkit.replication.records import DocumentEntry, ReplaceResult
from services.index import mutations as mut
from services.index.backends import Backend, VectorTable, build_backend, omp_threads
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
from services.index.rebuild_policy import rebuild_target
from services.index.records import (
    CollectionMismatch,
    CollectionStats,
    Hit,
    IndexPolicy,
    SnapshotOutcome,
    StoredChunk,
    check_identity,
    faiss_id,
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
from services.index.state import IndexState
from services.index.wal import WriteAheadLog

log = logging.getLogger(__name__)


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
        self._s = IndexState(initial, VectorTable(policy.dimension))
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
        self.last_snapshot_at = time.monotonic()

    # ----- opening -----

    @classmethod
    def open(
        cls, name: str, directory: Path, policy: IndexPolicy, *, shard: int = 0, shard_count: int = 1
    ) -> CollectionIndex:
        """Load the current snapshot, replay the WAL after it, and get ready for writes."""
        index = cls(name, directory, policy, shard=shard, shard_count=shard_count)
        layout = {"dimension": policy.dimension, "shard": shard, "shard_count": shard_count}
        check_identity(directory, {"collection": name, **layout})
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
        self._s.install(snap, self.policy.backend_config())
        self._applied_seq = self._snapshot_seq = snap.sequence
        self._log_pos = self._snapshot_log_pos = int(meta.get("log_pos", 0))
        self.snapshot_log_id = str(meta.get("log", ""))

    def _replay(self, seq: int, payload: bytes) -> None:
        record = mut.decode_record(payload, self.policy.dimension)
        mutation = record.mutation
        with self._state.write():
            if isinstance(mutation, mut.Upsert):
                self._s.add(mutation.chunks)
            elif isinstance(mutation, mut.Replace):
                prior = self._s.prior_sources(mutation.documents)
                self._s.apply_plan(self._s.plan_replace(mutation.documents))
                self._s.fences.update(self._s.fence_changes(mutation.documents))
                self._s.apply_sources(mutation.documents, prior)
            else:
                self._s.remove(self._s.delete_targets(mutation.chunk_ids, mutation.doc_ids))
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
            self._s.check_collisions(chunks.chunk_ids, self.name)
            seq = self._log(mut.Upsert(chunks), pos)
            with self._state.write():
                self._s.add(chunks)
                self._applied(seq, pos)
        self._publish_gauges()
        return len(chunks.chunk_ids)

    def replace_documents(self, documents: list[mut.Replacement], pos: int = 0) -> ReplaceResult:
        with self._write_lock:
            with self._state.read():
                stored = self._s.fences
                stale = [d.doc_id for d in documents if 0 < d.fence < stored.get(d.doc_id, 0)]
                accepted = [d for d in documents if not 0 < d.fence < stored.get(d.doc_id, 0)]
            self._s.check_collisions([c for d in accepted for c in d.upserts.chunk_ids], self.name)
            with self._state.read():
                plan = self._s.plan_replace(accepted)
                fences = self._s.fence_changes(accepted)
                prior = self._s.prior_sources(accepted)
                sources_changed = any(d.source not in (None, prior.get(d.doc_id)) for d in accepted)
            upserted = sum(len(b.chunk_ids) for b in plan.upserts)
            if plan.remove or upserted or fences or sources_changed:
                seq = self._log(mut.Replace(accepted), pos)
                with self._state.write():
                    self._s.apply_plan(plan)
                    self._s.fences.update(fences)
                    self._s.apply_sources(accepted, prior)
                    self._applied(seq, pos)
        self._publish_gauges()
        return ReplaceResult(upserted, plan.removed, plan.missing, stale)

    def delete(self, chunk_ids: list[str], doc_ids: list[str], pos: int = 0) -> int:
        with self._write_lock:
            with self._state.read():
                targets = self._s.delete_targets(chunk_ids, doc_ids)
            if not targets:
                return 0  # nothing to do, nothing to log
            seq = self._log(mut.Delete(chunk_ids, doc_ids), pos)
            with self._state.write():
                self._s.remove(targets)
                self._applied(seq, pos)
        self._publish_gauges()
        return len(targets)

    def _applied(self, seq: int, pos: int) -> None:
        self._applied_seq = seq
        self._log_pos = max(self._log_pos, pos)

    def _log(self, mutation: mut.Mutation, pos: int = 0) -> int:
        started = time.perf_counter()
        seq = self._wal.append(mut.encode(mutation, pos=pos))
        WAL_APPEND_LATENCY.observe(time.perf_counter() - started)
        WAL_APPENDS.labels(mut.op_name(mutation)).inc()
        return seq

    # ----- reads -----

    def search(
        self,
        query: np.ndarray,
        top_k: int,
        doc_ids: list[str] | None = None,
        clauses: tuple[Clause, ...] = (),
    ) -> list[Hit]:
        return self.search_with_payloads(query, top_k, doc_ids, clauses)[0]

    def search_with_payloads(
        self,
        query: np.ndarray,
        top_k: int,
        doc_ids: list[str] | None = None,
        clauses: tuple[Clause, ...] = (),
        payloads: int = 0,
    ) -> tuple[list[Hit], list[StoredChunk]]:
        """The top_k hits, and the stored chunks of the first ``payloads`` of them, from one read
        of the collection: a write landing between a search and a later read of the payloads
        could leave a hit without its text."""
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)
        started = time.perf_counter()
        with self._state.read(), omp_threads(self.policy.search_threads):
            s = self._s
            if clauses:
                universe = set(doc_ids) if doc_ids else s.docs.keys()
                doc_ids = sorted(s.metadata.matching(clauses, universe))
                scores, ids = s.filtered_search(q, top_k, doc_ids)
            elif doc_ids:
                scores, ids = s.filtered_search(q, top_k, doc_ids)
            else:
                k = min(top_k, len(s.table))
                scores, ids = s.backend.search(q, k, None) if k else (np.zeros(0), np.zeros(0, np.int64))
            hits = [
                Hit(*s.meta[fid], float(score))
                for score, fid in zip(scores.tolist(), ids.tolist(), strict=True)
                if fid >= 0
            ]
            kind = s.backend.kind
            searched = time.perf_counter()
            stored = _stored_chunks(s, [hit.chunk_id for hit in hits[:payloads]]) if payloads else []
        filtered = str(bool(doc_ids) or bool(clauses)).lower()
        SEARCH_LATENCY.labels(kind, filtered).observe(searched - started)
        return hits, stored

    def get_chunks(self, chunk_ids: list[str]) -> list[StoredChunk]:
        """The stored payload and document source of each chunk held here, in request order
        (chunks written without a payload come back with an empty one)."""
        with self._state.read():
            return _stored_chunks(self._s, chunk_ids)

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
            return rebuild_target(self._s.backend, len(self._s.table), self.policy)

    def rebuild(self) -> bool:
        """Rebuild the backend as ``rebuild_target()`` if one is due. Training and building work
        on a copy without blocking searches or writes; changes made meanwhile are replayed onto
        the new backend before it is swapped in. Returns whether a rebuild happened."""
        if not self._rebuild_lock.acquire(blocking=False):
            return False
        try:
            with self._state.read():
                target = rebuild_target(self._s.backend, len(self._s.table), self.policy)
                if target is None:
                    return False
                fids, vectors = self._s.table.live()
                self._s.touched = set()
            started = time.perf_counter()
            try:
                backend = build_backend(target, self.policy.backend_config(), fids, vectors)
            except BaseException:
                with self._state.write():
                    self._s.touched = None
                raise
            with self._state.write():
                self._s.catch_up(backend)
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


def _stored_chunks(state: IndexState, chunk_ids: list[str]) -> list[StoredChunk]:
    """The stored chunks of ``chunk_ids`` held in ``state``, in request order; the caller holds
    the collection's read lock."""
    found = []
    for chunk_id in chunk_ids:
        fid = faiss_id(chunk_id)
        entry = state.meta.get(fid)
        if entry is None or entry[0] != chunk_id:
            continue
        payload = state.payloads.get(fid, mut.Payload())
        found.append(StoredChunk(chunk_id, entry[1], payload, state.sources.get(entry[1], mut.Source())))
    return found
