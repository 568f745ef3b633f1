"""This process's replica of one index shard: its collections, the replicated log that feeds
them, their background work (snapshots, uploads, rebuilds) and quarantine.

Writes: the RPC appends its request to the shard's log (meshkit.replog) and waits until this
replica has applied it. The log reader is the only writer of the collections: one entry at a
time, in log order, in a worker thread, so every replica of the shard goes through the same
states. Reads are local (any replica; another may lag by its apply delay).

Start: open the local collections (a collection that does not load is quarantined, the others
serve), bring back from the object store the ones missing or quarantined here, resume the log
from where each collection is, and report SERVING once caught up (or once the log has been
unreachable for ``store_log_catchup_timeout_s``: local state is served, and caught up later).

All blocking work (FAISS, file I/O, fsync) runs in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from meshkit.errors import ServiceError, deadline_exceeded, not_found, unavailable
from meshkit.fsutil import fsync_dir, write_atomic
from meshkit.ids import validate_collection
from meshkit.replog import (
    Entry,
    LogTimeout,
    LogTransport,
    LogUnavailable,
    Positions,
    ReplicatedLog,
    load_positions,
    transport_for,
)
from meshkit.settings import IndexSettings
from services.index import mutations as mut
from services.index.metrics import QUARANTINED, QUARANTINES, RESTORES, UPLOADS
from services.index.remote import SnapshotRemote
from services.index.store import (
    IDENTITY_FILE,
    CollectionIndex,
    CollectionStats,
    DocumentEntry,
    Hit,
    IndexPolicy,
    ReplaceResult,
)

log = logging.getLogger(__name__)

# How often the background loop looks for due snapshots, uploads, repairs and saves positions.
_TICK_S = 1.0
# A start-up probe of the object store must not hold the service back for long.
_REMOTE_START_TIMEOUT_S = 20.0
# A quarantined collection is tried again from the object store this often.
_REPAIR_EVERY_S = 60.0
POSITIONS_FILE = "log-positions.json"
QUARANTINE_DIR = ".quarantine"
# Bytes of a log entry per chunk beyond its vector (ids and JSON framing), for packing entries.
_CHUNK_OVERHEAD_BYTES = 96


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


@dataclass(frozen=True)
class Restored:
    collection: CollectionIndex
    log_pos: int


class IndexShard:
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
        self.settings = settings
        self.shard = settings.index_shard
        self.shard_count = settings.index_shard_count
        self.data_dir = data_dir_of(settings)
        self.policy = policy_of(settings)
        self.remote = remote
        self.transport = transport or transport_for(
            settings,
            settings.index_log_stream,
            "index",
            self.shard,
            client_name=f"index-{self.shard}-{uuid.uuid4().hex[:6]}",
        )
        self.log = ReplicatedLog(
            self.transport,
            self._apply_entry,
            poll_s=settings.store_log_poll_s,
            on_gap=self._on_gap,
            on_reset=self._on_reset,
        )
        self._collections: dict[str, CollectionIndex] = {}
        self._quarantined: dict[str, str] = {}
        self._snapshot_locks: dict[str, asyncio.Lock] = {}
        self._uploaded: dict[str, int] = {}
        self._last_upload_try: dict[str, float] = {}
        self._last_repair_try: dict[str, float] = {}
        self._scheduled: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._saved_positions: dict[str, Any] = {}

    @property
    def positions_path(self) -> Path:
        return self.data_dir / POSITIONS_FILE

    # ----- lifecycle -----

    async def start(self) -> None:
        await asyncio.to_thread(self.data_dir.mkdir, parents=True, exist_ok=True)
        saved = await asyncio.to_thread(load_positions, self.positions_path)
        self._quarantined = {str(k): str(v) for k, v in saved.get("quarantined", {}).items()}
        await self.transport.open()
        log_id = await self._current_log_id(str(saved.get("log", "")))
        for name in await asyncio.to_thread(self._local_collection_names):
            if name not in self._quarantined:
                await self._open_or_quarantine(name)
        restored = await self._restore_from_remote(log_id) if self.remote is not None else {}
        lost = set(saved.get("collections", {})) - set(self._collections) - set(self._quarantined)
        for name in sorted(lost):
            # Known here before, its data gone and not in the object store: rebuilt from the log.
            log.warning("collection data lost; rebuilding it from the log", extra={"collection": name})
            await self._open_or_quarantine(name)
        self.log.positions = self._initial_positions(saved, log_id, restored)
        resume = getattr(self.transport, "resume_at", None)
        if resume is not None:
            resume(max([self.log.positions.cursor, *self.log.positions.ahead.values()]))
        await self._save_positions()
        await self.log.start()
        if not await self.log.wait_caught_up(self.settings.store_log_catchup_timeout_s):
            log.warning(
                "replicated log unreachable; serving local state, catching up when it is back",
                extra={"shard": self.shard, "error": self.log.last_error},
            )
        for collection in self._collections.values():
            # A changed index_type or threshold may call for a rebuild; rebuild() checks.
            self._spawn(collection.name, "rebuild", partial(self._rebuild, collection))
        self._ticker = asyncio.create_task(self._tick_forever(), name="index-background")
        log.info(
            "index shard ready",
            extra={
                "shard": self.shard,
                "shard_count": self.shard_count,
                "collections": len(self._collections),
                "quarantined": sorted(self._quarantined),
                "log_position": self.log.positions.cursor,
            },
        )

    async def stop(self) -> None:
        """Stop applying, then a final snapshot (and upload) of every dirty collection."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await self.log.stop()
        await self.wait_idle()
        for collection in list(self._collections.values()):
            try:
                await self._snapshot(collection)
            except Exception:
                log.exception(
                    "shutdown snapshot failed; the WAL still holds every write",
                    extra={"collection": collection.name},
                )
        with contextlib.suppress(Exception):
            await self._save_positions()
        for collection in list(self._collections.values()):
            await asyncio.to_thread(collection.close)
        self._collections.clear()
        await self.transport.close()

    async def _current_log_id(self, saved: str) -> str:
        """The log's identity, waiting a bounded time for an unreachable log (then the saved one:
        the reader checks again once it is back)."""
        deadline = time.monotonic() + self.settings.store_log_catchup_timeout_s
        while True:
            try:
                return await self.transport.identity()
            except LogUnavailable:
                if time.monotonic() >= deadline:
                    return saved
                await asyncio.sleep(0.2)

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

    async def _open_or_quarantine(self, name: str) -> None:
        try:
            await self._open(name)
        except Exception as exc:
            await self._quarantine(name, f"its local data does not load: {exc}")

    def _initial_positions(self, saved: dict[str, Any], log_id: str, restored: dict[str, int]) -> Positions:
        """Where each collection resumes the log. Positions of another log (it was recreated)
        mean nothing: those collections replay the current log from its start."""
        same_log = bool(log_id) and saved.get("log") == log_id
        saved_pos = saved.get("collections", {})
        at: dict[str, int] = {}
        for name, collection in self._collections.items():
            if name in restored:
                at[name] = restored[name]
            elif same_log or (log_id and collection.snapshot_log_id == log_id and not saved):
                at[name] = max(collection.log_position, int(saved_pos.get(name, 0)))
            else:
                at[name] = 0
        saved_cursor = int(saved.get("cursor", 0)) if same_log else 0
        cursor = min(at.values()) if at else saved_cursor
        return Positions(cursor, {n: p for n, p in at.items() if p > cursor}, log_id)

    async def _restore_from_remote(self, log_id: str) -> dict[str, int]:
        """Bring back, from the object store, collections this replica has no local data for (or
        whose data is quarantined); returns their log positions. An unreachable store only
        costs the restore: local data is still served."""
        assert self.remote is not None
        try:
            pointers = await asyncio.wait_for(self.remote.latest(), _REMOTE_START_TIMEOUT_S)
        except Exception as exc:
            log.warning(
                "object store unreachable at start; serving local data only", extra={"error": str(exc)}
            )
            return {}
        restored: dict[str, int] = {}
        for name, pointer in sorted(pointers.items()):
            if not _is_collection_name(name):
                continue
            self._uploaded[name] = pointer.log_pos if pointer.log_id == log_id else -1
            if name in self._collections:
                continue
            result = await self._restore(name)
            if result is not None:
                self._collections[name] = result.collection
                self._quarantined.pop(name, None)
                restored[name] = result.log_pos if log_id and pointer.log_id == log_id else 0
        return restored

    async def _restore(self, name: str) -> Restored | None:
        assert self.remote is not None
        try:
            await asyncio.to_thread(self._clear_collection_dir, name)
            pointer = await self.remote.restore(name, self.data_dir / name)
            collection = await asyncio.to_thread(
                CollectionIndex.open,
                name,
                self.data_dir / name,
                self.policy,
                shard=self.shard,
                shard_count=self.shard_count,
            )
        except Exception as exc:
            RESTORES.labels("error").inc()
            log.error("restore from the object store failed", extra={"collection": name, "error": str(exc)})
            return None
        RESTORES.labels("ok").inc()
        log.info(
            "collection restored from the object store",
            extra={"collection": name, "log_position": pointer.log_pos},
        )
        return Restored(collection, pointer.log_pos)

    def _clear_collection_dir(self, name: str) -> None:
        path = self.data_dir / name
        if path.exists():
            shutil.rmtree(path)

    # ----- quarantine -----

    async def _quarantine(self, name: str, reason: str) -> None:
        """Take one collection out of service (its files moved aside, the reason kept) so the
        shard serves every other one; it comes back from the object store and the log."""
        collection = self._collections.pop(name, None)
        if collection is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(collection.close)
        moved = await asyncio.to_thread(self._move_aside, name, reason)
        self._quarantined[name] = reason
        self.log.positions.forget(name)
        QUARANTINES.inc()
        QUARANTINED.set(len(self._quarantined))
        log.error(
            "collection quarantined",
            extra={"collection": name, "shard": self.shard, "reason": reason, "moved_to": moved},
        )
        with contextlib.suppress(Exception):
            await self._save_positions()

    def _move_aside(self, name: str, reason: str) -> str:
        source = self.data_dir / name
        if not source.exists():
            return ""
        root = self.data_dir / QUARANTINE_DIR
        root.mkdir(exist_ok=True)
        target = root / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        source.rename(target)
        write_atomic(target / "QUARANTINE_REASON", reason.encode())
        fsync_dir(self.data_dir)
        return str(target)

    async def _repair(self, name: str) -> None:
        """Restore a quarantined collection from the object store, then let the log reader
        rewind to the snapshot's position (the other collections skip what they hold)."""
        if self.remote is None or name not in self._quarantined:
            return
        self._last_repair_try[name] = time.monotonic()
        result = await self._restore(name)
        if result is None:
            return

        async def register() -> None:
            positions = self.log.positions
            pointer_log = result.collection.snapshot_log_id
            pos = result.log_pos if pointer_log and pointer_log == positions.log_id else 0
            live = list(self._collections)
            self._collections[name] = result.collection
            self._quarantined.pop(name, None)
            QUARANTINED.set(len(self._quarantined))
            if positions.place(name, pos):
                self.log.rewind_now(pos, live)
            log.info("quarantined collection restored", extra={"collection": name, "log_position": pos})
            await self._save_positions()

        await self.log.between_entries(register)

    async def _on_gap(self, after: int, prev: int) -> None:
        reason = (
            f"the log no longer holds entries between positions {after} and {prev} (retention): "
            "this replica cannot complete it"
        )
        for name in list(self._collections):
            if self.log.positions.of(name) < prev:
                await self._quarantine(name, reason)

    async def _on_reset(self, log_id: str) -> None:
        for collection in self._collections.values():
            await asyncio.to_thread(collection.restart_log)
        await self._save_positions()

    async def _save_positions(self) -> None:
        names = sorted(self._collections)
        data = {**self.log.positions.dump(names), "quarantined": dict(self._quarantined)}
        if data == self._saved_positions:
            return
        await asyncio.to_thread(write_atomic, self.positions_path, json.dumps(data, sort_keys=True).encode())
        self._saved_positions = data

    # ----- applying the log -----

    async def _apply_entry(self, entry: Entry) -> Any:
        try:
            record = mut.decode_record(entry.data, self.policy.dimension)
        except mut.CorruptRecord as exc:
            # Every replica meets the same bytes: skipping it keeps them alike.
            log.error("undecodable log entry skipped", extra={"seq": entry.seq, "error": str(exc)})
            raise unavailable("the write could not be decoded by the index; it was not applied") from None
        name = record.collection
        if name in self._quarantined:
            raise self._quarantined_error(name)
        if not self.log.positions.needs(name, entry.seq):
            return None  # already in this collection's state (restored past it)
        collection = self._collections.get(name)
        if collection is None:
            if isinstance(record.mutation, mut.Delete):
                return 0  # nothing to delete from
            try:
                collection = await self._open(name)
            except Exception as exc:
                await self._quarantine(name, f"creating it failed: {exc}")
                raise self._quarantined_error(name) from None
        try:
            result, rebuild_due = await asyncio.to_thread(_apply, collection, record.mutation, entry.seq)
        except ServiceError:
            raise  # a deterministic refusal: every replica refuses it alike
        except Exception as exc:
            await self._quarantine(name, f"applying log entry {entry.seq} failed: {exc}")
            raise self._quarantined_error(name) from None
        if collection.pending_wal_records >= self.settings.index_snapshot_every:
            self._spawn(name, "snapshot", partial(self._snapshot_quietly, collection))
        if rebuild_due:
            self._spawn(name, "rebuild", partial(self._rebuild, collection))
        return result

    def _quarantined_error(self, name: str) -> ServiceError:
        return unavailable(
            f"collection {name!r} is quarantined on this replica of index shard {self.shard} "
            f"({self._quarantined.get(name, 'unknown reason')}); another replica may serve it"
        )

    # ----- collections -----

    def get(self, name: str) -> CollectionIndex:
        collection = self._collections.get(name)
        if collection is None:
            if name in self._quarantined:
                raise self._quarantined_error(name)
            raise not_found(f"collection {name!r} does not exist on index shard {self.shard}")
        return collection

    # ----- operations -----

    async def _submit(self, name: str, mutation: mut.Mutation, timeout_s: float) -> Any:
        if name in self._quarantined:
            raise self._quarantined_error(name)
        try:
            return await self.log.submit(mut.encode(mutation, collection=name), timeout_s)
        except LogUnavailable as exc:
            log.warning("log append failed", extra={"collection": name, "error": str(exc)})
            raise unavailable(
                f"index shard {self.shard}: the replicated log is unreachable; nothing was written, retry"
            ) from None
        except LogTimeout as exc:
            raise deadline_exceeded(f"index shard {self.shard}: {exc}") from None

    def _entry_budget(self) -> int:
        return self.transport.max_message_bytes

    def _chunk_bytes(self) -> int:
        return self.policy.dimension * 4 + _CHUNK_OVERHEAD_BYTES

    async def upsert(self, name: str, chunks: mut.ChunkBatch, timeout_s: float) -> int:
        per_entry = max(1, self._entry_budget() // self._chunk_bytes())
        groups = [
            mut.ChunkBatch(
                chunks.chunk_ids[i : i + per_entry],
                chunks.doc_ids[i : i + per_entry],
                chunks.vectors[i : i + per_entry],
            )
            for i in range(0, len(chunks.chunk_ids), per_entry)
        ]
        results = await asyncio.gather(*(self._submit(name, mut.Upsert(g), timeout_s) for g in groups))
        return sum(int(r or 0) for r in results)

    async def replace_documents(
        self, name: str, documents: list[mut.Replacement], timeout_s: float
    ) -> ReplaceResult:
        """Each document's replacement is atomic; documents are packed into log entries of
        bounded size (a big document is one entry of several parts)."""
        groups = _pack(documents, self._entry_budget(), self._chunk_bytes())
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

    async def search(self, name: str, query: np.ndarray, top_k: int, doc_ids: list[str]) -> list[Hit]:
        collection = self.get(name)
        return await asyncio.to_thread(collection.search, query, top_k, doc_ids or None)

    async def stats(self, name: str) -> CollectionStats:
        return await asyncio.to_thread(self.get(name).stats)

    def log_position(self, name: str) -> int:
        return self.log.positions.of(name)

    async def list_documents(self, name: str, after: str, limit: int) -> list[DocumentEntry]:
        return await asyncio.to_thread(self.get(name).list_documents, after, limit)

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
        async with self._snapshot_locks.setdefault(collection.name, asyncio.Lock()):
            outcome = await asyncio.to_thread(
                collection.snapshot,
                log_position=partial(self.log.positions.of, collection.name),
                log_id=self.log.positions.log_id,
            )
            uploaded = await self._upload(collection)
        return outcome.sequence, uploaded

    async def _upload(self, collection: CollectionIndex) -> bool:
        """Upload the current snapshot unless the store already has it (from this replica or
        another one of the shard). A failure is logged and counted, never raised: the next
        snapshot (or tick) tries again."""
        directory = collection.snapshot_directory
        log_pos = collection.snapshot_log_position
        if self.remote is None or not self.settings.index_upload_snapshots or directory is None:
            return False
        if self._uploaded.get(collection.name) == log_pos:
            return True
        self._last_upload_try[collection.name] = time.monotonic()
        log_id = collection.snapshot_log_id
        try:
            current = await self.remote.pointer(collection.name)
            if current is not None and current.log_id == log_id and current.log_pos >= log_pos:
                self._uploaded[collection.name] = log_pos
                return True
            await self.remote.upload(collection.name, directory, log_pos, log_id, collection.directory)
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

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(min(_TICK_S, self.settings.index_snapshot_interval_s))
            for collection in list(self._collections.values()):
                if self._snapshot_due(collection) or self._upload_due(collection):
                    self._spawn(collection.name, "snapshot", partial(self._snapshot_quietly, collection))
            for name in list(self._quarantined):
                if self._repair_due(name):
                    self._spawn(name, "repair", partial(self._repair, name))
            try:
                await self._save_positions()
            except Exception:
                log.exception("saving log positions failed")

    def _snapshot_due(self, collection: CollectionIndex) -> bool:
        age = time.monotonic() - collection.last_snapshot_at
        return collection.dirty and age >= self.settings.index_snapshot_interval_s

    def _upload_due(self, collection: CollectionIndex) -> bool:
        if self.remote is None or not self.settings.index_upload_snapshots:
            return False
        if collection.snapshot_directory is None:
            return False
        if self._uploaded.get(collection.name) == collection.snapshot_log_position:
            return False
        last_try = self._last_upload_try.get(collection.name, 0.0)
        return time.monotonic() - last_try >= self.settings.index_snapshot_interval_s

    def _repair_due(self, name: str) -> bool:
        if self.remote is None:
            return False
        return time.monotonic() - self._last_repair_try.get(name, 0.0) >= _REPAIR_EVERY_S


def _apply(collection: CollectionIndex, mutation: mut.Mutation, pos: int) -> tuple[Any, bool]:
    """One log entry on one collection; also whether a rebuild is due (checked here, off the
    event loop, since it takes the collection's lock)."""
    result: Any
    if isinstance(mutation, mut.Upsert):
        result = collection.upsert(mutation.chunks, pos)
    elif isinstance(mutation, mut.Replace):
        result = collection.replace_documents(mutation.documents, pos)
    else:
        result = collection.delete(mutation.chunk_ids, mutation.doc_ids, pos)
    return result, collection.rebuild_target() is not None


def _pack(documents: Sequence[mut.Replacement], budget: int, chunk_bytes: int) -> list[list[mut.Replacement]]:
    """Documents in request order, grouped so each group's entry stays within ``budget`` bytes
    (a document bigger than that is a group alone)."""
    groups: list[list[mut.Replacement]] = []
    current: list[mut.Replacement] = []
    size = 0
    for doc in documents:
        doc_size = len(doc.upserts.chunk_ids) * chunk_bytes + len(doc.keep_chunk_ids) * 40 + 128
        if current and size + doc_size > budget:
            groups.append(current)
            current, size = [], 0
        current.append(doc)
        size += doc_size
    if current:
        groups.append(current)
    return groups
