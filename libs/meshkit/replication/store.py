"""A store of collections fed by a replicated log (meshkit.replication.log): what the index shards and
the sparse store share around their own data structures.

- **Writes** (``submit``): the request is appended to the log; the log reader applies every
  entry, in order, through the store's ``apply_mutation`` (a worker thread, one at a time),
  and the writer answers with its own entry's result.
- **Start** (``start``): open the local collections (one that does not load is quarantined,
  the others serve), restore from the object store those missing or quarantined here, resume
  the log from where each collection is (``Positions``), and return once caught up, or once
  the log has been unreachable for ``store_log_catchup_timeout_s`` (local state is served
  then, and caught up when the log is back).
- **Quarantine**: a collection that fails to load or to apply an entry, or whose missing
  entries the log no longer holds (a gap), is taken out of service: its files are moved under
  ``.quarantine/`` with the reason, calls for it answer UNAVAILABLE with the reason (callers
  retry another replica), every other collection is served, and it is restored from the
  object store + the log as soon as that works (retried every minute).
- **Positions** are saved every second in ``log-positions.json`` with the quarantined
  collections, so a restart resumes each collection where it was.

What collections provide and where they resume is in ``replstore_collections``; moving files
aside and the repair timing in ``replstore_quarantine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Generic

from prometheus_client import Counter, Gauge

from meshkit.core.errors import ServiceError, deadline_exceeded, not_found, unavailable
from meshkit.core.fsutil import write_atomic
from meshkit.replication.collections import (
    C,
    CollectionRemote,
    Decoded,
    initial_positions,
    is_collection_name,
    restored_position,
)
from meshkit.replication.log import Entry, LogTimeout, ReplicatedLog
from meshkit.replication.positions import load_positions
from meshkit.replication.quarantine import (
    QUARANTINED,
    QUARANTINES,
    RepairSchedule,
    move_aside,
    remove_tree,
)
from meshkit.replication.transport import LogTransport, LogUnavailable
from meshkit.settings import StoreSettings

log = logging.getLogger(__name__)

POSITIONS_FILE = "log-positions.json"
# How often the background loop saves positions and looks for due work.
TICK_S = 1.0
# A start-up probe of the object store must not hold the service back for long.
REMOTE_START_TIMEOUT_S = 20.0
RESTORES = Counter(
    "ragmesh_store_restores_total",
    "Collections restored from the object store, by result.",
    ["store", "result"],
)
LOG_POSITION = Gauge("ragmesh_store_log_position", "Position in the replicated log applied here.", ["store"])
LOG_GAPS = Counter(
    "ragmesh_store_log_gaps_total", "Entries the log no longer held when this replica needed them.", ["store"]
)


class ReplicatedStore(Generic[C]):
    """Subclasses provide the collection type's operations (all blocking, run in threads):
    ``open_collection``, ``decode``, ``apply_mutation``, ``has_local_data``; and may hook
    ``after_apply``, ``on_tick`` and ``before_stop``."""

    #: Metric label and the start of messages ("index shard 2", "sparse").
    store: str = "store"

    def __init__(
        self,
        settings: StoreSettings,
        data_dir: Path,
        transport: LogTransport,
        remote: CollectionRemote | None,
        label: str,
    ) -> None:
        self.settings = settings
        self.data_dir = data_dir
        self.transport = transport
        self.remote = remote
        self.label = label
        self.log = ReplicatedLog(
            transport,
            self._apply_entry,
            poll_s=settings.store_log_poll_s,
            on_gap=self._on_gap,
            on_reset=self._on_reset,
        )
        self.collections: dict[str, C] = {}
        self.quarantined: dict[str, str] = {}
        self._repairs = RepairSchedule()
        self._scheduled: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._saved_positions: dict[str, Any] = {}

    # ----- what a store provides -----

    def open_collection(self, name: str) -> C:
        """Open (or create) the collection's local data; raises when it does not load."""
        raise NotImplementedError

    def has_local_data(self, name: str) -> bool:
        raise NotImplementedError

    def decode(self, data: bytes) -> Decoded:
        """Raises ValueError for bytes that are no entry of this store."""
        raise NotImplementedError

    def apply_mutation(self, collection: C, mutation: Any, pos: int) -> Any:
        """Apply one entry; a ServiceError is a deterministic refusal (every replica refuses
        alike, the collection is unchanged); anything else quarantines the collection."""
        raise NotImplementedError

    async def after_apply(self, collection: C, result: Any) -> None:
        return None

    async def on_tick(self) -> None:
        return None

    async def before_stop(self) -> None:
        return None

    # ----- lifecycle -----

    @property
    def positions_path(self) -> Path:
        return self.data_dir / POSITIONS_FILE

    async def start(self) -> None:
        await asyncio.to_thread(self.data_dir.mkdir, parents=True, exist_ok=True)
        saved = await asyncio.to_thread(load_positions, self.positions_path)
        self.quarantined = {str(k): str(v) for k, v in saved.get("quarantined", {}).items()}
        await self.transport.open()
        log_id = await self._current_log_id(str(saved.get("log", "")))
        for name in await asyncio.to_thread(self._local_names):
            if name not in self.quarantined:
                await self._open_or_quarantine(name)
        restored = await self._restore_from_remote(log_id) if self.remote is not None else {}
        lost = set(saved.get("collections", {})) - set(self.collections) - set(self.quarantined)
        for name in sorted(lost):
            # Known here before, its data gone and not in the object store: rebuilt from the log.
            log.warning("collection data lost; rebuilding it from the log", extra={"collection": name})
            await self._open_or_quarantine(name)
        self.log.positions = initial_positions(self.collections, saved, log_id, restored)
        resume = getattr(self.transport, "resume_at", None)
        if resume is not None:
            resume(max([self.log.positions.cursor, *self.log.positions.ahead.values()]))
        QUARANTINED.labels(self.store).set(len(self.quarantined))
        await self.save_positions()
        await self.log.start()
        if not await self.log.wait_caught_up(self.settings.store_log_catchup_timeout_s):
            log.warning(
                "replicated log unreachable; serving local state, catching up when it is back",
                extra={"store": self.label, "error": self.log.last_error},
            )
        self._ticker = asyncio.create_task(self._tick_forever(), name=f"{self.store}-background")

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await self.log.stop()
        await self.wait_idle()
        await self.before_stop()
        with contextlib.suppress(Exception):
            await self.save_positions()
        for collection in list(self.collections.values()):
            await asyncio.to_thread(collection.close)
        self.collections.clear()
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

    def _local_names(self) -> list[str]:
        return sorted(
            p.name
            for p in self.data_dir.iterdir()
            if p.is_dir() and is_collection_name(p.name) and self.has_local_data(p.name)
        )

    async def open(self, name: str) -> C:
        collection = await asyncio.to_thread(self.open_collection, name)
        self.collections[name] = collection
        return collection

    async def _open_or_quarantine(self, name: str) -> None:
        try:
            await self.open(name)
        except Exception as exc:
            await self.quarantine(name, "its local data does not load", str(exc))

    async def _restore_from_remote(self, log_id: str) -> dict[str, int]:
        """Bring back, from the object store, collections this replica has no local data for (or
        whose data is quarantined); returns where each is in the log. An unreachable store only
        costs the restore: local data is still served."""
        assert self.remote is not None
        try:
            pointers = await asyncio.wait_for(self.remote.latest(), REMOTE_START_TIMEOUT_S)
        except Exception as exc:
            log.warning(
                "object store unreachable at start; serving local data only", extra={"error": str(exc)}
            )
            return {}
        restored: dict[str, int] = {}
        for name in sorted(pointers):
            if not is_collection_name(name) or name in self.collections:
                continue
            collection = await self._restore(name)
            if collection is not None:
                self.collections[name] = collection
                self.quarantined.pop(name, None)
                restored[name] = restored_position(collection, log_id)
        return restored

    async def _restore(self, name: str) -> C | None:
        assert self.remote is not None
        directory = self.data_dir / name
        try:
            await asyncio.to_thread(remove_tree, directory)
            pointer = await self.remote.restore(name, directory)
            collection = await asyncio.to_thread(self.open_collection, name)
        except Exception as exc:
            RESTORES.labels(self.store, "error").inc()
            log.error("restore from the object store failed", extra={"collection": name, "error": str(exc)})
            return None
        RESTORES.labels(self.store, "ok").inc()
        log.info(
            "collection restored from the object store",
            extra={"collection": name, "log_position": pointer.log_pos},
        )
        return collection

    # ----- quarantine -----

    async def quarantine(self, name: str, reason: str, detail: str = "") -> None:
        """Take one collection out of service (its files moved aside, the reason kept) so the
        store serves every other one; it comes back from the object store and the log.
        ``reason`` is told to callers; ``detail`` (paths, errors) only to the log and the files."""
        collection = self.collections.pop(name, None)
        if collection is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(collection.close)
        moved = await asyncio.to_thread(
            move_aside, self.data_dir, name, f"{reason}: {detail}" if detail else reason
        )
        self.quarantined[name] = reason
        self.log.positions.forget(name)
        QUARANTINES.labels(self.store).inc()
        QUARANTINED.labels(self.store).set(len(self.quarantined))
        log.error(
            "collection quarantined",
            extra={
                "collection": name,
                "store": self.label,
                "reason": reason,
                "detail": detail,
                "moved_to": moved,
            },
        )
        with contextlib.suppress(Exception):
            await self.save_positions()

    def quarantined_error(self, name: str) -> ServiceError:
        return unavailable(
            f"collection {name!r} is quarantined on this replica of {self.label} "
            f"({self.quarantined.get(name, 'unknown reason')}); another replica may serve it"
        )

    async def repair(self, name: str) -> None:
        """Restore a quarantined collection from the object store (or, without a snapshot there,
        once, from the log alone), then let the log reader rewind to where it resumes; the other
        collections skip what they already hold. A gap on the way quarantines it again."""
        if name not in self.quarantined:
            return
        self._repairs.started(name)
        collection: C | None = None
        pointer = None
        if self.remote is not None:
            try:
                pointer = await self.remote.pointer(name)
            except Exception as exc:
                log.warning(
                    "object store unreachable; repair postponed",
                    extra={"collection": name, "error": str(exc)},
                )
                return
        if pointer is not None:
            if not self._repairs.try_snapshot(name, pointer.key):
                return  # this snapshot did not do it (a gap after it?): wait for a newer one
            collection = await self._restore(name)
        elif self._repairs.try_log_only(name):
            collection = await self._from_empty(name)
        if collection is None:
            return

        async def register() -> None:
            positions = self.log.positions
            pos = restored_position(collection, positions.log_id)
            live = list(self.collections)
            self.collections[name] = collection
            self.quarantined.pop(name, None)
            QUARANTINED.labels(self.store).set(len(self.quarantined))
            if positions.place(name, pos):
                self.log.rewind_now(pos, live)
            log.info("quarantined collection restored", extra={"collection": name, "log_position": pos})
            await self.save_positions()

        await self.log.between_entries(register)

    async def _from_empty(self, name: str) -> C | None:
        try:
            await asyncio.to_thread(remove_tree, self.data_dir / name)
            return await asyncio.to_thread(self.open_collection, name)
        except Exception as exc:
            log.error(
                "could not recreate a collection to replay", extra={"collection": name, "error": str(exc)}
            )
            return None

    async def _on_gap(self, after: int, prev: int) -> None:
        LOG_GAPS.labels(self.store).inc()
        reason = "the replicated log no longer holds writes this replica misses"
        detail = (
            f"entries between positions {after} and {prev} were removed (retention) before they were read"
        )
        for name in list(self.collections):
            if self.log.positions.of(name) < prev:
                await self.quarantine(name, reason, detail)

    async def _on_reset(self, log_id: str) -> None:
        for collection in self.collections.values():
            await asyncio.to_thread(collection.restart_log)
        await self.save_positions()

    async def save_positions(self) -> None:
        names = sorted(self.collections)
        data = {**self.log.positions.dump(names), "quarantined": dict(self.quarantined)}
        LOG_POSITION.labels(self.store).set(self.log.positions.cursor)
        if data == self._saved_positions:
            return
        await asyncio.to_thread(write_atomic, self.positions_path, json.dumps(data, sort_keys=True).encode())
        self._saved_positions = data

    # ----- the log -----

    async def _apply_entry(self, entry: Entry) -> Any:
        try:
            decoded = self.decode(entry.data)
        except ValueError as exc:
            # Every replica meets the same bytes: skipping it keeps them alike.
            log.error("undecodable log entry skipped", extra={"seq": entry.seq, "error": str(exc)})
            raise unavailable(f"{self.label} could not decode the write; it was not applied") from None
        name = decoded.collection
        if name in self.quarantined:
            raise self.quarantined_error(name)
        if not self.log.positions.needs(name, entry.seq):
            return None  # already in this collection's state (restored past it)
        collection = self.collections.get(name)
        if collection is None:
            if not decoded.creates:
                return None
            try:
                collection = await self.open(name)
            except Exception as exc:
                await self.quarantine(name, "it could not be created", str(exc))
                raise self.quarantined_error(name) from None
        try:
            result = await asyncio.to_thread(self.apply_mutation, collection, decoded.mutation, entry.seq)
        except ServiceError:
            raise
        except Exception as exc:
            await self.quarantine(name, "a write could not be applied", f"log entry {entry.seq}: {exc}")
            raise self.quarantined_error(name) from None
        await self.after_apply(collection, result)
        return result

    async def submit(self, name: str, data: bytes, timeout_s: float) -> Any:
        """Append one entry for ``name`` and wait until this replica applied it."""
        if name in self.quarantined:
            raise self.quarantined_error(name)
        try:
            return await self.log.submit(data, timeout_s)
        except LogUnavailable as exc:
            log.warning("log append failed", extra={"collection": name, "error": str(exc)})
            raise unavailable(
                f"{self.label}: the replicated log did not take the write (unreachable, or no "
                "acknowledgement); retry"
            ) from None
        except LogTimeout as exc:
            raise deadline_exceeded(f"{self.label}: {exc}") from None

    def get(self, name: str) -> C:
        collection = self.collections.get(name)
        if collection is None:
            if name in self.quarantined:
                raise self.quarantined_error(name)
            raise not_found(f"collection {name!r} does not exist on {self.label}")
        return collection

    def log_position(self, name: str) -> int:
        return self.log.positions.of(name)

    # ----- background work -----

    def spawn(self, name: str, kind: str, make: Callable[[], Awaitable[None]]) -> None:
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

        task = asyncio.create_task(run(), name=f"{self.store}-{kind}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Wait for scheduled background jobs (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.on_tick()
                for name in list(self.quarantined):
                    if self._repairs.due(name):
                        self.spawn(name, "repair", lambda n=name: self.repair(n))  # type: ignore[misc]
                await self.save_positions()
            except Exception:
                log.exception("background tick failed", extra={"store": self.label})
