"""One collection of the sparse service: a tantivy index (BM25 over title and body, plus a
lower-cased unstemmed copy for exact phrases), the chunk text files that ripgrep scans, and the
replication state (fences, log position) and each document's source URI and metadata (indexed for
metadata filters, meshkit.metadata) in SQLite.

Layout under ``<data_dir>/<collection>/``: ``index/`` holds tantivy's files, ``chunks/<2 hex>/
<chunk_id>.txt`` the text, ``state.sqlite`` the fences and log position. tantivy's commit is the
point of truth: files are written before it and removed after it, so a crash can only leave
extra files, which readers drop by checking the chunk ids against the committed index. The
state is written right after the commit: a crash in between leaves it one entry behind, and
that entry is applied again on restart, which changes nothing (a replacement sets a document's
chunks; applying it twice in a row gives the same state).

Fences: as in the index (services/index/store.py): a replacement with a lower fence than the
document's is refused and changes nothing, an equal one is applied again, 0 is unfenced.

Everything here is blocking; the servicer calls it from threads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tantivy
from tantivy import Occur, Query

from meshkit.answering import content_word_list
from meshkit.metadata import Clause, MetadataIndex

log = logging.getLogger(__name__)

EXACT_TOKENIZER = "ragmesh_exact"
STATE_FILE = "state.sqlite"
# Tokens longer than this are dropped by the exact analyzer; long identifiers (hashes, paths)
# are exactly what the exact leg exists for, so the limit is far above en_stem's 40.
_EXACT_MAX_TOKEN_CHARS = 255
_WHITESPACE_RE = re.compile(r"\s+")


def _build_schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    # raw: ids are matched whole, never split on '-' or '.'; basic: no positions needed.
    sb.add_text_field("chunk_id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("doc_id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("title", stored=True, tokenizer_name="en_stem")
    sb.add_text_field("body", stored=True, tokenizer_name="en_stem")
    # Not stored (title/body already are): the exact leg's phrase mode searches it.
    sb.add_text_field("exact", stored=False, tokenizer_name=EXACT_TOKENIZER)
    sb.add_bytes_field("location", stored=True, indexed=False)
    return sb.build()


SCHEMA = _build_schema()


def _bm25_analyzer() -> tantivy.TextAnalyzer:
    # Same pipeline as tantivy's built-in en_stem, so query terms equal indexed terms.
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def exact_analyzer() -> tantivy.TextAnalyzer:
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(_EXACT_MAX_TOKEN_CHARS))
        .filter(tantivy.Filter.lowercase())
        .build()
    )


_BM25_ANALYZER = _bm25_analyzer()
_EXACT_ANALYZER = exact_analyzer()


def query_terms(query: str) -> list[str]:
    """The distinct stemmed terms of a free-text query. Building the query from terms (instead
    of tantivy's query parser) means no user input can be a syntax error."""
    return list(dict.fromkeys(_BM25_ANALYZER.analyze(query)))


def exact_tokens(text: str) -> list[str]:
    return list(_EXACT_ANALYZER.analyze(text))


def one_line(text: str) -> str:
    """Whitespace runs to one space: keywords and file lines compare the same way, and a phrase
    broken across lines in the source still matches."""
    return _WHITESPACE_RE.sub(" ", text).strip()


@dataclass(frozen=True)
class ChunkRecord:
    chunk_id: str
    doc_id: str
    title: str
    text: str
    # Serialised ragmesh.common.v1.ChunkLocation: kept opaque so this layer needs no protos.
    location: bytes = b""


@dataclass(frozen=True)
class DocumentSourceInfo:
    source_uri: str = ""
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class DocumentUpdate:
    doc_id: str
    upserts: Sequence[ChunkRecord]
    keep_chunk_ids: Sequence[str]
    # The writer's fencing token (0: unfenced).
    fence: int = 0
    # The document's source URI and metadata (None: keep what is stored).
    source: DocumentSourceInfo | None = None


@dataclass(frozen=True)
class ReplaceResult:
    upserted: int
    removed: int
    missing_chunk_ids: list[str]
    stale_doc_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DocumentEntry:
    doc_id: str
    fence: int
    chunk_ids: list[str]


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
        self.metadata = MetadataIndex()
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
            universe = set(doc_ids) if doc_ids else self.sources.keys()
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


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    doc_id: str
    score: float
    matched_keywords: tuple[str, ...] = field(default=())


class ChunkFiles:
    """Chunk text as ``<dir>/<2 hex>/<chunk_id>.txt``: line 1 the title, line 2 the body."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, chunk_id: str) -> Path:
        return self.root / chunk_id[:2] / f"{chunk_id}.txt"

    @staticmethod
    def render(record: ChunkRecord) -> str:
        # NUL would make ripgrep treat the file as binary and skip it.
        return f"{one_line(record.title)}\n{one_line(record.text)}\n".replace("\x00", " ")

    def write(self, records: Iterable[ChunkRecord]) -> None:
        for record in records:
            target = self.path(record.chunk_id)
            target.parent.mkdir(parents=True, exist_ok=True)
            # Dot-prefixed: ripgrep skips hidden files, so a half-written tmp is never scanned.
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(self.render(record), encoding="utf-8")
            os.replace(tmp, target)

    def remove(self, chunk_ids: Iterable[str]) -> None:
        for chunk_id in chunk_ids:
            with contextlib.suppress(FileNotFoundError):
                self.path(chunk_id).unlink()

    def chunk_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return [p.stem for p in self.root.glob("*/*.txt")]


def _first(doc: tantivy.Document, name: str) -> Any:
    return doc.get_first(name)


def _to_record(doc: tantivy.Document) -> ChunkRecord:
    location = _first(doc, "location")
    return ChunkRecord(
        chunk_id=_first(doc, "chunk_id"),
        doc_id=_first(doc, "doc_id"),
        title=_first(doc, "title") or "",
        text=_first(doc, "body") or "",
        location=bytes(location) if location is not None else b"",
    )


def _to_document(record: ChunkRecord) -> tantivy.Document:
    doc = tantivy.Document()
    doc.add_text("chunk_id", record.chunk_id)
    doc.add_text("doc_id", record.doc_id)
    doc.add_text("title", record.title)
    doc.add_text("body", record.text)
    # Two values, as the ripgrep file has two lines; the phrase counter treats them apart too.
    doc.add_text("exact", record.title)
    doc.add_text("exact", record.text)
    doc.add_bytes("location", record.location)
    return doc


class DeadlinePassed(Exception):
    """The caller's deadline passed while the exact leg was still working."""


def check_deadline(deadline: float | None) -> None:
    """Raise DeadlinePassed once ``deadline`` (time.monotonic) has passed: the exact leg runs
    in a thread, which cannot be cancelled, so its loops check this instead."""
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlinePassed("the exact search ran out of time (the caller's deadline)")


def _doc_freq(searcher: tantivy.Searcher, term: str) -> int:
    """Chunks whose body or title holds ``term`` (an analysed term), counted per field."""
    return int(searcher.doc_freq("body", term)) + int(searcher.doc_freq("title", term))


def _all_matching(searcher: tantivy.Searcher, query: Query) -> list[tuple[float, tantivy.DocAddress]]:
    # Count first: a top-k collector sized to the whole index would allocate for every doc.
    # The stubs of tantivy 0.27 omit SearchResult.count, which the runtime has.
    total = searcher.search(query, limit=1, count=True).count or 0  # type: ignore[attr-defined]
    if total == 0:
        return []
    return list(searcher.search(query, limit=total, count=False).hits)


def _with_doc_filter(query: Query, doc_ids: Sequence[str]) -> Query:
    if not doc_ids:
        return query
    # Score 0: the filter selects, it must not change the ranking.
    doc_filter = Query.const_score_query(Query.term_set_query(SCHEMA, "doc_id", list(doc_ids)), 0.0)
    return Query.boolean_query([(Occur.Must, query), (Occur.Must, doc_filter)])


class Collection:
    """One collection's index and files. Writes are serialised by a lock (tantivy allows one
    writer per index); searches run concurrently on searcher snapshots."""

    def __init__(self, root: Path, name: str, heap_bytes: int, title_boost: float) -> None:
        self.name = name
        self.dir = root / name
        self.index_dir = self.dir / "index"
        self.index_dir.mkdir(parents=True, exist_ok=True)
        self.files = ChunkFiles(self.dir / "chunks")
        self.files.root.mkdir(exist_ok=True)
        self._heap_bytes = heap_bytes
        self._title_boost = title_boost
        self._index = tantivy.Index(SCHEMA, path=str(self.index_dir), reuse=True)
        self._index.register_tokenizer(EXACT_TOKENIZER, exact_analyzer())
        self._writer: tantivy.IndexWriter | None = None
        self._write_lock = threading.Lock()
        self.state = CollectionState(self.dir / STATE_FILE)

    @staticmethod
    def exists(root: Path, name: str) -> bool:
        return (root / name / "index" / "meta.json").is_file()

    @classmethod
    def open(cls, root: Path, name: str, heap_bytes: int, title_boost: float) -> Collection:
        """Open (or create) a collection and drop the chunk files a crash left behind."""
        collection = cls(root, name, heap_bytes, title_boost)
        orphans = collection.sweep_orphan_files()
        if orphans:
            log.info("removed orphan chunk files", extra={"collection": name, "files": orphans})
        return collection

    @property
    def log_position(self) -> int:
        return self.state.log_pos

    @property
    def snapshot_log_id(self) -> str:
        return self.state.log_id

    @property
    def recovered_cleanly(self) -> bool:
        return True  # tantivy opens at its last commit; the state is never ahead of it

    def restart_log(self) -> None:
        with self._write_lock:
            self.state.set_log("", 0)

    # --- writes ---

    def replace_documents(self, documents: Sequence[DocumentUpdate], pos: int = 0) -> ReplaceResult:
        """Set each document's chunks to its kept + upserted ones, in one commit (documents
        whose fence is lower than theirs are left as they are and reported stale). ``pos``:
        the log position of the entry being applied (0: not from a log)."""
        with self._write_lock:
            stored = self.state.fences
            stale = [d.doc_id for d in documents if 0 < d.fence < stored.get(d.doc_id, 0)]
            documents = [d for d in documents if not 0 < d.fence < stored.get(d.doc_id, 0)]
            if not documents:
                return ReplaceResult(0, 0, [], stale)
            fences = {d.doc_id: d.fence for d in documents if d.fence > stored.get(d.doc_id, 0)}
            searcher = self._index.searcher()
            existing = self._chunks_of_documents(searcher, [d.doc_id for d in documents])
            upserts = [c for d in documents for c in d.upserts]
            upsert_ids = {c.chunk_id for c in upserts}
            kept = {cid for d in documents for cid in d.keep_chunk_ids}
            missing = [
                cid
                for d in documents
                for cid in d.keep_chunk_ids
                if existing.get(cid) != d.doc_id and cid not in upsert_ids
            ]
            removed = [cid for cid in existing if cid not in kept and cid not in upsert_ids]
            sources, emptied = self._source_changes(documents, existing, missing)
            already_live = set(self._live(searcher, upsert_ids))
            self.files.write(upserts)
            try:
                self._commit(deletes=[*removed, *upsert_ids], adds=upserts)
            except BaseException:
                self.files.remove(upsert_ids - already_live)
                raise
            self.files.remove(removed)
            self.state.record(fences, pos, sources, emptied)
            return ReplaceResult(len(upserts), len(removed), list(dict.fromkeys(missing)), stale)

    @staticmethod
    def _source_changes(
        documents: Sequence[DocumentUpdate], existing: dict[str, str], missing: list[str]
    ) -> tuple[dict[str, DocumentSourceInfo], list[str]]:
        """The sources the replacement sets, and the documents it leaves without chunks (whose
        sources go with them)."""
        absent = set(missing)
        sources: dict[str, DocumentSourceInfo] = {}
        emptied: list[str] = []
        for doc in documents:
            kept = [c for c in doc.keep_chunk_ids if existing.get(c) == doc.doc_id and c not in absent]
            if not doc.upserts and not kept:
                emptied.append(doc.doc_id)
            elif doc.source is not None:
                sources[doc.doc_id] = doc.source
        return sources, emptied

    def delete(self, chunk_ids: Sequence[str], doc_ids: Sequence[str], pos: int = 0) -> int:
        """Remove chunks by id and whole documents (their fences stay: tombstones)."""
        with self._write_lock:
            searcher = self._index.searcher()
            doomed = set(self._live(searcher, chunk_ids))
            doomed.update(self._chunks_of_documents(searcher, doc_ids))
            if not doomed:
                return 0
            self._commit(deletes=sorted(doomed), adds=[])
            self.files.remove(doomed)
            self.state.record({}, pos, dropped=doc_ids)
            return len(doomed)

    def _commit(self, deletes: Iterable[str], adds: Sequence[ChunkRecord]) -> None:
        writer = self._writer_or_open()
        try:
            for chunk_id in deletes:
                writer.delete_documents_by_term("chunk_id", chunk_id)
            for record in adds:
                writer.add_document(_to_document(record))
            writer.commit()
        except BaseException:
            self._discard_pending(writer)
            raise
        self._index.reload()

    def _discard_pending(self, writer: tantivy.IndexWriter) -> None:
        # Nothing uncommitted may ride along with the next call's commit.
        try:
            writer.rollback()
        except Exception:
            log.exception("rollback failed; reopening the writer", extra={"collection": self.name})
            self._writer = None

    def _writer_or_open(self) -> tantivy.IndexWriter:
        if self._writer is None:
            # One indexing thread: writes are per-RPC batches, and each thread costs heap.
            self._writer = self._index.writer(heap_size=self._heap_bytes, num_threads=1)
        return self._writer

    def sweep_orphan_files(self) -> int:
        """Remove chunk files a crash left behind (written, then never committed or deleted)."""
        with self._write_lock:
            on_disk = self.files.chunk_ids()
            live = set(self._live(self._index.searcher(), on_disk))
            orphans = [cid for cid in on_disk if cid not in live]
            self.files.remove(orphans)
            return len(orphans)

    def close(self) -> None:
        with self._write_lock:
            self._writer = None
            self.state.close()

    # --- snapshots ---

    def copy_for_snapshot(self, dest: Path, log_position: Callable[[], int], log_id: str) -> int:
        """A consistent copy of the collection in ``dest`` (``index/`` and ``state.sqlite``),
        taken while writes wait: background merges are finished first so the files stand
        still, and tantivy's files are hard-linked (it never rewrites a file in place).
        ``log_position()`` says how far the store has applied the log; returns the position
        the copy covers. Chunk files are not copied: a restore writes them from the index."""
        with self._write_lock:
            if self._writer is not None:
                writer, self._writer = self._writer, None
                writer.wait_merging_threads()
            (dest / "index").mkdir(parents=True)
            for path in self.index_dir.iterdir():
                if path.is_file() and not path.name.endswith(".lock"):
                    os.link(path, dest / "index" / path.name)
            self.state.backup_to(dest / STATE_FILE)
            covered = max(self.state.log_pos, log_position())
        copy = CollectionState(dest / STATE_FILE)
        try:
            copy.set_log(log_id, covered)
        finally:
            copy.close()
        return covered

    def write_chunk_files(self) -> int:
        """Write the chunk file of every committed chunk (after a restore: files are not in
        snapshots, the index holds their text)."""
        with self._write_lock:
            searcher = self._index.searcher()
            total = int(searcher.num_docs)
            if not total:
                return 0
            hits = searcher.search(Query.all_query(), limit=total, count=False).hits
            self.files.write(_to_record(searcher.doc(address)) for _score, address in hits)
            return total

    # --- reads ---

    def search_bm25(self, query: str, top_k: int, doc_ids: Sequence[str]) -> list[Hit]:
        terms = query_terms(query)
        if not terms:
            return []
        clauses: list[tuple[Occur, Query]] = []
        for term in terms:
            title = Query.term_query(SCHEMA, "title", term)
            clauses.append((Occur.Should, Query.boost_query(title, self._title_boost)))
            clauses.append((Occur.Should, Query.term_query(SCHEMA, "body", term)))
        query_ = _with_doc_filter(Query.boolean_query(clauses), doc_ids)
        searcher = self._index.searcher()
        result = searcher.search(query_, limit=top_k, count=False)
        hits = []
        for score, address in result.hits:
            doc = searcher.doc(address)
            hits.append(Hit(_first(doc, "chunk_id"), _first(doc, "doc_id"), float(score)))
        return hits

    def unknown_words(self, query: str, limit: int) -> list[str]:
        """The query's content words (numbers aside) that no chunk's body or title holds, in
        query order, at most ``limit``. A word is unknown when one of its stems is: "x-ray" needs
        both "x" and "ray". Document frequencies count chunks deleted since the last merge,
        which errs towards known."""
        searcher = self._index.searcher()
        unknown: list[str] = []
        for word in content_word_list(query):
            if len(unknown) == limit:
                break
            if word.isdigit():
                continue
            stems = [t for t in query_terms(word) if not t.isdigit()]
            if any(_doc_freq(searcher, stem) == 0 for stem in stems):
                unknown.append(word)
        return unknown

    def phrase_candidates(
        self,
        keywords: Sequence[str],
        top_k: int,
        doc_ids: Sequence[str],
        *,
        max_candidates: int,
        deadline: float | None = None,
    ) -> list[ChunkRecord]:
        """Chunks that may rank in the top ``top_k`` for the exact phrase leg, at most
        ``max(top_k, max_candidates)`` of them; DeadlinePassed once ``deadline`` has passed.

        Each keyword is a constant-score clause, so tantivy's score is the number of distinct
        keywords matched; only chunks tied with or above the k-th need their occurrences counted.
        tantivy's collector keeps the best-scored ones, so the bound never drops a chunk with
        more distinct keywords than one it keeps: past it (a stopword matching everything), the
        occurrence tiebreak among the chunks tied at the cut covers the first ones in index
        order only.
        """
        clauses: list[tuple[Occur, Query]] = []
        for keyword in keywords:
            tokens = exact_tokens(keyword)
            if not tokens:
                continue  # nothing indexable, e.g. "++": cannot match in this mode
            if len(tokens) == 1:
                match = Query.term_query(SCHEMA, "exact", tokens[0])
            else:
                words: list[str | tuple[int, str]] = list(tokens)
                match = Query.phrase_query(SCHEMA, "exact", words)
            clauses.append((Occur.Should, Query.const_score_query(match, 1.0)))
        if not clauses:
            return []
        check_deadline(deadline)
        searcher = self._index.searcher()
        query = _with_doc_filter(Query.boolean_query(clauses), doc_ids)
        hits = searcher.search(query, limit=max(top_k, max_candidates), count=False).hits
        hits.sort(key=lambda h: -h[0])
        if len(hits) > top_k:
            threshold = hits[top_k - 1][0]
            hits = [h for h in hits if h[0] >= threshold]
        records = []
        for _score, address in hits:
            check_deadline(deadline)
            records.append(_to_record(searcher.doc(address)))
        return records

    def live_documents(self, chunk_ids: Iterable[str], doc_ids: Sequence[str]) -> dict[str, str]:
        """chunk_id -> doc_id for the ids that are committed (and in ``doc_ids`` when given)."""
        live = self._live(self._index.searcher(), chunk_ids)
        if not doc_ids:
            return live
        allowed = set(doc_ids)
        return {cid: did for cid, did in live.items() if did in allowed}

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[ChunkRecord]:
        ids = list(dict.fromkeys(chunk_ids))
        if not ids:
            return []
        searcher = self._index.searcher()
        query = Query.term_set_query(SCHEMA, "chunk_id", ids)
        found = {
            r.chunk_id: r
            for r in (_to_record(searcher.doc(a)) for _s, a in searcher.search(query, limit=len(ids)).hits)
        }
        return [found[cid] for cid in ids if cid in found]

    def list_documents(self, after: str, limit: int) -> list[DocumentEntry]:
        """Documents in doc_id order after ``after``: those with chunks and tombstones (fenced
        documents whose chunks are gone), each with its fence and sorted chunk ids."""
        searcher = self._index.searcher()
        with_chunks = {
            str(term)
            for term, count in searcher.terms_with_prefix("doc_id", "", filter_query=Query.all_query())
            if count > 0
        }
        fences = dict(self.state.fences)
        names = sorted(d for d in with_chunks | set(fences) if d > after)[:limit]
        chunks: dict[str, list[str]] = {}
        for chunk_id, doc_id in self._chunks_of_documents(
            searcher, [d for d in names if d in with_chunks]
        ).items():
            chunks.setdefault(doc_id, []).append(chunk_id)
        return [DocumentEntry(d, fences.get(d, 0), sorted(chunks.get(d, []))) for d in names]

    def stats(self) -> tuple[int, int]:
        """(chunks, distinct documents) of the committed index."""
        searcher = self._index.searcher()
        # filter_query counts live docs only: the term dictionary still holds deleted docs' ids.
        documents = searcher.terms_with_prefix("doc_id", "", filter_query=Query.all_query())
        return int(searcher.num_docs), sum(1 for _term, count in documents if count > 0)

    def _live(self, searcher: tantivy.Searcher, chunk_ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(chunk_ids))
        if not ids:
            return {}
        query = Query.term_set_query(SCHEMA, "chunk_id", ids)
        result: dict[str, str] = {}
        for _score, address in searcher.search(query, limit=len(ids), count=False).hits:
            doc = searcher.doc(address)
            result[_first(doc, "chunk_id")] = _first(doc, "doc_id")
        return result

    def _chunks_of_documents(self, searcher: tantivy.Searcher, doc_ids: Sequence[str]) -> dict[str, str]:
        if not doc_ids:
            return {}
        query = Query.term_set_query(SCHEMA, "doc_id", list(doc_ids))
        result: dict[str, str] = {}
        for _score, address in _all_matching(searcher, query):
            doc = searcher.doc(address)
            result[_first(doc, "chunk_id")] = _first(doc, "doc_id")
        return result
