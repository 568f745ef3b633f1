"""The open collections of one sparse process, opened on first use."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from services.sparse.collection import Collection

log = logging.getLogger(__name__)


class SparseStore:
    def __init__(self, root: Path, heap_bytes: int, title_boost: float) -> None:
        self.root = root
        self._heap_bytes = heap_bytes
        self._title_boost = title_boost
        self._collections: dict[str, Collection] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Collection | None:
        """The collection, or None when it does not exist. Blocking: opening reads the index
        from disk. ``name`` must already be validated."""
        return self._open(name, create=False)

    def get_or_create(self, name: str) -> Collection:
        collection = self._open(name, create=True)
        assert collection is not None
        return collection

    def _open(self, name: str, create: bool) -> Collection | None:
        with self._lock:
            collection = self._collections.get(name)
            if collection is not None:
                return collection
            if not create and not Collection.exists(self.root, name):
                return None
            collection = Collection(self.root, name, self._heap_bytes, self._title_boost)
            orphans = collection.sweep_orphan_files()
            if orphans:
                log.info("removed orphan chunk files", extra={"collection": name, "files": orphans})
            self._collections[name] = collection
            return collection

    def close(self) -> None:
        with self._lock:
            for collection in self._collections.values():
                collection.close()
            self._collections.clear()
