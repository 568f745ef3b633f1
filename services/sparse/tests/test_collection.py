from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import tantivy

from services.sparse.chunk_files import ChunkFiles
from services.sparse.collection import Collection
from services.sparse.records import DocumentUpdate
from services.sparse.schema import SCHEMA

from .conftest import COLLECTION, chunk, open_collection, put

DOGS = chunk("animals/dogs", "Dogs are loyal companions. A dog runs fast and barks at strangers.", "Dogs")
CATS = chunk("animals/cats", "Cats sleep most of the day and hunt mice at night.", "Cats")
TAXES = chunk("finance/taxes", "Income taxes are due in April; file the return early.", "Taxes")


def committed_chunk_ids(root: Path) -> set[str]:
    """What a brand-new reader sees on disk: only committed state."""
    index = tantivy.Index(SCHEMA, path=str(root / COLLECTION / "index"), reuse=True)
    searcher = index.searcher()
    hits = searcher.search(tantivy.Query.all_query(), limit=1000).hits
    return {searcher.doc(a).get_first("chunk_id") for _s, a in hits}


def seeded(collection: Collection) -> Collection:
    for c in (DOGS, CATS, TAXES):
        put(collection, c.doc_id, c)
    return collection


def test_bm25_ranks_the_relevant_chunk_first(collection: Collection) -> None:
    hits = seeded(collection).search_bm25("when are income taxes due", 3, [])
    assert hits[0].chunk_id == TAXES.chunk_id
    assert hits[0].doc_id == "finance/taxes"
    assert hits[0].score > 0


def test_bm25_stems_query_and_text(collection: Collection) -> None:
    hits = seeded(collection).search_bm25("running", 3, [])
    assert [h.chunk_id for h in hits] == [DOGS.chunk_id]  # "runs" in the text


def test_bm25_query_syntax_is_never_an_error(collection: Collection) -> None:
    seeded(collection)
    for query in ['what\'s "C++" (x) AND: -y', "title:dogs^2 OR [a TO z]", '"unclosed', "*?~", "-", "(("]:
        collection.search_bm25(query, 5, [])
    assert collection.search_bm25("???", 5, []) == []  # nothing indexable: no hits, no error
    assert collection.search_bm25("dogs: (AND)", 5, [])[0].chunk_id == DOGS.chunk_id


def test_bm25_doc_filter(collection: Collection) -> None:
    seeded(collection)
    hits = collection.search_bm25("dogs cats taxes", 10, ["animals/cats", "finance/taxes"])
    assert {h.doc_id for h in hits} == {"animals/cats", "finance/taxes"}
    assert collection.search_bm25("dogs", 10, ["animals/cats"]) == []  # filter never adds non-matches


def test_unknown_words_are_the_query_words_no_chunk_holds(collection: Collection) -> None:
    seeded(collection)
    # Stemmed like the index ("running" is known from "runs"), title words count, stopwords and
    # numbers are never unknown, each word once, in query order.
    assert collection.unknown_words("How do running dogs and Cats bark in 2024?", 10) == []
    assert collection.unknown_words("Do zebras run as fast as QUIC zebras, in x-ray 7?", 10) == [
        "zebras",
        "quic",
        "x-ray",
    ]
    assert collection.unknown_words("zebras quic taxes", 1) == ["zebras"]
    assert collection.unknown_words("???", 10) == []


def test_novel_words_are_the_unknown_words_no_indexed_word_is_one_edit_from(collection: Collection) -> None:
    seeded(collection)
    # "strnagers" (a transposition), "barkz" (a substitution) and "companons" (a deletion)
    # misspell words the chunks hold; "zebras" and "kafka" are nothing like any of them.
    query = "Do zebras bark at strnagers, barkz, companons or kafka?"
    unknown = collection.unknown_words(query, 10)
    assert unknown == ["zebras", "strnagers", "barkz", "companons", "kafka"]
    assert collection.novel_words(unknown) == ["zebras", "kafka"]
    # Known words are never novel, and a word is novel when any of its stems is.
    assert collection.novel_words(["dogs", "zebra-dog", "dog-kafka"]) == ["zebra-dog", "dog-kafka"]
    # Two letters are one edit from too much to say: never novel.
    assert collection.novel_words(["qx", "zebra"]) == ["zebra"]


def test_replace_keeps_removes_and_reports_missing(tmp_path: Path, collection: Collection) -> None:
    first = chunk("guide", "Install the package with pip.", "Guide")
    second = chunk("guide", "Configure the port in settings.", "Guide")
    put(collection, "guide", first, second)
    third = chunk("guide", "Restart the service after upgrading.", "Guide")
    ghost = "f" * 32
    result = collection.replace_documents([DocumentUpdate("guide", [third], [first.chunk_id, ghost])])
    assert (result.upserted, result.removed, result.missing_chunk_ids) == (1, 1, [ghost])
    assert committed_chunk_ids(tmp_path) == {first.chunk_id, third.chunk_id}
    assert {c.chunk_id for c in collection.get_chunks([first.chunk_id, second.chunk_id, third.chunk_id])} == {
        first.chunk_id,
        third.chunk_id,
    }
    assert not collection.files.path(second.chunk_id).exists()
    assert collection.stats() == (2, 1)


def test_upsert_overwrites_the_same_chunk_id(collection: Collection) -> None:
    original = chunk("doc", "old words here", "Old")
    put(collection, "doc", original)
    changed = original.__class__(original.chunk_id, "doc", "New", "fresh words here", b"\x08\x03")
    put(collection, "doc", changed)
    [stored] = collection.get_chunks([original.chunk_id])
    assert (stored.title, stored.text, stored.location) == ("New", "fresh words here", b"\x08\x03")
    assert collection.stats() == (1, 1)
    assert collection.search_bm25("old", 5, []) == []


def test_delete_by_doc_and_chunk(collection: Collection) -> None:
    seeded(collection)
    assert collection.delete([], ["animals/dogs"]) == 1
    assert collection.delete([CATS.chunk_id, "e" * 32], []) == 1
    assert collection.delete([CATS.chunk_id], ["animals/dogs"]) == 0  # idempotent
    assert collection.stats() == (1, 1)
    assert collection.search_bm25("dogs cats", 5, []) == []


def test_persists_across_reopen(tmp_path: Path) -> None:
    first = open_collection(tmp_path)
    seeded(first)
    first.close()
    assert not Collection.exists(tmp_path, "missing")
    reopened = Collection.open(tmp_path, COLLECTION, 32 * 1024 * 1024, 1.5)
    assert reopened.stats() == (3, 3)
    assert reopened.search_bm25("cat mice", 1, [])[0].chunk_id == CATS.chunk_id
    assert reopened.get_chunks([DOGS.chunk_id])[0].title == "Dogs"


def test_failed_commit_leaves_previous_state(tmp_path: Path, collection: Collection) -> None:
    put(collection, DOGS.doc_id, DOGS)

    class Boom(Exception):
        pass

    writer = collection._writer_or_open()

    class FailingWriter:
        def __getattr__(self, name: str) -> object:
            return getattr(writer, name)

        def commit(self) -> None:
            raise Boom

    collection._writer = FailingWriter()  # type: ignore[assignment]
    try:
        put(collection, CATS.doc_id, CATS)
    except Boom:
        pass
    else:
        raise AssertionError("commit did not fail")
    assert committed_chunk_ids(tmp_path) == {DOGS.chunk_id}
    assert not collection.files.path(CATS.chunk_id).exists()  # its file was cleaned up
    collection._writer = writer
    put(collection, TAXES.doc_id, TAXES)  # the rolled-back add must not ride along
    assert committed_chunk_ids(tmp_path) == {DOGS.chunk_id, TAXES.chunk_id}


def test_crash_before_commit_keeps_committed_state(tmp_path: Path) -> None:
    """A process that dies mid-write (after adding, before committing) leaves the last commit."""
    put(open_collection(tmp_path), DOGS.doc_id, DOGS)
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from services.sparse.tests.conftest import open_collection, chunk
        from services.sparse.schema import to_document
        c = open_collection(Path({str(tmp_path)!r}))
        cats = chunk("animals/cats", "Cats sleep.", "Cats")
        c.files.write([cats])
        w = c._writer_or_open()
        w.delete_documents_by_term("chunk_id", {DOGS.chunk_id!r})
        w.add_document(to_document(cats))
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert committed_chunk_ids(tmp_path) == {DOGS.chunk_id}
    # The writer lock died with the process; a reopened collection writes and drops the orphan file.
    reopened = Collection.open(tmp_path, COLLECTION, 32 * 1024 * 1024, 1.5)
    assert reopened.files.chunk_ids() == [DOGS.chunk_id]
    put(reopened, TAXES.doc_id, TAXES)
    assert committed_chunk_ids(tmp_path) == {DOGS.chunk_id, TAXES.chunk_id}


def test_phrase_mode_keeps_no_file_per_chunk(tmp_path: Path) -> None:
    phrase = Collection.open(tmp_path, COLLECTION, 32 * 1024 * 1024, 1.5, chunk_files=False)
    seeded(phrase)
    assert not (tmp_path / COLLECTION / "chunks").exists()
    # The text is the index's stored field: reads and phrase searches need no file.
    assert phrase.get_chunks([DOGS.chunk_id])[0].text == DOGS.text
    assert phrase.search_bm25("cat mice", 1, [])[0].chunk_id == CATS.chunk_id
    phrase.close()


def test_switching_exact_modes_drops_or_rebuilds_the_chunk_files(tmp_path: Path) -> None:
    ripgrep = Collection.open(tmp_path, COLLECTION, 32 * 1024 * 1024, 1.5)
    seeded(ripgrep)
    ripgrep.close()
    files = tmp_path / COLLECTION / "chunks"
    assert sorted(ChunkFiles(files).chunk_ids()) == sorted([DOGS.chunk_id, CATS.chunk_id, TAXES.chunk_id])

    Collection.open(tmp_path, COLLECTION, 32 * 1024 * 1024, 1.5, chunk_files=False).close()
    assert not files.exists()

    # Back in ripgrep mode the files are written again from the index, and marked complete (a
    # crash while writing them leaves no marker, and the next open writes them again).
    again = Collection.open(tmp_path, COLLECTION, 32 * 1024 * 1024, 1.5)
    assert (files / ".complete").is_file()
    assert ChunkFiles(files).path(DOGS.chunk_id).read_text(encoding="utf-8").splitlines()[1] == DOGS.text
    assert len(ChunkFiles(files).chunk_ids()) == 3
    again.close()
