"""Replicas of one index shard over a real nats-server: writes taken by either replica reach
both, fences are applied alike (stale refused, equal re-applied, tombstones kept), a replica
with an empty disk comes back from the log, and one corrupt collection is quarantined while the
shard serves the others."""

from __future__ import annotations

import asyncio
import itertools
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from meshkit.domain.ids import document_shard
from ragmesh.index.v1 import index_pb2
from tests.support.natsserver import NatsServer, nats_server_binary

from .conftest import cid, random_vectors
from .test_service import Served, chunk, expect_code, make_settings, serve, shutdown, vec

COLLECTION = "docs"


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    if nats_server_binary() is None:
        pytest.skip("nats-server not installed")
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


# Every test works on a shard of its own (its own log subject) of a 200-shard layout.
SHARDS = 200
_shards = iter(range(SHARDS))


def replica_settings(root: Path, server: NatsServer, shard: int, **overrides: Any) -> Any:
    return make_settings(
        root,
        store_log="jetstream",
        nats_url=server.url,
        store_log_poll_s=0.2,
        index_shard=shard,
        index_shard_count=SHARDS,
        index_data_dir=root / "data",
        **overrides,
    )


class Pair:
    """Two replicas of one shard (each its own data dir), as ``ragmesh up`` runs them."""

    def __init__(self, tmp_path: Path, server: NatsServer) -> None:
        self.shard = next(_shards)
        self.roots = [tmp_path / "a", tmp_path / "b"]
        self.server = server
        self.served: list[Served | None] = [None, None]

    async def start(self, i: int) -> Served:
        served = await serve(replica_settings(self.roots[i], self.server, self.shard))
        self.served[i] = served
        return served

    async def stop(self, i: int) -> None:
        served = self.served[i]
        if served is not None:
            await shutdown(served)
            self.served[i] = None

    def stub(self, i: int) -> Any:
        served = self.served[i]
        assert served is not None
        return served.stub


@pytest.fixture
async def pair(tmp_path: Path, nats_server: NatsServer) -> AsyncIterator[Pair]:
    p = Pair(tmp_path, nats_server)
    await p.start(0)
    await p.start(1)
    yield p
    await p.stop(0)
    await p.stop(1)


def replacement(
    doc_id: str, chunks: list[index_pb2.Chunk], fence: int = 0, keep: tuple[str, ...] = ()
) -> Any:
    return index_pb2.DocumentReplacement(
        doc_id=doc_id, upserts=chunks, keep_chunk_ids=list(keep), fence=fence
    )


async def replace(stub: Any, *docs: index_pb2.DocumentReplacement) -> index_pb2.ReplaceDocumentsResponse:
    return await stub.ReplaceDocuments(
        index_pb2.ReplaceDocumentsRequest(collection=COLLECTION, documents=list(docs)), timeout=20
    )


async def listing(stub: Any) -> list[tuple[str, int, list[str]]]:
    out: list[tuple[str, int, list[str]]] = []
    token = ""
    while True:
        reply = await stub.ListDocuments(
            index_pb2.ListDocumentsRequest(collection=COLLECTION, page_size=2, page_token=token), timeout=10
        )
        out.extend((d.doc_id, d.fence, list(d.chunk_ids)) for d in reply.documents)
        token = reply.next_page_token
        if not token:
            return out


async def caught_up(stubs: list[Any], timeout: float = 60.0) -> None:
    """Until every replica reports the same log position for the collection."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        positions = []
        for stub in stubs:
            try:
                stats = await stub.GetStats(index_pb2.GetStatsRequest(collection=COLLECTION), timeout=5)
                positions.append(stats.log_position)
            except grpc.aio.AioRpcError:
                positions.append(-1)
        if len(set(positions)) == 1 and positions[0] > 0:
            return
        assert asyncio.get_running_loop().time() < deadline, positions
        await asyncio.sleep(0.05)


def owned_on(shard: int) -> Callable[[str], str]:
    """Names for documents that ``shard`` owns (meshkit.domain.ids.document_shard): ``name``
    with the first suffix that lands there, so names keep their order."""

    def doc(name: str) -> str:
        return next(
            f"{name}-{k}" for k in itertools.count() if document_shard(f"{name}-{k}", SHARDS) == shard
        )

    return doc


def doc_chunks(doc_id: str, vectors: np.ndarray, first: int, count: int, shard: int) -> list[Any]:
    """Chunks of ``doc_id``, a document ``shard`` owns."""
    assert document_shard(doc_id, SHARDS) == shard
    return [chunk(doc_id, cid(doc_id, i), vectors[i]) for i in range(first, first + count)]


async def test_writes_through_either_replica_reach_both(pair: Pair) -> None:
    vectors = random_vectors(40, seed=3)
    n = pair.shard
    doc = owned_on(n)
    a, b = pair.stub(0), pair.stub(1)
    # Interleaved writes through both replicas, some at once.
    await asyncio.gather(
        replace(a, replacement(doc("d1"), doc_chunks(doc("d1"), vectors, 0, 5, n), fence=1)),
        replace(b, replacement(doc("d2"), doc_chunks(doc("d2"), vectors, 5, 5, n), fence=1)),
        replace(a, replacement(doc("d3"), doc_chunks(doc("d3"), vectors, 10, 5, n), fence=1)),
    )
    edited = doc_chunks(doc("d2"), vectors, 15, 3, n)
    await replace(
        a,
        replacement(doc("d2"), edited, fence=2, keep=(doc_chunks(doc("d2"), vectors, 5, 1, n)[0].chunk_id,)),
    )
    await replace(b, replacement(doc("d3"), [], fence=2))  # a delete: an empty replacement
    await b.Upsert(
        index_pb2.UpsertRequest(collection=COLLECTION, chunks=doc_chunks(doc("d4"), vectors, 20, 2, n))
    )
    await a.Delete(index_pb2.DeleteRequest(collection=COLLECTION, doc_ids=[doc("d1")]))
    await caught_up([a, b])
    first, second = await listing(a), await listing(b)
    assert first == second
    assert [(d, f, len(c)) for d, f, c in first] == [
        (doc("d1"), 1, 0),
        (doc("d2"), 2, 4),
        (doc("d3"), 2, 0),
        (doc("d4"), 0, 2),
    ]
    query = index_pb2.SearchRequest(collection=COLLECTION, vector=vec(vectors[16]), top_k=10)
    hits_a, hits_b = await a.Search(query), await b.Search(query)
    assert [h.chunk_id for h in hits_a.hits] == [h.chunk_id for h in hits_b.hits]
    assert hits_a.hits[0].chunk_id == edited[1].chunk_id


async def test_fences_are_applied_alike_on_every_replica(pair: Pair) -> None:
    vectors = random_vectors(12, seed=5)
    n = pair.shard
    doc = owned_on(n)
    a, b = pair.stub(0), pair.stub(1)
    v5 = doc_chunks(doc("doc"), vectors, 0, 3, n)
    assert (await replace(a, replacement(doc("doc"), v5, fence=5))).upserted == 3
    # A writer whose claim is older (fence 3) is refused on whichever replica it reaches.
    stale = await replace(b, replacement(doc("doc"), doc_chunks(doc("doc"), vectors, 3, 2, n), fence=3))
    assert list(stale.stale_doc_ids) == [doc("doc")] and stale.upserted == 0
    # The same writer retrying (equal fence) is applied again; unfenced writes apply too.
    again = await replace(b, replacement(doc("doc"), v5[:2], fence=5))
    assert list(again.stale_doc_ids) == [] and again.removed == 1
    # A delete (empty replacement) with fence 7 leaves a tombstone that still refuses fence 6.
    await replace(a, replacement(doc("doc"), [], fence=7))
    late = await replace(b, replacement(doc("doc"), v5, fence=6))
    assert list(late.stale_doc_ids) == [doc("doc")]
    unfenced = await replace(a, replacement(doc("other"), doc_chunks(doc("other"), vectors, 6, 2, n)))
    assert unfenced.upserted == 2 and not unfenced.stale_doc_ids
    await caught_up([a, b])
    for stub in (a, b):
        assert await listing(stub) == [
            (doc("doc"), 7, []),
            (doc("other"), 0, sorted(c.chunk_id for c in doc_chunks(doc("other"), vectors, 6, 2, n))),
        ]


async def test_a_replica_with_an_empty_disk_comes_back_from_the_log(pair: Pair) -> None:
    vectors = random_vectors(30, seed=7)
    n = pair.shard
    doc = owned_on(n)
    a = pair.stub(0)
    for i in range(6):
        await replace(
            a, replacement(doc(f"e{i}"), doc_chunks(doc(f"e{i}"), vectors, i * 4, 4, n), fence=i + 1)
        )
    await caught_up([a, pair.stub(1)])
    await pair.stop(1)
    # Written while b is down.
    await replace(a, replacement(doc("e0"), [], fence=20))
    await replace(a, replacement(doc("late"), doc_chunks(doc("late"), vectors, 25, 3, n), fence=1))
    shutil.rmtree(pair.roots[1] / "data")  # disk loss
    b = (await pair.start(1)).stub
    await caught_up([a, b])
    assert await listing(b) == await listing(a)
    assert [d for d, _f, c in await listing(b) if c] == [doc(f"e{i}") for i in range(1, 6)] + [doc("late")]


async def test_a_corrupt_collection_is_quarantined_and_the_shard_serves_the_others(pair: Pair) -> None:
    vectors = random_vectors(10, seed=9)
    n = pair.shard
    doc = owned_on(n)
    a = pair.stub(0)
    await replace(a, replacement(doc("x"), doc_chunks(doc("x"), vectors, 0, 3, n), fence=1))
    other = index_pb2.ReplaceDocumentsRequest(
        collection="other", documents=[replacement(doc("y"), doc_chunks(doc("y"), vectors, 3, 3, n), fence=1)]
    )
    await a.ReplaceDocuments(other, timeout=20)
    await a.Snapshot(index_pb2.SnapshotRequest(collection=COLLECTION))
    await pair.stop(0)
    snapshot = next((pair.roots[0] / "data" / COLLECTION / "snapshots").iterdir())
    with (snapshot / "vectors.npy").open("r+b") as f:  # bit rot in a snapshot
        f.seek(-8, 2)
        f.write(b"\xff" * 8)
    a = (await pair.start(0)).stub
    # The shard started and serves the healthy collection...
    stats = await a.GetStats(index_pb2.GetStatsRequest(collection="other"))
    assert stats.chunks == 3
    # ... and the corrupt one was moved aside, then rebuilt from the log (no object store here).
    quarantined = list((pair.roots[0] / "data" / ".quarantine").iterdir())
    assert len(quarantined) == 1 and "checksum" in (quarantined[0] / "QUARANTINE_REASON").read_text()
    await caught_up([a, pair.stub(1)])
    assert (
        await listing(a)
        == await listing(pair.stub(1))
        == [(doc("x"), 1, sorted(c.chunk_id for c in doc_chunks(doc("x"), vectors, 0, 3, n)))]
    )


async def test_writes_are_refused_while_the_log_is_down_and_reads_go_on(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    server.start()
    served = await serve(replica_settings(tmp_path / "r", server, next(_shards)))
    try:
        vectors = random_vectors(4, seed=1)
        n = served.shard.shard
        doc = owned_on(n)
        await replace(served.stub, replacement(doc("k"), doc_chunks(doc("k"), vectors, 0, 2, n), fence=1))
        server.kill()
        await expect_code(
            replace(served.stub, replacement(doc("k"), doc_chunks(doc("k"), vectors, 2, 2, n), fence=2)),
            grpc.StatusCode.UNAVAILABLE,
            "replicated log did not take the write",
        )
        hits = await served.stub.Search(
            index_pb2.SearchRequest(collection=COLLECTION, vector=vec(vectors[0]), top_k=5)
        )
        assert len(hits.hits) == 2
    finally:
        await shutdown(served)
        server.stop()
