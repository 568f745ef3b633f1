"""Quarantine of a replicated store's collections (meshkit.replication.store): moving a collection's files
aside with the reason, the quarantine metrics, and when a quarantined collection is tried again
(``RepairSchedule``)."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from prometheus_client import Counter, Gauge

from meshkit.core.fsutil import fsync_dir, write_atomic

QUARANTINE_DIR = ".quarantine"
REASON_FILE = "QUARANTINE_REASON"
# A quarantined collection is tried again from the object store this often.
REPAIR_EVERY_S = 60.0
# ... but from the same snapshot again only this often (it may lead into a gap every time).
SAME_SNAPSHOT_RETRY_S = 600.0

QUARANTINED = Gauge(
    "ragmesh_store_quarantined_collections",
    "Collections out of service on this replica (the reason is in its log).",
    ["store"],
)
QUARANTINES = Counter(
    "ragmesh_store_quarantines_total", "Collections quarantined on this replica.", ["store"]
)


def move_aside(data_dir: Path, name: str, reason: str) -> str:
    """Move collection ``name``'s files under ``.quarantine/`` with the reason; returns where they
    went ('' when there were none)."""
    source = data_dir / name
    if not source.exists():
        return ""
    root = data_dir / QUARANTINE_DIR
    root.mkdir(exist_ok=True)
    target = root / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    source.rename(target)
    write_atomic(target / REASON_FILE, reason.encode())
    fsync_dir(data_dir)
    return str(target)


def remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)  # leftovers of an earlier, failed restore


class RepairSchedule:
    """When each quarantined collection is tried again: every ``REPAIR_EVERY_S``; from the same
    snapshot only every ``SAME_SNAPSHOT_RETRY_S``; from the log alone (no snapshot) only once."""

    def __init__(self) -> None:
        self._last_try: dict[str, float] = {}
        self._log_only: set[str] = set()
        self._snapshots: dict[str, tuple[str, float]] = {}

    def due(self, name: str) -> bool:
        return time.monotonic() - self._last_try.get(name, 0.0) >= REPAIR_EVERY_S

    def started(self, name: str) -> None:
        self._last_try[name] = time.monotonic()

    def try_snapshot(self, name: str, key: str) -> bool:
        """False when the snapshot ``key`` was tried lately for ``name``; else notes the try."""
        tried = self._snapshots.get(name)
        if tried is not None and tried[0] == key and time.monotonic() - tried[1] < SAME_SNAPSHOT_RETRY_S:
            return False
        self._snapshots[name] = (key, time.monotonic())
        return True

    def try_log_only(self, name: str) -> bool:
        """True the first time only: rebuilding from the log alone is tried once."""
        if name in self._log_only:
            return False
        self._log_only.add(name)
        return True
