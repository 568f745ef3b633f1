"""The ingestion API's status index: a persistent, ordered copy of the status bucket
(``ragmesh_doc_status``) in SQLite (the standard library's), so that status counts, listings,
folder syncs and reindex passes never load every document.

The status bucket stays the lifecycle's source of truth: its compare-and-set revisions are the
fences, and every write still goes through ``buckets.update_status``. This index is derived
from it (``follow.IndexFollower`` feeds it the bucket's entries in stream order, and the API
applies its own writes at once) and can always be rebuilt from it:

- ``docs``: one ``rows.Row`` per document, keyed by (collection, doc id), so a page of a
  collection in doc id order is a range of the key (keyset pagination: a page costs its size);
  an index on (collection, source_uri, doc id) gives a folder's documents the same way.
- ``counts``: documents and chunks per (collection, state), kept by triggers in the same
  transaction as the row change, so collection counts are exact and cost one lookup.
- ``changes``: a counter per collection bumped by every row change (a reindex pass knows
  whether a generation changed while it walked it).
- ``meta``: the schema version, the bucket's identity (its stream's creation time: another
  bucket generation, e.g. a NATS server that lost its data, means rebuild) and the last stream
  sequence applied, where the watch resumes.

Every row change is gated by revision (an older revision never replaces a newer one), so the
watch and the API's own writes may arrive in any order and apply twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from services.ingestion.lifecycle.machine import DELETED, INDEXED, STATES
from services.ingestion.lifecycle.rows import COLUMNS, Row

log = logging.getLogger("services.ingestion.status_index")

SCHEMA_VERSION = "2"
INDEX_FILE = "status-index.sqlite3"
LOCK_FILE = "status-index.lock"
# SQLite page cache (KiB): bounds the index's share of the API's memory whatever its size.
CACHE_KIB = 64 * 1024
# Pages the write-ahead log may grow to before it is copied into the database.
CHECKPOINT_PAGES = 10_000

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS docs (
    collection TEXT NOT NULL, doc_id TEXT NOT NULL, key TEXT NOT NULL, revision INTEGER NOT NULL,
    state TEXT NOT NULL, chunks INTEGER NOT NULL, source_uri TEXT NOT NULL, op TEXT NOT NULL,
    target_sha256 TEXT NOT NULL, indexed_sha256 TEXT NOT NULL, indexed_version INTEGER NOT NULL,
    source_digest TEXT NOT NULL,
    PRIMARY KEY (collection, doc_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS docs_by_source ON docs (collection, source_uri, doc_id);
CREATE INDEX IF NOT EXISTS docs_by_key ON docs (collection, key);
CREATE TABLE IF NOT EXISTS removed (
    collection TEXT NOT NULL, key TEXT NOT NULL, revision INTEGER NOT NULL, PRIMARY KEY (collection, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counts (
    collection TEXT NOT NULL, state TEXT NOT NULL, docs INTEGER NOT NULL, chunks INTEGER NOT NULL,
    PRIMARY KEY (collection, state)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (collection TEXT PRIMARY KEY, changes INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS docs_added AFTER INSERT ON docs BEGIN
    INSERT INTO counts VALUES (NEW.collection, NEW.state, 1, NEW.chunks)
        ON CONFLICT (collection, state) DO UPDATE SET docs = docs + 1, chunks = chunks + excluded.chunks;
    INSERT INTO changes VALUES (NEW.collection, 1)
        ON CONFLICT (collection) DO UPDATE SET changes = changes + 1;
END;
CREATE TRIGGER IF NOT EXISTS docs_changed AFTER UPDATE ON docs BEGIN
    UPDATE counts SET docs = docs - 1, chunks = chunks - OLD.chunks
        WHERE collection = OLD.collection AND state = OLD.state;
    INSERT INTO counts VALUES (NEW.collection, NEW.state, 1, NEW.chunks)
        ON CONFLICT (collection, state) DO UPDATE SET docs = docs + 1, chunks = chunks + excluded.chunks;
    UPDATE changes SET changes = changes + 1 WHERE collection = NEW.collection;
END;
CREATE TRIGGER IF NOT EXISTS docs_removed AFTER DELETE ON docs BEGIN
    UPDATE counts SET docs = docs - 1, chunks = chunks - OLD.chunks
        WHERE collection = OLD.collection AND state = OLD.state;
    UPDATE changes SET changes = changes + 1 WHERE collection = OLD.collection;
END;
INSERT OR IGNORE INTO meta VALUES ('schema', '{SCHEMA_VERSION}');
"""
_TABLES = ("docs", "removed", "counts", "changes", "meta")
_SELECT = ", ".join(COLUMNS)
# A row is applied only if newer than the row held and than the key's last removal (its
# tombstone in ``removed``): an older entry arriving after a delete in another batch stays out.
_UPSERT = (
    f"INSERT INTO docs ({_SELECT}) SELECT {', '.join('?' for _ in COLUMNS)} "
    "WHERE NOT EXISTS (SELECT 1 FROM removed WHERE collection = ? AND key = ? AND revision >= ?) "
    "ON CONFLICT (collection, doc_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[2:])
    + " WHERE excluded.revision > docs.revision"
)
_TOMBSTONE = (
    "INSERT INTO removed VALUES (?, ?, ?) "
    "ON CONFLICT (collection, key) DO UPDATE SET revision = max(revision, excluded.revision)"
)


@dataclass(frozen=True)
class CollectionCounts:
    by_state: dict[str, int]
    # Chunks of the indexed documents.
    chunks: int


@dataclass(frozen=True, slots=True)
class Removal:
    """The status entry ``key`` was deleted or purged at stream sequence ``revision``."""

    key: str
    revision: int


Change = Row | Removal


def prefix_upper(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` (code point order, which
    is SQLite's order of UTF-8 text); None when there is none (no upper bound)."""
    chars = list(prefix)
    while chars:
        point = ord(chars.pop()) + 1
        if 0xD800 <= point <= 0xDFFF:
            point = 0xE000  # surrogates are not text
        if point <= 0x10FFFF:
            return "".join(chars) + chr(point)
    return None


class IndexLocked(RuntimeError):
    """Another process holds the index directory."""


class StatusIndex:
    """The index over one SQLite file (``directory`` None: in memory, rebuilt on every start).
    Not thread-safe: the API uses it from its event loop."""

    def __init__(self, directory: Path | None) -> None:
        self.path = directory / INDEX_FILE if directory is not None else None
        self._lock: IO[bytes] | None = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock = _lock_directory(directory)
        self.db = self._open()

    # --- opening ------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError:
            # A derived copy: one that cannot be read is rebuilt from the bucket.
            log.warning(
                "status index unreadable; rebuilding it", extra={"path": str(self.path)}, exc_info=True
            )
            self._remove_files()
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path) if self.path else ":memory:", isolation_level=None)
        try:
            return self._prepare(db)
        except BaseException:
            db.close()
            raise

    def _prepare(self, db: sqlite3.Connection) -> sqlite3.Connection:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        db.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_PAGES}")
        db.execute("PRAGMA temp_store = MEMORY")
        db.executescript(_SCHEMA)
        if _meta(db, "schema") != SCHEMA_VERSION:
            log.warning("status index of another schema; rebuilding it", extra={"path": str(self.path)})
            _drop(db)
            db.executescript(_SCHEMA)
        return db

    def _remove_files(self) -> None:
        if self.path is None:
            return
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{self.path}{suffix}").unlink()

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # --- where it stands ------------------------------------------------------------------

    @property
    def identity(self) -> str:
        return _meta(self.db, "identity") or ""

    @property
    def applied_sequence(self) -> int:
        return int(_meta(self.db, "applied") or 0)

    def reset(self, identity: str) -> None:
        """Empty the index for the bucket ``identity`` (its rows come again from sequence 1)."""
        # The change counters carry over, one step on: a reindex pass must see a rebuild as a change.
        counters = self.db.execute("SELECT collection, changes + 1 FROM changes").fetchall()
        _drop(self.db)
        self.db.executescript(_SCHEMA)
        with self._transaction():
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('identity', ?)", (identity,))
            self.db.executemany("INSERT INTO changes VALUES (?, ?)", counters)

    # --- changes ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Any:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def apply(self, changes: Sequence[Change], applied_sequence: int | None = None) -> None:
        """Apply ``changes`` in one transaction (each only if newer than what the row holds) and,
        given, record ``applied_sequence``: every entry of the bucket up to it is in."""
        rows = sorted((c.values() for c in changes if isinstance(c, Row)), key=lambda v: (v[0], v[1]))
        removals = [c for c in changes if isinstance(c, Removal)]
        with self._transaction():
            # Removals first: their tombstones keep out the older revisions of their keys,
            # whichever batch those come in.
            for removal in removals:
                collection = removal.key.split(".", 1)[0]
                self.db.execute(_TOMBSTONE, (collection, removal.key, removal.revision))
                self.db.execute(
                    "DELETE FROM docs INDEXED BY docs_by_key "
                    "WHERE collection = ? AND key = ? AND revision < ?",
                    (collection, removal.key, removal.revision),
                )
            self.db.executemany(_UPSERT, [(*v, v[0], v[2], v[3]) for v in rows])
            if applied_sequence is not None:
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('applied', ?)", (str(applied_sequence),))

    # --- counts -------------------------------------------------------------------------------

    def counts(self, collection: str) -> CollectionCounts | None:
        """The collection's documents per state and its indexed chunks; None when it has none."""
        found = self.db.execute(
            "SELECT state, docs, chunks FROM counts WHERE collection = ?", (collection,)
        ).fetchall()
        return _counts(found)

    def recount(self, collection: str) -> CollectionCounts | None:
        """``counts`` computed from the rows themselves (a check: both must always agree)."""
        found = self.db.execute(
            "SELECT state, count(*), sum(chunks) FROM docs WHERE collection = ? GROUP BY state", (collection,)
        ).fetchall()
        return _counts(found)

    def collections(self) -> list[str]:
        """The collections with at least one document entry, in name order."""
        found = self.db.execute(
            "SELECT collection FROM counts GROUP BY collection HAVING sum(docs) > 0 ORDER BY collection"
        ).fetchall()
        return [name for (name,) in found]

    def changes(self, collection: str) -> int:
        """How many row changes the collection has seen (only ever grows while the index lives)."""
        found = self.db.execute("SELECT changes FROM changes WHERE collection = ?", (collection,)).fetchone()
        return int(found[0]) if found else 0

    # --- pages ----------------------------------------------------------------------------------

    def documents(
        self, collection: str, source_prefix: str, after_doc_id: str, limit: int
    ) -> tuple[list[Row], bool]:
        """Up to ``limit`` documents of ``collection`` that are not deleted, whose source_uri
        starts with ``source_prefix``, with a doc id after ``after_doc_id``, in doc id order; and
        whether more follow. A range of the primary key: the page's cost, not the collection's."""
        where = "collection = ? AND doc_id > ? AND state != ?"
        params: list[Any] = [collection, after_doc_id, DELETED]
        if source_prefix:
            # Not a range of the source index: the primary key keeps the doc id order.
            where += " AND substr(source_uri, 1, ?) = ?"
            params += [len(source_prefix), source_prefix]
        return self._page(f"{where} ORDER BY doc_id", params, limit)

    def documents_by_source(
        self, collection: str, source_prefix: str, after_source_uri: str, after_doc_id: str, limit: int
    ) -> tuple[list[Row], bool]:
        """As ``documents``, in (source_uri, doc id) order after (``after_source_uri``,
        ``after_doc_id``): a range of the source index, so a folder's page costs its size
        whatever else the collection holds."""
        # The cursor starts at the folder at least: SQLite takes it as the start of the range, and
        # one before the folder would walk every source that sorts ahead of it.
        after_source_uri, after_doc_id = max((after_source_uri, after_doc_id), (source_prefix, ""))
        where = "collection = ? AND (source_uri, doc_id) > (?, ?) AND state != ?"
        params: list[Any] = [collection, after_source_uri, after_doc_id, DELETED]
        upper = prefix_upper(source_prefix) if source_prefix else None
        if upper is not None:
            where += " AND source_uri < ?"
            params.append(upper)
        return self._page(f"{where} ORDER BY source_uri, doc_id", params, limit)

    def rows_after(self, collection: str, after_doc_id: str, limit: int) -> list[Row]:
        """Up to ``limit`` rows of ``collection`` (every state) after ``after_doc_id``, in doc id order."""
        return self._page("collection = ? AND doc_id > ? ORDER BY doc_id", [collection, after_doc_id], limit)[
            0
        ]

    def _page(self, where: str, params: list[Any], limit: int) -> tuple[list[Row], bool]:
        found = self.db.execute(
            f"SELECT {_SELECT} FROM docs WHERE {where} LIMIT ?", (*params, limit + 1)
        ).fetchall()
        return [Row(*values) for values in found[:limit]], len(found) > limit


def _counts(found: list[tuple[str, int, int]]) -> CollectionCounts | None:
    if sum(docs for _state, docs, _chunks in found) <= 0:
        return None
    docs = {state: int(n) for state, n, _chunks in found}
    chunks = next((int(c or 0) for state, _n, c in found if state == INDEXED), 0)
    return CollectionCounts({state: docs.get(state, 0) for state in STATES}, chunks)


def _meta(db: sqlite3.Connection, name: str) -> str | None:
    found = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
    return str(found[0]) if found else None


def _drop(db: sqlite3.Connection) -> None:
    for table in _TABLES:
        db.execute(f"DROP TABLE IF EXISTS {table}")


def _lock_directory(directory: Path) -> IO[bytes]:
    """Hold the directory for this process: two APIs feeding one index would each record their
    own progress in it."""
    handle = (directory / LOCK_FILE).open("ab")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise IndexLocked(
            f"another ingestion API uses the status index in {directory}; give each API process its "
            "own RAGMESH_INGEST_INDEX_DIR"
        ) from None
    return handle
