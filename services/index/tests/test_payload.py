"""Chunk payloads, document sources and metadata filters in one collection: stored with the
vectors, restored from snapshot + WAL, and applied before ranking."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from meshkit.domain.ids import chunk_id_for
from meshkit.domain.metadata import EQ, EXISTS, IN, NE, Clause
from services.index import mutations as mut
from services.index.mutations import ChunkBatch, Replacement, Source
from services.index.store import CollectionIndex

from .conftest import cid, open_index, random_vectors


def source(uri: str, **metadata: str) -> Source:
    return Source(f"title of {uri}", uri, tuple(sorted(metadata.items())))


def replace_doc(index: CollectionIndex, doc_id: str, vectors: np.ndarray, src: Source | None) -> list[str]:
    ids = [cid(doc_id, i) for i in range(len(vectors))]
    payloads = [
        mut.Payload(f"text {doc_id} {i}", ("Guide", doc_id), i, 10 * i, 10 * i + 9) for i in range(len(ids))
    ]
    batch = ChunkBatch(ids, [doc_id] * len(ids), np.ascontiguousarray(vectors, np.float32), payloads)
    index.replace_documents([Replacement(doc_id, batch, [], 0, src)])
    return ids


def test_payload_and_source_survive_snapshot_and_wal_replay(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat")
    vectors = random_vectors(6, seed=1)
    first = replace_doc(index, "a", vectors[:3], source("file:///a.md", team="docs"))
    index.snapshot()
    # After the snapshot: only in the WAL.
    second = replace_doc(index, "b", vectors[3:], source("file:///b.md", team="infra", tier="1"))
    index.close()

    reopened = open_index(tmp_path, index_type="flat")
    stored = {c.chunk_id: c for c in reopened.get_chunks([*first, *second, "f" * 32])}
    assert set(stored) == {*first, *second}
    chunk = stored[second[1]]
    assert chunk.doc_id == "b"
    assert chunk.payload == mut.Payload("text b 1", ("Guide", "b"), 1, 10, 19)
    assert chunk.source.source_uri == "file:///b.md"
    assert dict(chunk.source.metadata) == {"team": "infra", "tier": "1"}
    assert stored[first[0]].source.title == "title of file:///a.md"
    hits = reopened.search(vectors[0], 10, clauses=(Clause("team", EQ, ("docs",)),))
    assert {h.doc_id for h in hits} == {"a"}


def test_filter_applies_before_ranking_so_top_k_is_honoured(index: CollectionIndex) -> None:
    vectors = random_vectors(40, seed=2)
    query = vectors[0]
    # The 37 chunks nearest the query belong to unfiltered documents: a post-filter of the top 3
    # would come back empty.
    order = np.argsort(-(vectors @ query))
    for n, row in enumerate(order[:37]):
        replace_doc(index, f"other-{n}", vectors[row : row + 1], source(f"o{n}", team="infra"))
    wanted = [
        replace_doc(index, f"doc-{n}", vectors[row : row + 1], source(f"d{n}", team="docs"))[0]
        for n, row in enumerate(order[37:])
    ]
    hits = index.search(query, 3, clauses=(Clause("team", EQ, ("docs",)),))
    assert sorted(h.chunk_id for h in hits) == sorted(wanted)
    assert index.search(query, 3, clauses=(Clause("team", EQ, ("nobody",)),)) == []
    both = index.search(query, 50, doc_ids=["doc-0", "other-0"], clauses=(Clause("team", IN, ("docs", "x")),))
    assert {h.doc_id for h in both} == {"doc-0"}
    ne = index.search(query, 50, clauses=(Clause("team", NE, ("infra",)),))
    assert {h.doc_id for h in ne} == {"doc-0", "doc-1", "doc-2"}


def test_source_kept_when_a_writer_sends_none_and_dropped_with_the_document(index: CollectionIndex) -> None:
    vectors = random_vectors(4, seed=3)
    replace_doc(index, "a", vectors[:2], source("file:///a", lang="en"))
    # A replacement that changes every chunk but sends no source (an older writer) keeps it.
    ids = replace_doc(index, "a", vectors[2:], None)
    assert index.get_chunks(ids)[0].source.source_uri == "file:///a"
    assert index.search(vectors[2], 5, clauses=(Clause("lang", EXISTS),))
    # A source-only change is applied (and logged) too.
    index.replace_documents([Replacement("a", ChunkBatch.empty(16), ids, 0, source("file:///a2"))])
    assert index.get_chunks(ids)[0].source.source_uri == "file:///a2"
    assert index.search(vectors[2], 5, clauses=(Clause("lang", EXISTS),)) == []
    index.delete([], ["a"])
    assert index.get_chunks(ids) == []
    assert index.search(vectors[2], 5, clauses=(Clause("lang", NE, ("x",)),)) == []


def test_records_written_before_payloads_still_decode() -> None:
    vectors = random_vectors(2, seed=4)
    old = mut.Replace([Replacement("a", ChunkBatch(["1" * 32, "2" * 32], ["a", "a"], vectors), [])])
    decoded = mut.decode(mut.encode(old), 16)
    assert isinstance(decoded, mut.Replace)
    assert decoded.documents[0].source is None
    assert decoded.documents[0].upserts.payloads == []
    new = mut.Replace(
        [
            Replacement(
                "a",
                ChunkBatch(["1" * 32], ["a"], vectors[:1], [mut.Payload('é "x"')]),
                [],
                3,
                source("u", k="v"),
            )
        ]
    )
    again = mut.decode(mut.encode(new), 16)
    assert isinstance(again, mut.Replace)
    assert again.documents[0].source == new.documents[0].source
    assert again.documents[0].upserts.payloads == new.documents[0].upserts.payloads
    assert again.documents[0].fence == 3


def test_every_hit_comes_with_its_payload_while_writers_replace_documents(index: CollectionIndex) -> None:
    """A search and its hits' payloads are one read: documents replaced (every chunk id new)
    between the two would leave a hit without its text."""
    docs = [f"doc-{d}" for d in range(8)]

    def write_version(version: int) -> None:
        for d, doc_id in enumerate(docs):
            ids = [chunk_id_for("docs", doc_id, f"v{version} {i}") for i in range(4)]
            payloads = [mut.Payload(f"{doc_id} v{version} {i}") for i in range(4)]
            vectors = random_vectors(4, seed=1000 * version + d)
            batch = ChunkBatch(ids, [doc_id] * 4, vectors, payloads)
            index.replace_documents([Replacement(doc_id, batch, [], 0, None)])

    write_version(0)
    stop = threading.Event()
    problems: list[str] = []

    def writer() -> None:
        version = 1
        while not stop.is_set():
            write_version(version)
            version += 1

    def reader(seed: int) -> int:
        searches = 0
        for query in random_vectors(400, seed=seed):
            hits, stored = index.search_with_payloads(query, 10, payloads=10)
            searches += 1
            if [s.chunk_id for s in stored] != [h.chunk_id for h in hits]:
                problems.append(f"{len(hits)} hits, {len(stored)} payloads")
            problems.extend(
                f"{s.chunk_id}: {s.payload.text!r}" for s in stored if not s.payload.text.startswith(s.doc_id)
            )
        return searches

    with ThreadPoolExecutor(3) as pool:
        writing = pool.submit(writer)
        searches = sum(pool.map(reader, [1, 2]))
        stop.set()
        writing.result()
    assert searches == 800
    assert problems == []
