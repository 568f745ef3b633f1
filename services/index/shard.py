"""This process's shard: its collections, their background work, and the object store.

All blocking work (FAISS, file I/O, fsync) runs in worker threads. Writes to one collection
queue on an asyncio lock (so a burst of them holds one thread, not the pool); different
collections never wait for each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

from meshkit.errors import not_found
from meshkit.ids import validate_collection
from meshkit.settings import IndexSettings
from services.index import mutations as mut
from services.index.metrics import RESTORES, UPLOADS
from services.index.remote import SnapshotRemote
from services.index.store import (
    IDENTITY_FILE,
    CollectionIndex,
    CollectionStats,
    Hit,
    IndexPolicy,
    ReplaceResult,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# How often the background loop looks for due snapshots and retries failed uploads.
_TICK_S = 1.0
# A start-up probe of the object store must not hold the service back for long.
_REMOTE_START_TIMEOUT_S = 20.0


def data_dir_of(settings: IndexSettings) -> Path:
    return settings.index_data_dir or settings.state_dir / f"index-{settings.index_shard}"


def policy_of(settings: IndexSettings) -> IndexPolicy:
    return IndexPolicy(
        dimension=settings.index_dimension,
        index_type=settings.index_type,
        ann_threshold=settings.index_ann_threshold,
        ivf_nprobe=settings.index_ivf_nprobe,
        hnsw_m=settings.index_hnsw_m,
        hnsw_ef_search=settings.index_hnsw_ef_search,
    )


def _is_collection_name(name: str) -> bool:
    try:
        validate_collection(name)
    except Exception:
        return False
    return True


class IndexShard:
    def __init__(self, settings: IndexSettings, remote: SnapshotRemote | None = None) -> None:
        if not 0 <= settings.index_shard < settings.index_shard_count:
            raise ValueError(
                f"index_shard {settings.index_shard} is outside 0..{settings.index_shard_count - 1}"
            )
        if settings.index_dimension <= 0:
            raise ValueError("index_dimension must be positive")
        self.settings = settings
        self.shard = settings.index_shard
        self.shard_count = settings.index_shard_count
        self.data_dir = data_dir_of(settings)
        self.policy = policy_of(settings)
        self.remote = remote
        self._collections: dict[str, CollectionIndex] = {}
        self._create_lock = asyncio.Lock()
        self._write_locks: dict[str, asyncio.Lock] = {}
        self._snapshot_locks: dict[str, asyncio.Lock] = {}
        self._uploaded: dict[str, int] = {}
        self._last_upload_try: dict[str, float] = {}
        self._scheduled: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None

    # ----- lifecycle -----

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for name in await asyncio.to_thread(self._local_collection_names):
            await self._open(name)
        if self.remote is not None:
            await self._restore_missing(self.remote)
        for collection in self._collections.values():
            # A changed index_type or threshold may call for a rebuild; rebuild() checks.
            self._spawn(collection.name, "rebuild", partial(self._rebuild, collection))
        self._ticker = asyncio.create_task(self._tick_forever(), name="index-snapshots")
        log.info(
            "index shard ready",
            extra={
                "shard": self.shard,
                "shard_count": self.shard_count,
                "collections": len(self._collections),
            },
        )

    async def stop(self) -> None:
        """Final snapshot (and upload) of every dirty collection, then close the WALs."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await self.wait_idle()
        for collection in list(self._collections.values()):
            try:
                await self._snapshot(collection)
            except Exception:
                log.exception(
                    "shutdown snapshot failed; the WAL still holds every write",
                    extra={"collection": collection.name},
                )
            await asyncio.to_thread(collection.close)
        self._collections.clear()

    def _local_collection_names(self) -> list[str]:
        # A directory without its identity file is an interrupted restore or creation.
        return sorted(
            p.name
            for p in self.data_dir.iterdir()
            if p.is_dir() and _is_collection_name(p.name) and (p / IDENTITY_FILE).is_file()
        )

    async def _open(self, name: str) -> CollectionIndex:
        collection = await asyncio.to_thread(
            CollectionIndex.open,
            name,
            self.data_dir / name,
            self.policy,
            shard=self.shard,
            shard_count=self.shard_count,
        )
        self._collections[name] = collection
        return collection

    async def _restore_missing(self, remote: SnapshotRemote) -> None:
        """Bring back, from the object store, collections this replica has no local data for.
        An unreachable store only costs the restore: local data is still served."""
        try:
            remote_latest = await asyncio.wait_for(remote.latest_sequences(), _REMOTE_START_TIMEOUT_S)
        except Exception as exc:
            log.warning(
                "object store unreachable at start; serving local data only", extra={"error": repr(exc)}
            )
            return
        for name, sequence in sorted(remote_latest.items()):
            if not _is_collection_name(name):
                continue
            self._uploaded[name] = sequence
            if name in self._collections:
                continue
            try:
                await remote.restore(name, self.data_dir / name)
                await self._open(name)
            except Exception:
                RESTORES.labels("error").inc()
                log.exception("restore from the object store failed", extra={"collection": name})
                continue
            RESTORES.labels("ok").inc()
            log.info(
                "collection restored from the object store", extra={"collection": name, "sequence": sequence}
            )

    # ----- collections -----

    def get(self, name: str) -> CollectionIndex:
        collection = self._collections.get(name)
        if collection is None:
            raise not_found(f"collection {name!r} does not exist on index shard {self.shard}")
        return collection

    async def _get_or_create(self, name: str) -> CollectionIndex:
        collection = self._collections.get(name)
        if collection is not None:
            return collection
        async with self._create_lock:
            collection = self._collections.get(name)
            return collection if collection is not None else await self._open(name)

    def _lock(self, table: dict[str, asyncio.Lock], name: str) -> asyncio.Lock:
        return table.setdefault(name, asyncio.Lock())

    async def _write(self, name: str, create: bool, work: Callable[[CollectionIndex], T]) -> T:
        collection = await self._get_or_create(name) if create else self.get(name)

        def write_and_check() -> tuple[T, bool]:
            # The rebuild check takes the collection's lock: do it here, off the event loop.
            return work(collection), collection.rebuild_target() is not None

        async with self._lock(self._write_locks, name):
            result, rebuild_due = await asyncio.to_thread(write_and_check)
        if collection.pending_wal_records >= self.settings.index_snapshot_every:
            self._spawn(name, "snapshot", partial(self._snapshot_quietly, collection))
        if rebuild_due:
            self._spawn(name, "rebuild", partial(self._rebuild, collection))
        return result

    # ----- operations -----

    async def upsert(self, name: str, chunks: mut.ChunkBatch) -> int:
        return await self._write(name, True, lambda c: c.upsert(chunks))

    async def replace_documents(self, name: str, documents: list[mut.Replacement]) -> ReplaceResult:
        has_upserts = any(d.upserts.chunk_ids for d in documents)
        if name not in self._collections and not has_upserts:
            # Nothing to keep in a collection that does not exist: every keep id is missing.
            missing = [c for d in documents for c in d.keep_chunk_ids]
            return ReplaceResult(0, 0, missing)
        return await self._write(name, True, lambda c: c.replace_documents(documents))

    async def delete(self, name: str, chunk_ids: list[str], doc_ids: list[str]) -> int:
        if name not in self._collections:
            return 0  # deleting from nothing is done (Delete is idempotent)
        return await self._write(name, False, lambda c: c.delete(chunk_ids, doc_ids))

    async def search(self, name: str, query: np.ndarray, top_k: int, doc_ids: list[str]) -> list[Hit]:
        collection = self.get(name)
        return await asyncio.to_thread(collection.search, query, top_k, doc_ids or None)

    async def stats(self, name: str) -> CollectionStats:
        return await asyncio.to_thread(self.get(name).stats)

    async def snapshot(self, name: str) -> tuple[int, bool]:
        return await self._snapshot(self.get(name))

    # ----- background work -----

    def _spawn(self, name: str, kind: str, make: Callable[[], Awaitable[None]]) -> None:
        """Run one background job per (collection, kind) at a time."""
        key = (name, kind)
        if key in self._scheduled:
            return
        self._scheduled.add(key)

        async def run() -> None:
            try:
                await make()
            except Exception:
                log.exception("background %s failed", kind, extra={"collection": name})
            finally:
                self._scheduled.discard(key)

        task = asyncio.create_task(run(), name=f"index-{kind}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _rebuild(self, collection: CollectionIndex) -> None:
        # Keep going while there is a target: writes during a long build may call for another.
        while await asyncio.to_thread(collection.rebuild):
            pass

    async def wait_idle(self) -> None:
        """Wait for scheduled snapshots and rebuilds (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _snapshot_quietly(self, collection: CollectionIndex) -> None:
        await self._snapshot(collection)

    async def _snapshot(self, collection: CollectionIndex) -> tuple[int, bool]:
        async with self._lock(self._snapshot_locks, collection.name):
            outcome = await asyncio.to_thread(collection.snapshot)
            uploaded = await self._upload(collection)
        return outcome.sequence, uploaded

    async def _upload(self, collection: CollectionIndex) -> bool:
        """Upload the current snapshot unless the store already has it. A failure is logged
        and counted, never raised: the next snapshot (or tick) tries again."""
        directory = collection.snapshot_directory
        sequence = collection.snapshot_sequence
        if self.remote is None or not self.settings.index_upload_snapshots or directory is None:
            return False
        if self._uploaded.get(collection.name) == sequence:
            return True
        self._last_upload_try[collection.name] = time.monotonic()
        try:
            await self.remote.upload(collection.name, directory, sequence, collection.directory)
        except Exception as exc:
            UPLOADS.labels("error").inc()
            log.warning(
                "snapshot upload failed; will retry",
                extra={"collection": collection.name, "sequence": sequence, "error": repr(exc)},
            )
            return False
        UPLOADS.labels("ok").inc()
        self._uploaded[collection.name] = sequence
        return True

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(min(_TICK_S, self.settings.index_snapshot_interval_s))
            for collection in list(self._collections.values()):
                if self._snapshot_due(collection) or self._upload_due(collection):
                    self._spawn(collection.name, "snapshot", partial(self._snapshot_quietly, collection))

    def _snapshot_due(self, collection: CollectionIndex) -> bool:
        age = time.monotonic() - collection.last_snapshot_at
        return collection.dirty and age >= self.settings.index_snapshot_interval_s

    def _upload_due(self, collection: CollectionIndex) -> bool:
        if self.remote is None or not self.settings.index_upload_snapshots:
            return False
        if collection.snapshot_directory is None:
            return False
        if self._uploaded.get(collection.name) == collection.snapshot_sequence:
            return False
        last_try = self._last_upload_try.get(collection.name, 0.0)
        return time.monotonic() - last_try >= self.settings.index_snapshot_interval_s
