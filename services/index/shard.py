"""This process's replica of one index shard: its collections, fed by the shard's replicated
log (start-up, positions, quarantine and restores are meshkit.replication.store's), and their
background work (checkpoints, uploads, seals, compactions and file merges).

Writes: the RPC appends its request to the shard's log and waits until this replica has
applied it. The log reader is the only writer of the collections: one entry at a time, in log
order, in a worker thread, so every replica of the shard goes through the same states. Reads
are local (any replica; another may lag by its apply delay).

All blocking work (FAISS, file I/O, fsync) runs in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from meshkit.domain.metadata import Clause
from meshkit.replication.log import LogTransport, transport_for
from meshkit.replication.records import DocumentEntry, ReplaceResult
from meshkit.replication.store import Decoded, ReplicatedStore
from meshkit.settings import IndexSettings
from services.index import mutations as mut
from services.index.metrics import UPLOADS
from services.index.records import (
    IDENTITY_FILE,
    CollectionStats,
    Hit,
    IndexPolicy,
    StoredChunk,
)
from services.index.remote import SnapshotRemote
from services.index.store import CollectionIndex

log = logging.getLogger(__name__)

# Bytes of a log entry per chunk beyond its vector (ids and JSON framing), to pack entries.
_CHUNK_OVERHEAD_BYTES = 96
_KEEP_ID_BYTES = 40


def data_dir_of(settings: IndexSettings) -> Path:
    return settings.index_data_dir or settings.state_dir / f"index-{settings.index_shard}"


def policy_of(settings: IndexSettings) -> IndexPolicy:
    return IndexPolicy(
        dimension=settings.index_dimension,
        index_type=settings.index_type,
        ann_threshold=settings.index_ann_threshold,
        segment_rows=settings.index_segment_rows,
        segment_max_rows=settings.index_segment_max_rows,
        compact_deleted_ratio=settings.index_compact_deleted_ratio,
        compact_max_segments=settings.index_compact_max_segments,
        recall_target=settings.index_recall_target,
        ivf_nprobe=settings.index_ivf_nprobe,
        hnsw_m=settings.index_hnsw_m,
        hnsw_ef_search=settings.index_hnsw_ef_search,
        search_threads=settings.index_search_threads,
    )


class IndexShard(ReplicatedStore[CollectionIndex]):
    store = "index"

    def __init__(
        self,
        settings: IndexSettings,
        remote: SnapshotRemote | None = None,
        transport: LogTransport | None = None,
    ) -> None:
        if not 0 <= settings.index_shard < settings.index_shard_count:
            raise ValueError(
                f"index_shard {settings.index_shard} is outside 0..{settings.index_shard_count - 1}"
            )
        if settings.index_dimension <= 0:
            raise ValueError("index_dimension must be positive")
        self.shard = settings.index_shard
        self.shard_count = settings.index_shard_count
        self.policy = policy_of(settings)
        self.index_settings = settings
        self.snapshot_remote = remote
        transport = transport or transport_for(
            settings,
            settings.index_log_stream,
            "index",
            self.shard,
            client_name=f"index-{self.shard}-{uuid.uuid4().hex[:6]}",
        )
        super().__init__(settings, data_dir_of(settings), transport, remote, f"index shard {self.shard}")
        self._snapshot_locks: dict[str, asyncio.Lock] = {}
        self._uploaded: dict[str, int] = {}
        self._last_upload_try: dict[str, float] = {}

    # ----- the collection type -----

    def open_collection(self, name: str) -> CollectionIndex:
        return CollectionIndex.open(
            name, self.data_dir / name, self.policy, shard=self.shard, shard_count=self.shard_count
        )

    def has_local_data(self, name: str) -> bool:
        # A directory without its identity file is an interrupted restore or creation.
        return (self.data_dir / name / IDENTITY_FILE).is_file()

    def decode(self, data: bytes) -> Decoded:
        record = mut.decode_record(data, self.policy.dimension)
        if record.shard_count not in (0, self.shard_count):
            # The subject is per shard number: a log written by another layout (before a
            # reshard) must not be applied to this one.
            raise ValueError(
                f"entry written for {record.shard_count} shards, this layout has {self.shard_count}"
            )
        if record.shard_count and record.placement != mut.placement(self.shard_count):
            raise ValueError(
                f"entry written by a layout that placed chunks by {record.placement or 'chunk id'}, "
                f"this one places them by {mut.placement(self.shard_count) or 'nothing (one shard)'}"
            )
        return Decoded(record.collection, record.mutation, not isinstance(record.mutation, mut.Delete))

    def apply_mutation(self, collection: CollectionIndex, mutation: Any, pos: int) -> Any:
        if isinstance(mutation, mut.Upsert):
            return collection.upsert(mutation.chunks, pos)
        if isinstance(mutation, mut.Replace):
            return collection.replace_documents(mutation.documents, pos)
        return collection.delete(mutation.chunk_ids, mutation.doc_ids, pos)

    async def after_apply(self, collection: CollectionIndex, result: Any) -> None:
        if collection.pending_wal_records >= self.index_settings.index_snapshot_every:
            self.spawn(collection.name, "snapshot", partial(self._snapshot_quietly, collection))
        if await asyncio.to_thread(collection.maintenance_due):
            self.spawn(collection.name, "rebuild", partial(self._rebuild, collection))

    # ----- lifecycle -----

    async def start(self) -> None:
        await super().start()
        for collection in self.collections.values():
            # Frozen segments to seal, or a changed index_type or threshold; rebuild() checks.
            self.spawn(collection.name, "rebuild", partial(self._rebuild, collection))
        log.info(
            "index shard ready",
            extra={
                "shard": self.shard,
                "shard_count": self.shard_count,
                "collections": len(self.collections),
                "quarantined": sorted(self.quarantined),
                "log_position": self.log.positions.cursor,
            },
        )

    async def before_stop(self) -> None:
        """A final snapshot (and upload) of every dirty collection."""
        for collection in list(self.collections.values()):
            try:
                await self._snapshot(collection)
            except Exception:
                log.exception(
                    "shutdown snapshot failed; the WAL still holds every write",
                    extra={"collection": collection.name},
                )

    # ----- operations -----

    def _chunk_bytes(self) -> int:
        return self.policy.dimension * 4 + _CHUNK_OVERHEAD_BYTES

    async def _submit(self, name: str, mutation: mut.Mutation, timeout_s: float) -> Any:
        entry = mut.encode(mutation, collection=name, shard_count=self.shard_count)
        return await self.submit(name, entry, timeout_s)

    async def upsert(self, name: str, chunks: mut.ChunkBatch, timeout_s: float) -> int:
        budget = self.transport.max_message_bytes
        groups: list[mut.ChunkBatch] = []
        start, size = 0, 0
        for i in range(len(chunks.chunk_ids) + 1):
            row = self._chunk_bytes() + _payload_bytes(chunks, i, i + 1) if i < len(chunks.chunk_ids) else 0
            if i == len(chunks.chunk_ids) or (i > start and size + row > budget):
                groups.append(
                    mut.ChunkBatch(
                        chunks.chunk_ids[start:i],
                        chunks.doc_ids[start:i],
                        chunks.vectors[start:i],
                        chunks.payloads[start:i],
                    )
                )
                start, size = i, 0
            size += row
        groups = [g for g in groups if g.chunk_ids]
        results = await asyncio.gather(*(self._submit(name, mut.Upsert(g), timeout_s) for g in groups))
        return sum(int(r or 0) for r in results)

    async def replace_documents(
        self, name: str, documents: list[mut.Replacement], timeout_s: float
    ) -> ReplaceResult:
        """Each document's replacement is atomic; documents are packed into log entries of
        bounded size (a big document is one entry of several parts)."""
        groups = _pack(documents, self.transport.max_message_bytes, self._chunk_bytes())
        results = await asyncio.gather(*(self._submit(name, mut.Replace(g), timeout_s) for g in groups))
        done = [r for r in results if isinstance(r, ReplaceResult)]
        return ReplaceResult(
            upserted=sum(r.upserted for r in done),
            removed=sum(r.removed for r in done),
            missing_chunk_ids=[c for r in done for c in r.missing_chunk_ids],
            stale_doc_ids=[d for r in done for d in r.stale_doc_ids],
        )

    async def delete(self, name: str, chunk_ids: list[str], doc_ids: list[str], timeout_s: float) -> int:
        result = await self._submit(name, mut.Delete(chunk_ids, doc_ids), timeout_s)
        return int(result or 0)

    async def search(
        self,
        name: str,
        query: np.ndarray,
        top_k: int,
        doc_ids: list[str],
        clauses: tuple[Clause, ...] = (),
        payloads: int = 0,
    ) -> tuple[list[Hit], list[StoredChunk]]:
        """The hits, and the stored chunks of the first ``payloads``, in one thread hop."""
        collection = self.get(name)
        return await asyncio.to_thread(
            collection.search_with_payloads, query, top_k, doc_ids or None, clauses, payloads
        )

    async def get_chunks(self, name: str, chunk_ids: list[str]) -> list[StoredChunk]:
        return await asyncio.to_thread(self.get(name).get_chunks, chunk_ids)

    async def stats(self, name: str) -> CollectionStats:
        return await asyncio.to_thread(self.get(name).stats)

    async def list_documents(self, name: str, after: str, limit: int) -> list[DocumentEntry]:
        return await asyncio.to_thread(self.get(name).list_documents, after, limit)

    async def snapshot(self, name: str) -> tuple[int, bool]:
        return await self._snapshot(self.get(name))

    # ----- background work -----

    async def _rebuild(self, collection: CollectionIndex) -> None:
        # Keep going while there is work: writes during a long build may call for more.
        while await asyncio.to_thread(collection.rebuild):
            pass

    async def _snapshot_quietly(self, collection: CollectionIndex) -> None:
        await self._snapshot(collection)

    async def _snapshot(self, collection: CollectionIndex) -> tuple[int, bool]:
        async with self._snapshot_locks.setdefault(collection.name, asyncio.Lock()):
            outcome = await asyncio.to_thread(
                collection.snapshot,
                log_position=partial(self.log.positions.of, collection.name),
                log_id=self.log.positions.log_id,
            )
            uploaded = await self._upload(collection)
        if outcome.written and await asyncio.to_thread(collection.maintenance_due):
            # Its files may be due a merge (or its layout a seal or compaction).
            self.spawn(collection.name, "rebuild", partial(self._rebuild, collection))
        return outcome.sequence, uploaded

    async def _upload(self, collection: CollectionIndex) -> bool:
        """Upload the current snapshot unless the store already has it (from this replica or
        another one of the shard). A failure is logged and counted, never raised: the next
        snapshot (or tick) tries again."""
        remote = self.snapshot_remote
        directory = collection.snapshot_directory
        log_pos = collection.snapshot_log_position
        if remote is None or not self.index_settings.index_upload_snapshots or directory is None:
            return False
        if self._uploaded.get(collection.name) == log_pos:
            return True
        self._last_upload_try[collection.name] = time.monotonic()
        log_id = collection.snapshot_log_id
        try:
            current = await remote.pointer(collection.name)
            if current is None or current.log_id != log_id or current.log_pos < log_pos:
                await remote.upload(collection.name, directory, log_pos, log_id, collection.directory)
        except Exception as exc:
            UPLOADS.labels("error").inc()
            log.warning(
                "snapshot upload failed; will retry",
                extra={"collection": collection.name, "log_position": log_pos, "error": str(exc)},
            )
            return False
        UPLOADS.labels("ok").inc()
        self._uploaded[collection.name] = log_pos
        return True

    async def on_tick(self) -> None:
        for collection in list(self.collections.values()):
            if self._snapshot_due(collection) or self._upload_due(collection):
                self.spawn(collection.name, "snapshot", partial(self._snapshot_quietly, collection))

    def _snapshot_due(self, collection: CollectionIndex) -> bool:
        age = time.monotonic() - collection.last_snapshot_at
        return collection.dirty and age >= self.index_settings.index_snapshot_interval_s

    def _upload_due(self, collection: CollectionIndex) -> bool:
        if self.snapshot_remote is None or not self.index_settings.index_upload_snapshots:
            return False
        if collection.snapshot_directory is None:
            return False
        if self._uploaded.get(collection.name) == collection.snapshot_log_position:
            return False
        last_try = self._last_upload_try.get(collection.name, 0.0)
        return time.monotonic() - last_try >= self.index_settings.index_snapshot_interval_s


def _pack(documents: Sequence[mut.Replacement], budget: int, chunk_bytes: int) -> list[list[mut.Replacement]]:
    """Documents in request order, grouped so each group's entry stays within ``budget`` bytes
    (a document bigger than that is a group alone: one entry of several parts)."""
    groups: list[list[mut.Replacement]] = []
    current: list[mut.Replacement] = []
    size = 0
    for doc in documents:
        doc_size = (
            len(doc.upserts.chunk_ids) * chunk_bytes
            + _payload_bytes(doc.upserts, 0, len(doc.upserts.chunk_ids))
            + len(doc.keep_chunk_ids) * _KEEP_ID_BYTES
            + _source_bytes(doc.source)
            + 128
        )
        if current and size + doc_size > budget:
            groups.append(current)
            current, size = [], 0
        current.append(doc)
        size += doc_size
    if current:
        groups.append(current)
    return groups


def _payload_bytes(batch: mut.ChunkBatch, start: int, end: int) -> int:
    """Roughly the JSON the payloads of rows [start, end) add to an entry (only packs entries:
    the log splits an entry bigger than one message into parts)."""
    return sum(
        2 * (len(p.text) + sum(len(h) for h in p.heading_path)) + 64 for p in batch.payloads[start:end]
    )


def _source_bytes(source: mut.Source | None) -> int:
    if source is None:
        return 0
    text = len(source.title) + len(source.source_uri) + sum(len(k) + len(v) for k, v in source.metadata)
    return 2 * text + 64
