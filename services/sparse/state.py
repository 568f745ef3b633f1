"""The replication state of a sparse collection in SQLite next to its index: fences
(tombstones included), the log position and log id, and each document's source URI and metadata
(with the metadata index that filters searches)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from meshkit.domain.metadata import Clause, MetadataIndex, narrows
from services.sparse.records import DocumentSourceInfo

STATE_FILE = "state.sqlite"


class CollectionState:
    """Fences (tombstones included) and the log position of one collection, in SQLite next to
    its index: every change is one transaction, fsynced."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS fences (doc_id TEXT PRIMARY KEY, fence INTEGER NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        # Absent in state written before sources existed: created empty.
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS sources "
            "(doc_id TEXT PRIMARY KEY, uri TEXT NOT NULL, metadata TEXT NOT NULL)"
        )
        self.fences: dict[str, int] = dict(self._db.execute("SELECT doc_id, fence FROM fences").fetchall())
        # Searches read the sources from other threads while a write changes them.
        self._sources_lock = threading.Lock()
        self.sources: dict[str, DocumentSourceInfo] = {}
        self.metadata: MetadataIndex[str] = MetadataIndex()
        for doc_id, uri, raw in self._db.execute("SELECT doc_id, uri, metadata FROM sources").fetchall():
            self._put_source(doc_id, DocumentSourceInfo(uri, tuple(sorted(json.loads(raw).items()))))
        meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        self.log_pos = int(meta.get("log_pos", "0"))
        self.log_id = str(meta.get("log", ""))

    def record(
        self,
        fences: dict[str, int],
        log_pos: int,
        sources: Mapping[str, DocumentSourceInfo] | None = None,
        dropped: Iterable[str] = (),
    ) -> None:
        sources = sources or {}
        dropped = [d for d in dropped if d in self.sources]
        if not fences and log_pos <= self.log_pos and not sources and not dropped:
            return
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO sources (doc_id, uri, metadata) VALUES (?, ?, ?)",
                [(d, s.source_uri, json.dumps(dict(s.metadata))) for d, s in sources.items()],
            )
            self._db.executemany("DELETE FROM sources WHERE doc_id = ?", [(d,) for d in dropped])
            self._db.executemany(
                "INSERT INTO fences (doc_id, fence) VALUES (?, ?) "
                "ON CONFLICT(doc_id) DO UPDATE SET fence = excluded.fence",
                list(fences.items()),
            )
            if log_pos > self.log_pos:
                self._db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('log_pos', ?)", (str(log_pos),)
                )
        self.fences.update(fences)
        self.log_pos = max(self.log_pos, log_pos)
        with self._sources_lock:
            for doc_id in dropped:
                self.sources.pop(doc_id, None)
                self.metadata.remove(doc_id)
            for doc_id, source in sources.items():
                self._put_source(doc_id, source)

    def _put_source(self, doc_id: str, source: DocumentSourceInfo) -> None:
        self.sources[doc_id] = source
        self.metadata.put(doc_id, dict(source.metadata))

    def source(self, doc_id: str) -> DocumentSourceInfo:
        with self._sources_lock:
            return self.sources.get(doc_id, DocumentSourceInfo())

    def matching(self, clauses: Sequence[Clause], doc_ids: Sequence[str]) -> list[str]:
        """The documents (of ``doc_ids`` when given) whose metadata satisfies every clause."""
        with self._sources_lock:
            if doc_ids:
                universe: Collection[str] | None = set(doc_ids)
            else:
                # Documents with metadata all have a source: postings need no membership test.
                universe = None if narrows(clauses) else self.sources.keys()
            return sorted(self.metadata.matching(clauses, universe))

    def set_log(self, log_id: str, log_pos: int) -> None:
        with self._transaction():
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('log', ?)", (log_id,))
            self._db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('log_pos', ?)", (str(log_pos),)
            )
        self.log_id, self.log_pos = log_id, log_pos

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def backup_to(self, path: Path) -> None:
        target = sqlite3.connect(str(path))
        try:
            self._db.backup(target)
        finally:
            target.close()

    def close(self) -> None:
        self._db.close()
