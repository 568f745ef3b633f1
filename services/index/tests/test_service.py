from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc import aio

from meshkit.domain.ids import document_shard
from meshkit.rpc.server import RunningService, start_service
from meshkit.settings import IndexSettings
from ragmesh.common.v1 import common_pb2
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from services.index.remote import SnapshotRemote
from services.index.servicer import build_spec
from services.index.shard import IndexShard

from .conftest import DIM, cid, random_vectors


def make_settings(tmp_path: Path, **overrides: object) -> IndexSettings:
    base: dict[str, object] = {
        "state_dir": tmp_path,
        "port": 0,
        "index_dimension": DIM,
        "index_upload_snapshots": False,
        "index_max_top_k": 50,
        "index_max_batch_chunks": 100,
        "index_snapshot_every": 1000,
        "index_snapshot_interval_s": 3600,
        "store_log": "local",
    }
    base.update(overrides)
    return IndexSettings(**base)  # type: ignore[arg-type]


class Served:
    def __init__(self, running: RunningService, shard: IndexShard, channel: aio.Channel) -> None:
        self.running = running
        self.shard = shard
        self.channel = channel
        self.stub = index_pb2_grpc.IndexServiceStub(channel)


async def serve(settings: IndexSettings, remote: SnapshotRemote | None = None) -> Served:
    if remote is None and settings.index_upload_snapshots:
        remote = SnapshotRemote.from_settings(settings)
    shard = IndexShard(settings, remote)
    running = await start_service(build_spec(settings, shard), settings)
    channel = aio.insecure_channel(f"127.0.0.1:{running.port}")
    return Served(running, shard, channel)


async def shutdown(served: Served) -> None:
    await served.channel.close()
    await served.running.stop(0)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    s = await serve(make_settings(tmp_path))
    yield s
    await shutdown(s)


def chunk(doc_id: str, chunk_id: str, vector: np.ndarray) -> index_pb2.Chunk:
    return index_pb2.Chunk(chunk_id=chunk_id, doc_id=doc_id, vector=common_pb2.Vector(values=vector.tolist()))


def vec(values: np.ndarray) -> common_pb2.Vector:
    return common_pb2.Vector(values=values.tolist())


async def expect_code(call: object, code: grpc.StatusCode, fragment: str = "") -> str:
    with pytest.raises(aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == code, err.value.details()
    assert fragment in (err.value.details() or "")
    return err.value.details() or ""


async def test_upsert_search_replace_delete_stats_over_grpc(served: Served) -> None:
    stub = served.stub
    vectors = random_vectors(6)
    ids = [cid("a", i) for i in range(3)] + [cid("b", i) for i in range(3)]
    chunks = [chunk("a" if i < 3 else "b", ids[i], vectors[i]) for i in range(6)]
    assert (await stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=chunks))).upserted == 6

    response = await stub.Search(index_pb2.SearchRequest(collection="docs", vector=vec(vectors[4]), top_k=3))
    assert response.hits[0].chunk_id == ids[4] and response.hits[0].doc_id == "b" and response.shard == 0
    assert response.hits[0].score == pytest.approx(1.0, abs=1e-5)
    filtered = await stub.Search(
        index_pb2.SearchRequest(collection="docs", vector=vec(vectors[4]), top_k=5, doc_ids=["a"])
    )
    assert {h.doc_id for h in filtered.hits} == {"a"} and len(filtered.hits) == 3

    new_id = cid("a", 10)
    replaced = await stub.ReplaceDocuments(
        index_pb2.ReplaceDocumentsRequest(
            collection="docs",
            documents=[
                index_pb2.DocumentReplacement(
                    doc_id="a", upserts=[chunk("", new_id, vectors[0])], keep_chunk_ids=[ids[1], cid("a", 77)]
                )
            ],
        )
    )
    assert (replaced.upserted, replaced.removed, list(replaced.missing_chunk_ids)) == (1, 2, [cid("a", 77)])

    deleted = await stub.Delete(index_pb2.DeleteRequest(collection="docs", doc_ids=["b"]))
    assert deleted.removed == 3
    stats = await stub.GetStats(index_pb2.GetStatsRequest(collection="docs"))
    assert (stats.chunks, stats.documents, stats.index_type, stats.dimension) == (2, 1, "flat", DIM)
    assert (stats.shard, stats.shard_count, stats.pending_wal_records) == (0, 1, 3)

    snap = await stub.Snapshot(index_pb2.SnapshotRequest(collection="docs"))
    assert snap.sequence == 3 and not snap.uploaded
    stats = await stub.GetStats(index_pb2.GetStatsRequest(collection="docs"))
    assert stats.pending_wal_records == 0


async def test_search_sends_the_payload_of_its_first_hits_when_asked(served: Served) -> None:
    stub = served.stub
    vectors = random_vectors(4)
    ids = [cid("a", i) for i in range(4)]
    chunks = [chunk("a", ids[i], vectors[i]) for i in range(4)]
    for i, item in enumerate(chunks[:3]):
        item.text = f"text {i}"
    # The fourth was written without a payload: it has no text to send.
    await stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=chunks))
    plain = await stub.Search(index_pb2.SearchRequest(collection="docs", vector=vec(vectors[0]), top_k=4))
    assert not plain.chunks
    asked = await stub.Search(
        index_pb2.SearchRequest(collection="docs", vector=vec(vectors[0]), top_k=4, with_payloads=2)
    )
    first_two = [h.chunk_id for h in asked.hits[:2]]
    assert [c.chunk_id for c in asked.chunks] == first_two
    assert [c.text for c in asked.chunks] == [f"text {ids.index(i)}" for i in first_two]
    everything = await stub.Search(
        index_pb2.SearchRequest(collection="docs", vector=vec(vectors[0]), top_k=4, with_payloads=100)
    )
    assert {c.chunk_id for c in everything.chunks} == set(ids[:3])


async def test_validation_errors(served: Served) -> None:
    stub = served.stub
    good = random_vectors(1)[0]
    await stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=[chunk("a", cid("a", 0), good)]))

    await expect_code(
        stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=[chunk("a", cid("a", 1), good[:5])])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "dimension",
    )
    await expect_code(
        stub.Search(index_pb2.SearchRequest(collection="docs", vector=vec(np.zeros(DIM + 1)), top_k=1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "dimension",
    )
    await expect_code(
        stub.Search(index_pb2.SearchRequest(collection="nope", vector=vec(good), top_k=1)),
        grpc.StatusCode.NOT_FOUND,
        "nope",
    )
    await expect_code(stub.GetStats(index_pb2.GetStatsRequest(collection="nope")), grpc.StatusCode.NOT_FOUND)
    await expect_code(stub.Snapshot(index_pb2.SnapshotRequest(collection="nope")), grpc.StatusCode.NOT_FOUND)
    for top_k in (0, 51):
        await expect_code(
            stub.Search(index_pb2.SearchRequest(collection="docs", vector=vec(good), top_k=top_k)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "top_k",
        )
    await expect_code(
        stub.Upsert(index_pb2.UpsertRequest(collection="Bad Name!", chunks=[chunk("a", cid("a", 1), good)])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "collection",
    )
    await expect_code(
        stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=[chunk("a", "xyz", good)])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "chunks[0].chunk_id",
    )
    await expect_code(
        stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=[chunk("../etc", cid("a", 1), good)])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "doc_id",
    )
    nan = good.copy()
    nan[0] = np.nan
    await expect_code(
        stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=[chunk("a", cid("a", 1), nan)])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "NaN",
    )
    twice = [chunk("a", cid("a", 1), good), chunk("a", cid("a", 1), good)]
    await expect_code(
        stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=twice)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "more than once",
    )
    too_many = [chunk("a", cid("a", i), good) for i in range(101)]
    await expect_code(
        stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=too_many)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "limit is 100",
    )
    await expect_code(
        stub.Delete(index_pb2.DeleteRequest(collection="docs")), grpc.StatusCode.INVALID_ARGUMENT
    )
    await expect_code(
        stub.ReplaceDocuments(
            index_pb2.ReplaceDocumentsRequest(
                collection="docs",
                documents=[
                    index_pb2.DocumentReplacement(doc_id="a", upserts=[chunk("b", cid("a", 1), good)])
                ],
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "differs from its document",
    )
    # Nothing invalid was written.
    stats = await stub.GetStats(index_pb2.GetStatsRequest(collection="docs"))
    assert stats.chunks == 1 and stats.pending_wal_records == 1
    # Deleting from a collection that does not exist is a no-op, not an error.
    assert (await stub.Delete(index_pb2.DeleteRequest(collection="nope", doc_ids=["a"]))).removed == 0


async def test_a_document_another_shard_owns_is_rejected(tmp_path: Path) -> None:
    served = await serve(make_settings(tmp_path, index_shard=1, index_shard_count=2))
    try:
        vector = random_vectors(1)[0]
        mine = next(f"m{i}" for i in range(100) if document_shard(f"m{i}", 2) == 1)
        theirs = next(f"t{i}" for i in range(100) if document_shard(f"t{i}", 2) == 0)
        own_chunk = chunk(mine, cid(mine, 0), vector)
        await served.stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=[own_chunk]))
        details = await expect_code(
            served.stub.Upsert(
                index_pb2.UpsertRequest(
                    collection="docs", chunks=[own_chunk, chunk(theirs, cid(theirs, 0), vector)]
                )
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "belongs to shard 0 of 2",
        )
        assert "chunks[1]" in details
        await expect_code(
            served.stub.ReplaceDocuments(
                index_pb2.ReplaceDocumentsRequest(
                    collection="docs", documents=[index_pb2.DocumentReplacement(doc_id=theirs)]
                )
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "belongs to shard 0 of 2",
        )
        response = await served.stub.Search(
            index_pb2.SearchRequest(collection="docs", vector=vec(vector), top_k=5)
        )
        assert [h.chunk_id for h in response.hits] == [own_chunk.chunk_id] and response.shard == 1
    finally:
        await shutdown(served)


async def test_shutdown_snapshots_and_restart_serves_the_same_data(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, index_type="auto", index_ann_threshold=60, index_segment_rows=60)
    served = await serve(settings)
    vectors = random_vectors(80, seed=4)
    chunks = [chunk(f"d{i % 8}", cid(f"d{i % 8}", i), vectors[i]) for i in range(80)]
    await served.stub.Upsert(index_pb2.UpsertRequest(collection="docs", chunks=chunks))
    await served.shard.wait_idle()
    before = await served.stub.GetStats(index_pb2.GetStatsRequest(collection="docs"))
    assert before.index_type == "ivf"  # rebuilt in the background past the threshold
    await shutdown(served)
    assert (tmp_path / "index-0" / "docs" / "CURRENT").exists()

    served = await serve(settings)
    try:
        after = await served.stub.GetStats(index_pb2.GetStatsRequest(collection="docs"))
        assert (after.chunks, after.index_type, after.pending_wal_records) == (80, "ivf", 0)
        hits = await served.stub.Search(
            index_pb2.SearchRequest(collection="docs", vector=vec(vectors[7]), top_k=1)
        )
        assert hits.hits[0].chunk_id == chunks[7].chunk_id
    finally:
        await shutdown(served)


async def test_snapshot_every_n_records_runs_in_background(tmp_path: Path) -> None:
    served = await serve(make_settings(tmp_path, index_snapshot_every=3))
    try:
        vectors = random_vectors(5)
        for i in range(5):
            await served.stub.Upsert(
                index_pb2.UpsertRequest(collection="docs", chunks=[chunk("a", cid("a", i), vectors[i])])
            )
        await served.shard.wait_idle()
        stats = await served.stub.GetStats(index_pb2.GetStatsRequest(collection="docs"))
        assert stats.chunks == 5 and stats.pending_wal_records < 3
    finally:
        await shutdown(served)
