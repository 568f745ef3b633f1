from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from meshkit.core.errors import ServiceError
from services.index import mutations as mut
from services.index import store as store_module
from services.index.backends import FlatBackend, faiss
from services.index.records import IDENTITY_FILE, CollectionMismatch
from services.index.store import CollectionIndex
from services.index.wal import WalCorruption

from .conftest import (
    DIM,
    batch,
    brute_force,
    cid,
    clustered_vectors,
    doc_batch,
    open_index,
    policy,
    random_vectors,
    replacement,
)


def fill(index: CollectionIndex, n: int, per_doc: int = 10, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """n chunks in docs of per_doc chunks; returns chunk ids in insertion order and vectors."""
    vectors = random_vectors(n, seed)
    chunk_ids = [cid(f"doc-{i // per_doc}", i) for i in range(n)]
    for start in range(0, n, per_doc):
        index.upsert(
            doc_batch(
                f"doc-{start // per_doc}",
                chunk_ids[start : start + per_doc],
                vectors[start : start + per_doc],
            )
        )
    return chunk_ids, vectors


def test_search_matches_brute_force(index: CollectionIndex) -> None:
    chunk_ids, vectors = fill(index, 300)
    for query in random_vectors(5, seed=99):
        hits = index.search(query, 10)
        assert [h.chunk_id for h in hits] == [chunk_ids[i] for i in brute_force(vectors, query, 10)]
        assert hits[0].score == pytest.approx(
            float(vectors[brute_force(vectors, query, 1)[0]] @ query), abs=1e-5
        )
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_search_runs_faiss_with_the_policy_threads_and_gives_the_worker_its_own_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-query search on several OpenMP threads leaves them busy-waiting on shared cores:
    the policy's count applies inside the search only, on the thread that runs it."""
    index = open_index(tmp_path, index_type="flat", search_threads=1)
    fill(index, 50)
    seen: list[int] = []
    real_search = FlatBackend.search

    def recording_search(self: FlatBackend, *args: object) -> tuple[np.ndarray, np.ndarray]:
        seen.append(faiss.omp_get_max_threads())
        return real_search(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(FlatBackend, "search", recording_search)

    def worker() -> int:
        faiss.omp_set_num_threads(3)
        assert index.search(random_vectors(1, 7)[0], 5)
        return int(faiss.omp_get_max_threads())

    with ThreadPoolExecutor(1) as pool:
        after = pool.submit(worker).result()
    assert seen == [1]
    assert after == 3


def test_top_k_larger_than_collection_returns_everything(index: CollectionIndex) -> None:
    fill(index, 7, per_doc=7)
    assert len(index.search(random_vectors(1, 5)[0], 50)) == 7


def test_upsert_overwrites_by_id(index: CollectionIndex) -> None:
    chunk_ids, vectors = fill(index, 20)
    new = -vectors[3]
    index.upsert(doc_batch("moved", [chunk_ids[3]], new[None, :]))
    stats = index.stats()
    assert stats.chunks == 20
    top = index.search(new, 1)[0]
    assert (top.chunk_id, top.doc_id) == (chunk_ids[3], "moved")
    assert top.score == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("index_type", ["flat", "ivf", "hnsw"])
def test_doc_filter_returns_top_k_of_allowed_docs(tmp_path: Path, index_type: str) -> None:
    index = open_index(tmp_path, index_type=index_type)
    chunk_ids, vectors = fill(index, 1200, per_doc=30)
    index.rebuild()
    wanted = {"doc-3", "doc-17"}
    allowed = [i for i in range(1200) if f"doc-{i // 30}" in wanted]
    for query in random_vectors(3, seed=7):
        hits = index.search(query, 25, ["doc-3", "doc-17", "no-such-doc"])
        assert {h.doc_id for h in hits} <= wanted
        expected = [chunk_ids[allowed[i]] for i in brute_force(vectors[allowed], query, 25)]
        assert [h.chunk_id for h in hits] == expected
    assert index.search(random_vectors(1)[0], 5, ["no-such-doc"]) == []


def test_replace_documents_is_keep_plus_upserts(index: CollectionIndex) -> None:
    old = [cid("a", i) for i in range(4)]
    vectors = random_vectors(8)
    index.upsert(doc_batch("a", old, vectors[:4]))
    index.upsert(doc_batch("b", [cid("b", 0)], vectors[4:5]))
    new = [cid("a", 10), cid("a", 11)]
    ghost = cid("a", 99)
    result = index.replace_documents([replacement("a", new, vectors[5:7], keep=(old[0], ghost))])
    assert (result.upserted, result.removed, result.missing_chunk_ids) == (2, 3, [ghost])
    in_a = {h.chunk_id for h in index.search(vectors[0], 100, ["a"])}
    assert in_a == {old[0], *new}
    assert index.stats().chunks == 4 and index.stats().documents == 2  # b untouched


def test_replace_of_unchanged_document_logs_nothing(index: CollectionIndex) -> None:
    ids = [cid("a", i) for i in range(3)]
    index.upsert(doc_batch("a", ids, random_vectors(3)))
    before = index.stats().sequence
    result = index.replace_documents([replacement("a", [], random_vectors(0), keep=tuple(ids))])
    assert (result.upserted, result.removed, result.missing_chunk_ids) == (0, 0, [])
    assert index.stats().sequence == before


def test_keep_of_a_chunk_owned_by_another_document_is_missing(index: CollectionIndex) -> None:
    foreign = cid("b", 0)
    index.upsert(doc_batch("b", [foreign], random_vectors(1)))
    result = index.replace_documents([replacement("a", [], random_vectors(0), keep=(foreign,))])
    assert result.missing_chunk_ids == [foreign]
    assert index.stats().chunks == 1


def test_delete_by_doc_and_by_chunk(index: CollectionIndex) -> None:
    chunk_ids, vectors = fill(index, 40)
    assert index.delete([], ["doc-0", "doc-1"]) == 20
    assert index.delete([chunk_ids[25], chunk_ids[0]], []) == 1  # chunk 0 went with doc-0
    assert index.delete([], ["doc-0"]) == 0  # idempotent
    remaining = {h.chunk_id for h in index.search(vectors[0], 100)}
    assert remaining == set(chunk_ids[20:]) - {chunk_ids[25]}
    assert index.stats().documents == 2


def test_collision_in_faiss_id_space_is_refused(index: CollectionIndex) -> None:
    a = "0123456789abcde" + "0" * 17
    b = "0123456789abcde" + "f" * 17
    index.upsert(doc_batch("a", [a], random_vectors(1)))
    with pytest.raises(ServiceError) as err:
        index.upsert(doc_batch("b", [b], random_vectors(1)))
    assert "collides" in err.value.message
    with pytest.raises(ServiceError):
        index.upsert(
            doc_batch(
                "c",
                [cid("c", 1), "fedcba987654321" + "0" * 17, "fedcba987654321" + "1" * 17],
                random_vectors(3),
            )
        )
    assert index.stats().chunks == 1 and index.stats().sequence == 1


def search_ids(index: CollectionIndex, queries: np.ndarray, k: int = 10) -> list[list[tuple[str, str]]]:
    return [[(h.chunk_id, h.doc_id) for h in index.search(q, k)] for q in queries]


def test_restart_reloads_snapshot_and_wal_exactly(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat")
    chunk_ids, _ = fill(index, 100)
    index.snapshot()
    index.delete([], ["doc-2"])
    index.replace_documents(
        [replacement("doc-3", [cid("doc-3", 500)], random_vectors(1, 3), keep=(chunk_ids[30],))]
    )
    index.upsert(doc_batch("doc-new", [cid("doc-new", 0)], random_vectors(1, 4)))
    before = index.stats()
    assert before.pending_wal_records == 3
    queries = random_vectors(4, seed=11)
    expected = search_ids(index, queries)
    index.close()

    reopened = open_index(tmp_path, index_type="flat")
    assert reopened.stats() == before
    assert search_ids(reopened, queries) == expected
    # The log keeps going where it stopped.
    reopened.upsert(doc_batch("doc-new", [cid("doc-new", 1)], random_vectors(1, 5)))
    assert reopened.stats().sequence == before.sequence + 1


def test_torn_wal_tail_is_dropped(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat")
    fill(index, 20)  # two records
    index.close()
    segment = sorted((tmp_path / "docs" / "wal").glob("*.wal"))[-1]
    data = segment.read_bytes()
    segment.write_bytes(data[:-7])  # the second record was cut mid-write

    reopened = open_index(tmp_path, index_type="flat")
    stats = reopened.stats()
    assert (stats.chunks, stats.sequence) == (10, 1)
    reopened.upsert(doc_batch("x", [cid("x", 0)], random_vectors(1)))  # appends after the cut
    reopened.close()
    again = open_index(tmp_path, index_type="flat")
    assert (again.stats().chunks, again.stats().sequence) == (11, 2)


def test_garbage_after_last_record_is_dropped(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat")
    fill(index, 10)
    index.close()
    segment = sorted((tmp_path / "docs" / "wal").glob("*.wal"))[-1]
    with segment.open("ab") as f:
        f.write(b"\x10\x00\x00\x00garbage-garbage-garbage")
    assert open_index(tmp_path, index_type="flat").stats().chunks == 10


def test_crash_between_snapshot_and_wal_truncation_does_not_duplicate(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="hnsw")
    chunk_ids, _ = fill(index, 50)
    index.delete([chunk_ids[0]], [])
    index.upsert(doc_batch("doc-0", [chunk_ids[0]], random_vectors(1, 42)))
    wal_dir = tmp_path / "docs" / "wal"
    saved = tmp_path / "saved-wal"
    shutil.copytree(wal_dir, saved)
    outcome = index.snapshot()
    queries = random_vectors(3, seed=5)
    expected = search_ids(index, queries)
    stats = index.stats()
    index.close()
    for segment in saved.iterdir():  # as if the process died before dropping the old log
        shutil.copy(segment, wal_dir / segment.name)

    reopened = open_index(tmp_path, index_type="hnsw")
    assert reopened.stats() == stats
    assert reopened.stats().pending_wal_records == 0 and outcome.sequence == stats.sequence
    assert search_ids(reopened, queries) == expected
    reopened.snapshot(force=True)
    assert len(list(wal_dir.glob("*.wal"))) == 1


def test_interrupted_snapshot_write_leaves_previous_snapshot_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = open_index(tmp_path, index_type="flat")
    fill(index, 20)
    index.snapshot()
    index.upsert(doc_batch("late", [cid("late", 0)], random_vectors(1, 9)))

    def crash(*_args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(store_module, "write_snapshot", crash)
    with pytest.raises(OSError):
        index.snapshot()
    monkeypatch.undo()
    index.close()
    reopened = open_index(tmp_path, index_type="flat")
    assert reopened.stats().chunks == 21


def recall_at(
    index: CollectionIndex, vectors: np.ndarray, chunk_ids: list[str], queries: np.ndarray, k: int = 10
) -> float:
    found = 0
    for query in queries:
        truth = {chunk_ids[i] for i in brute_force(vectors, query, k)}
        found += len(truth & {h.chunk_id for h in index.search(query, k)})
    return found / (k * len(queries))


def test_auto_switches_to_ivf_past_threshold_and_keeps_recall(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="auto", ann_threshold=1500, segment_rows=1500, ivf_nprobe=8)
    n = 3000
    vectors = clustered_vectors(n)
    chunk_ids = [cid(f"d{i // 100}", i) for i in range(n)]
    for s in range(0, 1500, 100):
        index.upsert(doc_batch(f"d{s // 100}", chunk_ids[s : s + 100], vectors[s : s + 100]))
    assert index.rebuild_target() is None and index.stats().index_type == "flat"
    for s in range(1500, n, 100):
        index.upsert(doc_batch(f"d{s // 100}", chunk_ids[s : s + 100], vectors[s : s + 100]))
    assert index.rebuild_target() == "ivf"
    assert index.rebuild()
    assert index.stats().index_type == "ivf"
    queries = clustered_vectors(50, seed=3)
    assert recall_at(index, vectors, chunk_ids, queries) >= 0.9
    # The switch survives a restart without another rebuild.
    index.snapshot()
    index.close()
    reopened = open_index(tmp_path, index_type="auto", ann_threshold=1500, segment_rows=1500, ivf_nprobe=8)
    assert reopened.stats().index_type == "ivf" and reopened.rebuild_target() is None
    assert recall_at(reopened, vectors, chunk_ids, queries) >= 0.9


def test_writes_during_a_rebuild_are_not_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = open_index(tmp_path, index_type="auto", ann_threshold=1000, segment_rows=1000)
    chunk_ids, vectors = fill(index, 1100, per_doc=100)
    late_id, late_vector = cid("late", 0), random_vectors(1, 77)
    real_build = store_module.build_backend

    def build_while_writing(*args: object, **kwargs: object) -> object:
        index.upsert(doc_batch("late", [late_id], late_vector))  # lands in the old backend only
        index.delete([], ["doc-0"])
        return real_build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module, "build_backend", build_while_writing)
    assert index.rebuild()
    assert index.stats().index_type == "ivf"
    assert index.search(late_vector[0], 1)[0].chunk_id == late_id
    found = {h.chunk_id for h in index.search(vectors[5], 1000)}
    assert not found & set(chunk_ids[:100])


def test_hnsw_deletes_are_hidden_and_compacted(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="hnsw", hnsw_m=16, segment_rows=100)
    chunk_ids, vectors = fill(index, 400, per_doc=10)
    assert index.stats().index_type == "hnsw"
    deleted_docs = [f"doc-{i}" for i in range(0, 40, 3)]  # 14 of 40 documents: 35%
    index.delete([], deleted_docs)
    deleted = {chunk_ids[i] for i in range(400) if f"doc-{i // 10}" in deleted_docs}
    for query in vectors[:20]:
        assert not {h.chunk_id for h in index.search(query, 20)} & deleted
    # Overwrite of a live chunk: the old graph entry becomes a tombstone, never a duplicate.
    index.upsert(doc_batch("doc-1", [chunk_ids[10]], -vectors[10][None, :]))
    assert [h.chunk_id for h in index.search(-vectors[10], 400)].count(chunk_ids[10]) == 1
    index.snapshot()
    index.close()

    reopened = open_index(tmp_path, index_type="hnsw", hnsw_m=16, segment_rows=100)
    assert reopened.stats().chunks == 400 - len(deleted)
    assert reopened.rebuild_target() == "hnsw"  # tombstones > 20%
    assert reopened.rebuild()
    assert reopened.rebuild_target() is None
    live = [i for i in range(400) if chunk_ids[i] not in deleted and i != 10]
    assert recall_at(reopened, vectors[live], [chunk_ids[i] for i in live], vectors[live][:20]) >= 0.85


def test_changing_the_index_type_rebuilds_from_stored_vectors(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat", segment_rows=20)
    fill(index, 50)
    index.snapshot()
    index.close()
    reopened = open_index(tmp_path, index_type="hnsw", segment_rows=20)
    assert reopened.rebuild_target() == "hnsw"
    reopened.rebuild()
    assert reopened.stats().index_type == "hnsw" and reopened.stats().chunks == 50


def test_segment_rows_match_a_dict_under_random_puts_and_removes(tmp_path: Path) -> None:
    """(Was VectorTable's test: the side table is gone, vectors live in the segments.) Random
    overwrites and deletes across sealed, frozen and growing segments, with seals and compactions
    in between: the live rows are exactly the last vector put for each live chunk."""
    index = open_index(tmp_path, index_type="auto", segment_rows=400, ann_threshold=300)
    rng = np.random.default_rng(1)
    ids = [cid(f"d{i % 50}", i) for i in range(3000)]
    truth: dict[str, np.ndarray] = {}
    for step in range(300):
        picked = sorted(set(rng.integers(0, 3000, rng.integers(1, 100)).tolist()))
        chunk_ids = [ids[i] for i in picked]
        if rng.random() < 0.7:
            vectors = rng.standard_normal((len(picked), 16)).astype(np.float32)
            index.upsert(batch([f"d{i % 50}" for i in picked], chunk_ids, vectors))
            truth.update(zip(chunk_ids, vectors, strict=True))
        else:
            index.delete(chunk_ids, [])
            for chunk_id in chunk_ids:
                truth.pop(chunk_id, None)
        if step % 60 == 59:
            index.rebuild()
    exported = index.export_buckets(range(1024))
    assert index.stats().chunks == len(truth) == len(exported.chunk_ids)
    for chunk_id, vector in zip(exported.chunk_ids, exported.matrix(16), strict=True):
        assert np.array_equal(vector, truth[chunk_id])


def test_corruption_before_the_last_segment_stops_recovery(tmp_path: Path) -> None:
    index = open_index(tmp_path, index_type="flat")
    fill(index, 20)
    index.snapshot()  # rotates: records 1-2 sit in an old segment...
    index.upsert(doc_batch("x", [cid("x", 0)], random_vectors(1)))
    index.close()
    wal_dir = tmp_path / "docs" / "wal"
    segments = sorted(wal_dir.glob("*.wal"))
    assert len(segments) == 1  # ...which the snapshot dropped
    damaged = bytearray(segments[0].read_bytes())
    damaged[20] ^= 0xFF
    (wal_dir / "00000000000000000000.wal").write_bytes(bytes(damaged))  # an older, damaged segment
    with pytest.raises(WalCorruption):
        open_index(tmp_path, index_type="flat")


def test_a_multi_shard_layout_records_document_placement_and_refuses_one_without_it(
    tmp_path: Path,
) -> None:
    index = CollectionIndex.open("docs", tmp_path / "docs", policy(), shard=1, shard_count=2)
    index.upsert(doc_batch("doc-a", [cid("doc-a", 0)], random_vectors(1)))
    index.snapshot()
    index.close()
    identity = json.loads((tmp_path / "docs" / IDENTITY_FILE).read_text())
    assert identity["placement"] == "document"
    # A directory of a 2-shard layout from before documents were kept whole on one shard (each
    # chunk placed by its own id) holds chunks other shards own now: refused, not mixed in.
    del identity["placement"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / IDENTITY_FILE).write_text(json.dumps(identity))
    with pytest.raises(CollectionMismatch, match="placement"):
        CollectionIndex.open("docs", tmp_path / "old", policy(), shard=1, shard_count=2)
    # One shard places nothing: its directories are as they were.
    single = CollectionIndex.open("docs", tmp_path / "one", policy())
    single.close()
    assert "placement" not in json.loads((tmp_path / "one" / IDENTITY_FILE).read_text())


def test_log_entries_of_several_shards_carry_their_placement() -> None:
    upsert = mut.Upsert(doc_batch("doc-a", [cid("doc-a", 0)], random_vectors(1)))
    record = mut.decode_record(mut.encode(upsert, collection="docs", shard_count=2), DIM)
    assert (record.shard_count, record.placement) == (2, "document")
    single = mut.decode_record(mut.encode(upsert, collection="docs", shard_count=1), DIM)
    assert (single.shard_count, single.placement) == (1, "")
