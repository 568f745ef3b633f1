"""One collection of the sparse service: a tantivy index (BM25 over title and body, plus a
lower-cased unstemmed copy for exact phrases), in ripgrep mode the chunk text files that ripgrep
scans, and the replication state (fences, log position) and each document's source URI and
metadata (indexed for metadata filters, meshkit.domain.metadata) in SQLite.

Layout under ``<data_dir>/<collection>/``: ``index/`` holds tantivy's files (the chunk text is a
stored field), ``chunks/<2 hex>/<chunk_id>.txt`` the text for ripgrep (that mode only; rebuilt
from the index when ``chunks/.complete`` is missing), ``state.sqlite`` the fences and log
position. tantivy's commit is the
point of truth: files are written before it and removed after it, so a crash can only leave
extra files, which readers drop by checking the chunk ids against the committed index. The
state is written right after the commit: a crash in between leaves it one entry behind, and
that entry is applied again on restart, which changes nothing (a replacement sets a document's
chunks; applying it twice in a row gives the same state).

Fences: as in the index (services/index/store.py): a replacement with a lower fence than the
document's is refused and changes nothing, an equal one is applied again, 0 is unfenced.

Everything here is blocking; the servicer calls it from threads.

Beside it: records.py (the values it takes and gives back), schema.py (tantivy schema, analyzers,
records to documents), state.py (the SQLite state), chunk_files.py (the files ripgrep scans),
deadlines.py (the caller's deadline in the exact leg).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import tantivy
from tantivy import Occur, Query

from meshkit.replication.records import DocumentEntry, ReplaceResult
from meshkit.text.answering import content_word_list
from services.sparse.chunk_files import ChunkFiles, NoChunkFiles
from services.sparse.deadlines import check_deadline
from services.sparse.records import (
    ChunkRecord,
    DocumentSourceInfo,
    DocumentUpdate,
    Hit,
)
from services.sparse.salient import salient_terms
from services.sparse.schema import (
    EXACT_TOKENIZER,
    SCHEMA,
    exact_analyzer,
    exact_tokens,
    query_terms,
    stored_value,
    to_document,
    to_record,
)
from services.sparse.state import STATE_FILE, CollectionState

log = logging.getLogger(__name__)


def _doc_freq(searcher: tantivy.Searcher, term: str) -> int:
    """Chunks whose body or title holds ``term`` (an analysed term), counted per field."""
    return int(searcher.doc_freq("body", term)) + int(searcher.doc_freq("title", term))


def _stems(word: str) -> list[str]:
    """A query word's analysed terms, numbers aside ("x-ray": "x", "ray")."""
    return [t for t in query_terms(word) if not t.isdigit()]


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

    def __init__(
        self, root: Path, name: str, heap_bytes: int, title_boost: float, chunk_files: bool = True
    ) -> None:
        self.name = name
        self.dir = root / name
        self.index_dir = self.dir / "index"
        self.index_dir.mkdir(parents=True, exist_ok=True)
        files_dir = self.dir / "chunks"
        self.files = ChunkFiles(files_dir) if chunk_files else NoChunkFiles(files_dir)
        if chunk_files:
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
    def open(
        cls, root: Path, name: str, heap_bytes: int, title_boost: float, chunk_files: bool = True
    ) -> Collection:
        """Open (or create) a collection. With ``chunk_files`` (ripgrep mode): write the files a
        restored or phrase-mode collection lacks, and drop those a crash left behind; without:
        remove the files an earlier ripgrep mode left."""
        collection = cls(root, name, heap_bytes, title_boost, chunk_files)
        if not chunk_files:
            if (collection.dir / "chunks").exists():
                shutil.rmtree(collection.dir / "chunks")
                log.info("removed the chunk files of the ripgrep mode", extra={"collection": name})
            return collection
        if not collection.files.complete_marker.exists():
            written = collection.write_chunk_files()
            log.info("chunk files written from the index", extra={"collection": name, "files": written})
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
                writer.add_document(to_document(record))
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
        snapshots, the index holds their text), then mark the files complete."""
        with self._write_lock:
            searcher = self._index.searcher()
            total = int(searcher.num_docs)
            if total:
                hits = searcher.search(Query.all_query(), limit=total, count=False).hits
                self.files.write(to_record(searcher.doc(address)) for _score, address in hits)
            self.files.root.mkdir(parents=True, exist_ok=True)
            self.files.complete_marker.touch()
            return total

    # --- reads ---

    def search_bm25(
        self, query: str, top_k: int, doc_ids: Sequence[str], max_terms: int | None = None
    ) -> list[Hit]:
        """The ``top_k`` best chunks for ``query``'s analysed terms (no query parser: no input
        is a syntax error). With ``max_terms``, a query of more distinct terms searches its most
        salient ones only (salient.py: the rarest in this collection)."""
        terms = query_terms(query)
        if not terms:
            return []
        searcher = self._index.searcher()
        if max_terms is not None and len(terms) > max_terms:
            terms = salient_terms(terms, max_terms, lambda term: _doc_freq(searcher, term))
        clauses: list[tuple[Occur, Query]] = []
        for term in terms:
            title = Query.term_query(SCHEMA, "title", term)
            clauses.append((Occur.Should, Query.boost_query(title, self._title_boost)))
            clauses.append((Occur.Should, Query.term_query(SCHEMA, "body", term)))
        query_ = _with_doc_filter(Query.boolean_query(clauses), doc_ids)
        result = searcher.search(query_, limit=top_k, count=False)
        hits = []
        for score, address in result.hits:
            doc = searcher.doc(address)
            hits.append(Hit(stored_value(doc, "chunk_id"), stored_value(doc, "doc_id"), float(score)))
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
            if any(_doc_freq(searcher, stem) == 0 for stem in _stems(word)):
                unknown.append(word)
        return unknown

    def novel_words(self, words: Sequence[str]) -> list[str]:
        """Those of ``words`` (unknown words, see unknown_words) that no indexed term is within
        one edit of: one of their stems has no neighbour in any chunk's body or title. A
        misspelling of a word the collection holds has one; a subject it never mentions has
        none. tantivy walks its term dictionary with a Levenshtein automaton: no scan."""
        searcher = self._index.searcher()
        return [word for word in words if any(self._no_neighbour(searcher, stem) for stem in _stems(word))]

    @staticmethod
    def _no_neighbour(searcher: tantivy.Searcher, stem: str) -> bool:
        # A stem of one or two letters is one edit from dozens of terms (and its automaton
        # would walk all their postings): counted as having a neighbour, never looked up.
        if len(stem) <= 2 or _doc_freq(searcher, stem):
            return False
        for field in ("body", "title"):
            near = Query.fuzzy_term_query(SCHEMA, field, stem, distance=1, transposition_cost_one=True)
            if searcher.search(near, limit=1, count=False).hits:
                return False
        return True

    def phrase_candidates(
        self,
        keywords: Sequence[str],
        top_k: int,
        doc_ids: Sequence[str],
        *,
        max_candidates: int,
        max_tied: int | None = None,
        deadline: float | None = None,
    ) -> list[ChunkRecord]:
        """Chunks that may rank in the top ``top_k`` for the exact phrase leg, at most
        ``max(top_k, max_candidates)`` of them; DeadlinePassed once ``deadline`` has passed.

        Each keyword is a constant-score clause, so tantivy's score is the number of distinct
        keywords matched; only chunks tied with or above the k-th need their occurrences counted.
        tantivy's collector keeps the best-scored ones, so the bound never drops a chunk with
        more distinct keywords than one it keeps: past it (a stopword matching everything), the
        occurrence tiebreak among the chunks tied at the cut covers the first ones in index
        order only. ``max_tied`` bounds those further: every chunk above the cut is read, and of
        the ones tied at it, as many as fill ``top_k`` or ``max_tied``, whichever is more.
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
            above = [h for h in hits if h[0] > threshold]
            tied = [h for h in hits if h[0] == threshold]
            if max_tied is not None:
                tied = tied[: max(top_k - len(above), max_tied)]
            hits = above + tied
        records = []
        for _score, address in hits:
            check_deadline(deadline)
            records.append(to_record(searcher.doc(address)))
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
            for r in (to_record(searcher.doc(a)) for _s, a in searcher.search(query, limit=len(ids)).hits)
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
            result[stored_value(doc, "chunk_id")] = stored_value(doc, "doc_id")
        return result

    def _chunks_of_documents(self, searcher: tantivy.Searcher, doc_ids: Sequence[str]) -> dict[str, str]:
        if not doc_ids:
            return {}
        query = Query.term_set_query(SCHEMA, "doc_id", list(doc_ids))
        result: dict[str, str] = {}
        for _score, address in _all_matching(searcher, query):
            doc = searcher.doc(address)
            result[stored_value(doc, "chunk_id")] = stored_value(doc, "doc_id")
        return result
