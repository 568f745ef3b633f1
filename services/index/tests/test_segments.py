"""Segments: sealing and search across them, deletes and replacements across them, compaction,
restart, merged checkpoint files, bucket export, and replicas that seal and compact at different
times holding the same data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshkit.domain.ids import bucket_of
from meshkit.domain.metadata import EQ, Clause
from services.index import mutations as mut
from services.index.segments import FROZEN, SEALED
from services.index.store import CollectionIndex

from .conftest import DIM, brute_force, cid, clustered_vectors, open_index, policy, random_vectors


def write_docs(
    index: CollectionIndex, vectors: np.ndarray, per_doc: int = 10, first_doc: int = 0
) -> list[str]:
    """Documents of ``per_doc`` chunks with payloads and a source; returns the chunk ids."""
    ids: list[str] = []
    for start in range(0, len(vectors), per_doc):
        d = first_doc + start // per_doc
        doc_id = f"doc-{d}"
        chunk_ids = [cid(doc_id, start + i) for i in range(min(per_doc, len(vectors) - start))]
        payloads = [mut.Payload(f"text {c}", ("H", doc_id), i, i, i + 1) for i, c in enumerate(chunk_ids)]
        batch = mut.ChunkBatch(
            chunk_ids, [doc_id] * len(chunk_ids), vectors[start : start + len(chunk_ids)], payloads
        )
        source = mut.Source(f"title {d}", f"file:///{doc_id}", (("parity", str(d % 2)),))
        index.replace_documents([mut.Replacement(doc_id, batch, [], 0, source)])
        ids += chunk_ids
    return ids


def ids_of(index: CollectionIndex, queries: np.ndarray, k: int = 10, **kw: object) -> list[list[str]]:
    return [[h.chunk_id for h in index.search(q, k, **kw)] for q in queries]  # type: ignore[arg-type]


def exact(live: dict[str, np.ndarray], queries: np.ndarray, k: int = 10) -> list[list[str]]:
    names = list(live)
    matrix = np.stack([live[c] for c in names])
    return [[names[i] for i in brute_force(matrix, q, k)] for q in queries]


def segment_states(index: CollectionIndex) -> list[str]:
    return [s.state for s in index._s.segments]


def test_search_across_sealed_and_growing_segments_is_exact_search(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat", segment_rows=100)
    vectors = random_vectors(1050, seed=1)
    ids = write_docs(index, vectors)
    assert segment_states(index).count(FROZEN) == 9  # frozen at 110 rows, every replica alike
    queries = random_vectors(20, seed=2)
    truth = exact(dict(zip(ids, vectors, strict=True)), queries)
    assert ids_of(index, queries) == truth  # frozen segments: exact in RAM
    assert index.rebuild()
    assert segment_states(index) == [SEALED] * 9 + ["growing"]
    assert ids_of(index, queries) == truth  # sealed: exact over their memory-mapped vectors
    hits = index.search(queries[0], 5)
    assert hits[0].score == pytest.approx(float(vectors[ids.index(hits[0].chunk_id)] @ queries[0]), abs=1e-5)


def test_ann_segments_match_exact_search_on_small_data(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="auto", segment_rows=300, ann_threshold=600)
    vectors = clustered_vectors(2000, seed=3)
    ids = write_docs(index, vectors)
    index.rebuild()
    kinds = [s.backend_kind for s in index._s.segments if s.state == SEALED]
    assert kinds and set(kinds) == {"hnsw"}  # small segments: HNSW
    queries = clustered_vectors(40, seed=4)
    truth = exact(dict(zip(ids, vectors, strict=True)), queries)
    found = ids_of(index, queries)
    recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)])
    assert recall >= 0.99


def test_deletes_and_replacements_across_segments(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat", segment_rows=100)
    vectors = random_vectors(400, seed=5)
    ids = write_docs(index, vectors)
    index.rebuild()  # docs 0-10 sealed, the rest spread over the others
    live = dict(zip(ids, vectors, strict=True))
    # doc-1 (sealed): keep two chunks, add two new ones (in the growing segment).
    old = [c for c in ids if c in set(index._s.chunk_ids_of("doc-1"))]
    new_vectors = random_vectors(2, seed=6)
    new_ids = [cid("doc-1", 1000), cid("doc-1", 1001)]
    batch = mut.ChunkBatch(new_ids, ["doc-1"] * 2, new_vectors)
    result = index.replace_documents([mut.Replacement("doc-1", batch, old[:2], 0, None)])
    assert (result.upserted, result.removed) == (2, len(old) - 2)
    for c in old[2:]:
        del live[c]
    live.update(zip(new_ids, new_vectors, strict=True))
    # Delete a sealed document, a chunk of the growing segment, and overwrite a sealed chunk.
    assert index.delete([ids[-1]], ["doc-3"]) == 11
    for c in [*ids[30:40], ids[-1]]:
        del live[c]
    moved = -vectors[55]
    index.upsert(mut.ChunkBatch([ids[55]], ["doc-5"], moved[None, :]))
    live[ids[55]] = moved
    queries = random_vectors(15, seed=7)
    assert ids_of(index, queries, 20) == exact(live, queries, 20)
    assert index.stats().chunks == len(live) and index.stats().documents == 39
    assert sorted(index._s.chunk_ids_of("doc-1")) == sorted([*old[:2], *new_ids])
    stored = index.get_chunks([ids[55], old[0], ids[35]])
    assert [s.chunk_id for s in stored] == [ids[55], old[0]]  # ids[35] went with doc-3
    assert stored[1].payload.text == f"text {old[0]}" and stored[1].source.title == "title 1"
    filtered = index.search(queries[0], 50, clauses=(Clause("parity", EQ, ("1",)),))
    assert {h.doc_id for h in filtered} <= {f"doc-{d}" for d in range(1, 40, 2)}
    assert len(filtered) == 50


def test_compaction_drops_deleted_rows_and_keeps_results(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat", segment_rows=100, compact_deleted_ratio=0.2)
    vectors = random_vectors(900, seed=8)
    ids = write_docs(index, vectors)
    index.rebuild()
    sealed_before = sum(1 for s in index._s.segments if s.state == SEALED)
    index.delete([], [f"doc-{d}" for d in range(0, 90, 3)])  # a third of every segment
    queries = random_vectors(10, seed=9)
    before = ids_of(index, queries, 30)
    payloads = {c.chunk_id: c for c in index.get_chunks(ids)}
    assert index.rebuild()
    stats = index.stats()
    assert stats.deleted_rows == 0 and stats.segments < sealed_before + 1
    assert ids_of(index, queries, 30) == before
    assert {c.chunk_id: c for c in index.get_chunks(ids)} == payloads
    index.snapshot()
    stats = index.stats()
    index.close()
    reopened = open_index(tmp_path, index_type="flat", segment_rows=100, compact_deleted_ratio=0.2)
    assert ids_of(reopened, queries, 30) == before and reopened.stats() == stats


def test_restart_loads_segments_and_replays_the_wal(tmp_path: Path) -> None:
    settings = {"index_type": "auto", "segment_rows": 200, "ann_threshold": 200}
    index = open_index(tmp_path, **settings)
    vectors = clustered_vectors(1500, seed=10)
    write_docs(index, vectors)
    index.rebuild()
    index.snapshot()
    # After the checkpoint: in the WAL only, across segments.
    index.delete([], ["doc-2", "doc-120"])
    write_docs(index, clustered_vectors(250, seed=11), first_doc=500)  # freezes again
    queries = clustered_vectors(10, seed=12)
    expected = ids_of(index, queries)
    stats = index.stats()
    listing = index.list_documents("", 10_000)
    index.close()
    reopened = open_index(tmp_path, **settings)
    assert reopened.stats() == stats and stats.sealed_rows > 0
    assert ids_of(reopened, queries) == expected
    assert reopened.list_documents("", 10_000) == listing
    assert reopened.rebuild_target() == "ivf"  # the segment frozen in the WAL's replay
    reopened.rebuild()
    assert reopened.stats().chunks == stats.chunks


def test_many_checkpoints_keep_their_files_few(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat", segment_rows=100_000)
    vectors = random_vectors(600, seed=13)
    for i in range(60):
        write_docs(index, vectors[i * 10 : (i + 1) * 10], first_doc=i)
        index.snapshot()
        index.rebuild()  # merges the growing segment's parts and the document runs
    assert len(index._s.growing.parts) <= 8 and len(index._s.doc_runs) <= 8
    queries = random_vectors(5, seed=14)
    expected = ids_of(index, queries)
    stored = index.get_chunks([cid("doc-7", 70), cid("doc-59", 595)])
    index.snapshot(force=True)
    index.close()
    reopened = open_index(tmp_path, index_type="flat", segment_rows=100_000)
    assert ids_of(reopened, queries) == expected
    assert reopened.get_chunks([cid("doc-7", 70), cid("doc-59", 595)]) == stored
    on_disk = sum(1 for p in (tmp_path / "docs").rglob("*") if p.is_file())
    assert on_disk < 60


def test_the_rows_of_a_set_of_buckets_export_with_their_documents(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat", segment_rows=100)
    vectors = random_vectors(300, seed=15)
    ids = write_docs(index, vectors)
    index.rebuild()
    index.replace_documents([mut.Replacement("doc-4", mut.ChunkBatch.empty(DIM), [], 9, None)])  # tombstone
    wanted = {bucket_of(f"doc-{d}") for d in (0, 4, 17)}
    exported = index.export_buckets(wanted)
    docs = {f"doc-{d}" for d in range(30) if bucket_of(f"doc-{d}") in wanted} - {"doc-4"}
    assert set(exported.doc_ids) == docs
    expected = {c for c in ids if any(c in index._s.chunk_ids_of(d) for d in docs)}
    assert set(exported.chunk_ids) == expected
    for chunk_id, vector, payload in zip(
        exported.chunk_ids, exported.matrix(DIM), exported.payloads, strict=True
    ):
        assert np.array_equal(vector, vectors[ids.index(chunk_id)]) and payload.text == f"text {chunk_id}"
    assert exported.fences["doc-4"] == 9
    assert set(exported.sources) == docs and set(exported.buckets) <= wanted


def _two_replicas(tmp_path: Path, **settings: object) -> tuple[CollectionIndex, CollectionIndex]:
    return (
        CollectionIndex.open("docs", tmp_path / "a" / "docs", policy(**settings)),
        CollectionIndex.open("docs", tmp_path / "b" / "docs", policy(**settings)),
    )


def test_replicas_sealing_and_compacting_at_other_times_hold_the_same_data(tmp_path: Path) -> None:
    """Replicas apply the same entries; one runs its background work (seals, compactions) after
    every write, the other only at the end: same documents, fences, chunk ids and exact results."""
    eager, lazy = _two_replicas(tmp_path, index_type="flat", segment_rows=150, compact_deleted_ratio=0.3)
    rng = np.random.default_rng(16)
    vectors = random_vectors(1200, seed=17)
    for step in range(40):
        d = int(rng.integers(0, 60))
        rows = vectors[(step * 30) % 1170 : (step * 30) % 1170 + 10]
        ids = [cid(f"doc-{d}", step * 100 + i) for i in range(10)]
        doc = mut.Replacement(f"doc-{d}", mut.ChunkBatch(ids, [f"doc-{d}"] * 10, rows), [], step + 1, None)
        for replica in (eager, lazy):
            replica.replace_documents([doc])
            if step % 7 == 3:
                replica.delete([], [f"doc-{(d + 1) % 60}"])
        eager.rebuild()
        if step % 10 == 9:
            eager.snapshot()
    layout = [(r.stats().sealed_rows, r.stats().deleted_rows) for r in (eager, lazy)]
    assert layout[0] != layout[1]  # other layouts (compacted or not)...
    assert eager.list_documents("", 1000) == lazy.list_documents("", 1000)  # ...the same data
    queries = random_vectors(20, seed=18)
    assert ids_of(eager, queries, 25) == ids_of(lazy, queries, 25)


def test_replicas_sealing_the_same_rows_build_the_same_index(tmp_path: Path) -> None:
    """A seal is deterministic: the same rows, frozen at the same entry, give the same IVF index
    whenever each replica builds it, so ANN results agree too."""
    eager, lazy = _two_replicas(tmp_path, index_type="auto", segment_rows=1000, ann_threshold=500)
    vectors = clustered_vectors(3500, seed=19)
    for start in range(0, 3500, 100):
        for replica in (eager, lazy):
            write_docs(replica, vectors[start : start + 100], first_doc=start // 10)
        eager.rebuild()
    lazy.rebuild()

    def index_files(replica: CollectionIndex) -> list[str]:
        return [s.files["index.faiss"].sha256 for s in replica._s.segments if s.state == SEALED]  # type: ignore[attr-defined]

    assert len(index_files(eager)) == 3 and index_files(eager) == index_files(lazy)
    queries = clustered_vectors(20, seed=20)
    assert ids_of(eager, queries) == ids_of(lazy, queries)
