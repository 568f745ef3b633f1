"""One collection's dense index on this shard: segments + WAL + checkpoints.

Rows live in segments (segments.py, sealed.py): one growing segment takes the writes and is
searched exactly; at ``segment_rows`` rows it freezes (at the same log entry on every replica)
and is sealed in the background into an immutable segment with its own FAISS index (HNSW or IVF
by size, tuned to the recall target); deletes are bits in a segment's deleted bitmap; compaction
merges small segments and drops deleted rows (maintenance.py). A search fans over the segments
and merges their top-k (search.py).

Write path (the shard's log applier calls it for every entry of the replicated log, in order):
validate against the current state, append the mutation to the WAL (fsynced, with the log
position it came from), then apply it in memory. A crash before the fsync loses nothing the log
does not still hold; a crash after it is repaired by replaying the WAL on top of the current
checkpoint. Applying depends only on the state and the mutation, so replicas applying the same
log agree (documents, fences, chunk ids, segment membership).

Checkpoints (snapshots.py, checkpoint.py) write only what changed: the growing segment's new
rows, the bitmaps that changed, the document records that changed, and a manifest naming the
live segments' files and the log position; sealed segments' files are written once.

Fences: each document keeps the highest fence a replacement brought it (also once its chunks
are gone: a tombstone). A replacement with a lower fence is refused (``stale_doc_ids``) and
changes nothing; an equal one is applied again (a writer's retry); fence 0 is unfenced (Upsert,
Delete, callers without a claim) and leaves the stored fence as it is.

Locks (always taken in this order):
- ``_write_lock`` serialises mutations and the swaps of background jobs, and lets a checkpoint
  copy a state and a WAL position that match;
- ``_state`` (readers-writer) guards the in-memory state: searches share it, applying a
  mutation or swapping in a built segment takes it alone, briefly (never across an fsync, an
  index build or a checkpoint write).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from meshkit.domain.metadata import Clause
from meshkit.replication.records import DocumentEntry, ReplaceResult
from services.index import mutations as mut
from services.index.backends import build_backend, omp_threads, release_memory
from services.index.background import SegmentWork
from services.index.buckets import BucketExport, export_buckets
from services.index.checkpoint import capture, commit, state_refs
from services.index.legacy import LEGACY_FORMAT, read_legacy
from services.index.loading import legacy_state, load_state
from services.index.metrics import (
    CHECKPOINT_BYTES,
    CHECKPOINT_SIZE,
    DELETED_SHARE,
    PENDING_WAL,
    SEALED_ROWS,
    SEARCH_LATENCY,
    SEGMENTS,
    SNAPSHOT_SECONDS,
    SNAPSHOTS,
    VECTORS,
    WAL_APPEND_LATENCY,
    WAL_APPENDS,
    WAL_TORN_TAILS,
)
from services.index.records import (
    CollectionMismatch,
    CollectionStats,
    Hit,
    IndexPolicy,
    SnapshotOutcome,
    StoredChunk,
    check_identity,
)
from services.index.rwlock import RWLock
from services.index.search import search
from services.index.segments import FROZEN, GROWING, SEALED
from services.index.snapshots import (
    SnapshotData,
    current_snapshot_dir,
    manifest_refs,
    prune_victims,
    read_meta,
    remove_dirs,
    top_dir,
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
        self._s = IndexState(policy)
        self._state = RWLock()
        self._write_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._wal = WriteAheadLog(directory / "wal")
        self._applied_seq = 0
        self._snapshot_seq = 0
        # Log position of the last entry applied here, and the log it belongs to (snapshots).
        self._log_pos = 0
        # Where in the log the current checkpoint ends, and which log that is.
        self._snapshot_log_pos = 0
        self.snapshot_log_id = ""
        self._snapshot_dir: Path | None = None
        # Files the current checkpoint names (pruning keeps them).
        self._current_refs: set[str] = set()
        self._layout_changed = False
        self.last_snapshot_at = time.monotonic()
        self.last_checkpoint_bytes = 0
        self._work = SegmentWork(
            name, directory, policy, lambda: self._s, self._state, self._write_lock, self._layout_moved
        )

    def _layout_moved(self) -> None:
        """A background job swapped segments or files in (write lock held)."""
        self._layout_changed = True
        self._publish_gauges()

    # ----- opening -----

    @classmethod
    def open(
        cls, name: str, directory: Path, policy: IndexPolicy, *, shard: int = 0, shard_count: int = 1
    ) -> CollectionIndex:
        """Load the current checkpoint, replay the WAL after it, and get ready for writes."""
        index = cls(name, directory, policy, shard=shard, shard_count=shard_count)
        layout: dict[str, object] = {
            "dimension": policy.dimension,
            "shard": shard,
            "shard_count": shard_count,
        }
        if mut.placement(shard_count):
            layout["placement"] = mut.placement(shard_count)
        check_identity(directory, {"collection": name, **layout})
        snapshot_dir = current_snapshot_dir(directory)
        if snapshot_dir is not None:
            index._install(snapshot_dir)
        remove_dirs(prune_victims(directory, index._keep(), include_tmp=True))
        replayed = index._wal.recover(index._snapshot_seq, index._replay)
        if index._wal.torn_bytes_dropped:
            WAL_TORN_TAILS.inc()
        index._publish_gauges()
        log.info(
            "collection loaded",
            extra={
                "collection": name,
                "chunks": index._s.chunks,
                "segments": len(index._s.segments),
                "snapshot_sequence": index._snapshot_seq,
                "wal_replayed": replayed,
                "index_type": index._s.index_type(),
            },
        )
        return index

    def _install(self, snapshot_dir: Path) -> None:
        meta = read_meta(snapshot_dir)
        expected = (
            ("dimension", self.policy.dimension),
            ("shard", self.shard),
            ("shard_count", self.shard_count),
            ("placement", mut.placement(self.shard_count)),
        )
        for key, want in expected:
            if meta.get(key, "") != want:
                raise CollectionMismatch(
                    f"snapshot of {self.name} has {key}={meta.get(key, '')!r}, expected {want}"
                )
        if meta["format"] == LEGACY_FORMAT:
            self._s = legacy_state(read_legacy(snapshot_dir, meta), self.policy)
            self._layout_changed = True  # the next checkpoint writes it as segments
        else:
            self._s = load_state(self.directory, meta, self.policy)
            self._current_refs = {top_dir(r.path) for r in manifest_refs(meta)}
        self._current_refs.add(snapshot_dir.relative_to(self.directory).as_posix())
        self._snapshot_dir = snapshot_dir
        self._applied_seq = self._snapshot_seq = int(meta["sequence"])
        self._log_pos = self._snapshot_log_pos = int(meta.get("log_pos", 0))
        self.snapshot_log_id = str(meta.get("log", ""))

    def _keep(self) -> set[str]:
        """Directories pruning keeps: those the current checkpoint or the live state names."""
        return self._current_refs | {top_dir(r.path) for r in state_refs(self._s)}

    def _replay(self, seq: int, payload: bytes) -> None:
        record = mut.decode_record(payload, self.policy.dimension)
        mutation = record.mutation
        with self._state.write():
            s = self._s
            if isinstance(mutation, mut.Upsert):
                s.add(mutation.chunks)
            elif isinstance(mutation, mut.Replace):
                prior = s.prior_sources(mutation.documents)
                s.apply_plan(s.plan_replace(mutation.documents))
                s.apply_fences(s.fence_changes(mutation.documents))
                s.apply_sources(mutation.documents, prior)
            else:
                s.remove(s.delete_targets(mutation.chunk_ids, mutation.doc_ids))
            s.maybe_freeze()
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
            with self._state.read():
                self._s.check_collisions(chunks.chunk_ids, self.name)
            seq = self._log(mut.Upsert(chunks), pos)
            with self._state.write():
                self._s.add(chunks)
                self._s.maybe_freeze()
                self._applied(seq, pos)
        self._publish_gauges()
        return len(chunks.chunk_ids)

    def replace_documents(self, documents: list[mut.Replacement], pos: int = 0) -> ReplaceResult:
        with self._write_lock:
            with self._state.read():
                s = self._s
                stale = [d.doc_id for d in documents if 0 < d.fence < s.docs.fence(d.doc_id)]
                accepted = [d for d in documents if not 0 < d.fence < s.docs.fence(d.doc_id)]
                s.check_collisions([c for d in accepted for c in d.upserts.chunk_ids], self.name)
                plan = s.plan_replace(accepted)
                fences = s.fence_changes(accepted)
                prior = s.prior_sources(accepted)
                sources_changed = any(d.source not in (None, prior.get(d.doc_id)) for d in accepted)
            upserted = sum(len(b.chunk_ids) for b in plan.upserts)
            if plan.remove or upserted or fences or sources_changed:
                seq = self._log(mut.Replace(accepted), pos)
                with self._state.write():
                    s.apply_plan(plan)
                    s.apply_fences(fences)
                    s.apply_sources(accepted, prior)
                    s.maybe_freeze()
                    self._applied(seq, pos)
        self._publish_gauges()
        return ReplaceResult(upserted, plan.removed, plan.missing, stale)

    def delete(self, chunk_ids: list[str], doc_ids: list[str], pos: int = 0) -> int:
        with self._write_lock:
            with self._state.read():
                targets = self._s.delete_targets(chunk_ids, doc_ids)
            removed = sum(len(rows) for rows in targets.values())
            if not removed:
                return 0  # nothing to do, nothing to log
            seq = self._log(mut.Delete(chunk_ids, doc_ids), pos)
            with self._state.write():
                self._s.remove(targets)
                self._applied(seq, pos)
        self._publish_gauges()
        return removed

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
            found = search(self._s, q, top_k, doc_ids or None, clauses)
            hits = found.hits()
            kind = self._s.index_type()
            searched = time.perf_counter()
            stored = found.stored(self._s, payloads) if payloads else []
        filtered = str(bool(doc_ids) or bool(clauses)).lower()
        SEARCH_LATENCY.labels(kind, filtered).observe(searched - started)
        return hits, stored

    def get_chunks(self, chunk_ids: list[str]) -> list[StoredChunk]:
        """The stored payload and document source of each chunk held here, in request order
        (chunks written without a payload come back with an empty one)."""
        with self._state.read():
            return self._s.stored_chunks(chunk_ids)

    def stats(self) -> CollectionStats:
        with self._state.read():
            s = self._s
            return CollectionStats(
                chunks=s.chunks,
                documents=s.docs.with_chunks,
                index_type=s.index_type(),
                dimension=self.policy.dimension,
                sequence=self._applied_seq,
                snapshot_sequence=self._snapshot_seq,
                log_position=self._log_pos,
                segments=len(s.segments),
                sealed_rows=sum(g.rows for g in s.segments if g.state == SEALED),
                deleted_rows=sum(g.dead_count for g in s.segments),
            )

    def list_documents(self, after: str, limit: int) -> list[DocumentEntry]:
        """Documents in doc_id order after ``after``: those with chunks here and tombstones
        (fenced documents whose chunks are gone), each with its fence and sorted chunk ids."""
        with self._state.read():
            s = self._s
            names = sorted(d for d in s.docs.docs if d > after)[:limit]
            return [DocumentEntry(d, s.docs.fence(d), s.chunk_ids_of(d)) for d in names]

    def export_buckets(self, buckets: Iterable[int]) -> BucketExport:
        """Every live row (vector, payload) of the documents of ``buckets``, with their fences and
        sources: what moving those buckets to another shard copies."""
        with self._state.read():
            return export_buckets(self._s, buckets)

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
        s = self._s
        segments = list(s.segments)
        VECTORS.labels(self.name).set(sum(g.live_count for g in segments))
        PENDING_WAL.labels(self.name).set(self._applied_seq - self._snapshot_seq)
        for state in (GROWING, FROZEN, SEALED):
            SEGMENTS.labels(self.name, state).set(sum(1 for g in segments if g.state == state))
        SEALED_ROWS.labels(self.name).set(sum(g.rows for g in segments if g.state == SEALED))
        stored = sum(g.rows for g in segments)
        DELETED_SHARE.labels(self.name).set(sum(g.dead_count for g in segments) / stored if stored else 0.0)

    # ----- checkpoints -----

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
        """Write a checkpoint of what changed, switch CURRENT to it, drop the WAL it covers.

        ``log_position()`` (read while writes are held) says how far in the log the shard has
        applied every entry: the checkpoint covers up to the later of it and this collection's
        own last entry, which is where a replica restoring it resumes the log.

        Only the copy of what changed happens under the locks; the write runs while searches and
        new writes go on, and the WAL records they add land in a fresh segment that stays."""
        with self._snapshot_lock:
            with self._write_lock:
                if not self.dirty and not force and self._snapshot_dir is not None:
                    return SnapshotOutcome(self._snapshot_seq, self._snapshot_dir, written=False)
                with self._state.read():
                    data, taken = capture(self._s, self._header(log_position, log_id))
                    self._layout_changed = False
                keep_from = self._wal.rotate()
            started = time.perf_counter()
            try:
                written = write_snapshot(self.directory, data)
            except BaseException:
                SNAPSHOTS.labels("error").inc()
                with self._write_lock:
                    self._layout_changed = True
                raise
            SNAPSHOT_SECONDS.observe(time.perf_counter() - started)
            with self._write_lock:
                with self._state.write():
                    commit(self._s, taken, written, self.directory)
                self._committed(data, written.directory)
                self._wal.drop_segments_before(keep_from)
                victims = prune_victims(self.directory, self._keep(), include_tmp=False)
            remove_dirs(victims)
            release_memory()  # the payloads now read from the checkpoint's files
            self.last_snapshot_at = time.monotonic()
            self.last_checkpoint_bytes = written.bytes_written
            CHECKPOINT_BYTES.inc(written.bytes_written)
            CHECKPOINT_SIZE.observe(written.bytes_written)
            SNAPSHOTS.labels("ok").inc()
            self._publish_gauges()
            log.info(
                "checkpoint written",
                extra={"collection": self.name, "sequence": data.sequence, "bytes": written.bytes_written},
            )
            return SnapshotOutcome(data.sequence, written.directory, written=True)

    def _header(self, log_position: Callable[[], int] | None, log_id: str) -> dict[str, Any]:
        log_pos = self._log_pos
        if log_position is not None:
            log_pos = max(log_pos, log_position())
        return {
            "collection": self.name,
            "sequence": self._applied_seq,
            "dimension": self.policy.dimension,
            "shard": self.shard,
            "shard_count": self.shard_count,
            "placement": mut.placement(self.shard_count),
            "index_type": self._s.index_type(),
            "log_pos": log_pos,
            "log": log_id,
        }

    def _committed(self, data: SnapshotData, directory: Path) -> None:
        self._snapshot_seq = data.sequence
        self._snapshot_dir = directory
        self._snapshot_log_pos = int(data.header["log_pos"])
        self.snapshot_log_id = str(data.header["log"])
        meta = read_meta(directory)
        self._current_refs = {top_dir(r.path) for r in manifest_refs(meta)}
        self._current_refs.add(directory.relative_to(self.directory).as_posix())

    # ----- background work: seals, compactions, merges (background.py) -----

    def rebuild_target(self) -> str | None:
        """The index type of the next segment index due (a frozen segment to seal, segments to
        compact or rebuild as another type), or None."""
        return self._work.rebuild_target()

    def maintenance_due(self) -> bool:
        """Whether ``rebuild()`` has work: an index to build or checkpoint files to merge."""
        return self._work.due()

    def rebuild(self) -> bool:
        """Do the background work due now (seal frozen segments, compact, merge checkpoint files)
        while searches and writes go on; returns whether anything was done."""
        # build_backend is looked up here, at call time (tests interpose on it).
        return self._work.run(build_backend)
