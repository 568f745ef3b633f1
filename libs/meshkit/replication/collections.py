"""What a replicated store (meshkit.replication.store) needs from its collections (``StoreCollection``)
and from the object store (``CollectionRemote``), what a decoded log entry says (``Decoded``), and
where each collection resumes the log when the store starts (``initial_positions``,
``restored_position``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from meshkit.domain.ids import validate_collection
from meshkit.replication.positions import Positions
from meshkit.replication.snapshots import Pointer


class StoreCollection(Protocol):
    name: str

    @property
    def log_position(self) -> int:
        """Position of the last entry applied to it (persisted with its data)."""
        ...

    @property
    def snapshot_log_id(self) -> str:
        """The log its restored/loaded snapshot belongs to ('' when unknown)."""
        ...

    @property
    def recovered_cleanly(self) -> bool:
        """False when loading it cut data off (a torn WAL tail): it then resumes the log from
        its own last entry, not from the position last saved for it."""
        ...

    def close(self) -> None: ...

    def restart_log(self) -> None: ...


class CollectionRemote(Protocol):
    async def latest(self) -> dict[str, Pointer]: ...

    async def pointer(self, collection: str) -> Pointer | None: ...

    async def restore(self, collection: str, collection_dir: Path) -> Pointer: ...


C = TypeVar("C", bound=StoreCollection)


@dataclass(frozen=True)
class Decoded:
    """A log entry as the store reads it: which collection, what to do, and whether the
    operation creates the collection when it does not exist (a delete does not)."""

    collection: str
    mutation: Any
    creates: bool


def is_collection_name(name: str) -> bool:
    try:
        validate_collection(name)
    except Exception:
        return False
    return True


def restored_position(collection: StoreCollection, log_id: str) -> int:
    """Where a restored snapshot resumes the log: its own position if it belongs to the current
    log, else the log's start."""
    same = bool(log_id) and collection.snapshot_log_id == log_id
    return collection.log_position if same else 0


def initial_positions(
    collections: Mapping[str, StoreCollection], saved: dict[str, Any], log_id: str, restored: dict[str, int]
) -> Positions:
    """Where each collection resumes the log. Positions in another log (it was recreated) mean
    nothing: those collections replay the current log from its start."""
    same_log = bool(log_id) and saved.get("log") == log_id
    saved_pos = saved.get("collections", {})
    at: dict[str, int] = {}
    for name, collection in collections.items():
        if name in restored:
            at[name] = restored[name]
        elif not collection.recovered_cleanly:
            at[name] = collection.log_position if same_log else 0
        elif same_log or (log_id and not saved and collection.snapshot_log_id == log_id):
            at[name] = max(collection.log_position, int(saved_pos.get(name, 0)))
        else:
            at[name] = 0
    saved_cursor = int(saved.get("cursor", 0)) if same_log else 0
    cursor = min(at.values()) if at else saved_cursor
    return Positions(cursor, {n: p for n, p in at.items() if p > cursor}, log_id)
