"""Sparse replicas over a real nats-server: writes through either replica reach both, fences are
applied alike, a replica with an empty disk comes back from the log, a corrupt collection is
quarantined while the others serve, and a snapshot copy restores to the same documents."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from meshkit.rpc.server import RunningService, start_service
from meshkit.settings import SparseSettings
from ragmesh.sparse.v1 import sparse_pb2 as pb
from ragmesh.sparse.v1 import sparse_pb2_grpc
from services.sparse.collection import Collection
from services.sparse.records import DocumentUpdate
from services.sparse.servicer import build_spec
from services.sparse.store import SparseStore, _pack, _unpack
from tests.support.natsserver import NatsServer, nats_server_binary

from .conftest import COLLECTION, chunk, open_collection, put
from .test_service import text_chunk


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A server per test: the sparse log is one subject, which two streams cannot share."""
    if nats_server_binary() is None:
        pytest.skip("nats-server not installed")
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server
    server.stop()


class Replica:
    def __init__(self, root: Path, server: NatsServer) -> None:
        self.root = root
        self.settings = SparseSettings(
            port=0,
            log_format="text",
            sparse_data_dir=root,
            sparse_upload_snapshots=False,
            nats_url=server.url,
            store_log_poll_s=0.2,
        )
        self.running: RunningService | None = None
        self.channel: aio.Channel | None = None
        self.store: SparseStore | None = None

    async def start(self) -> Any:
        self.store = SparseStore(self.settings)
        self.running = await start_service(build_spec(self.settings, self.store), self.settings)
        self.channel = aio.insecure_channel(f"127.0.0.1:{self.running.port}")
        return self.stub

    @property
    def stub(self) -> Any:
        assert self.channel is not None
        return sparse_pb2_grpc.SparseServiceStub(self.channel)

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        if self.running is not None:
            await self.running.stop(0)
            self.running = None


@pytest.fixture
async def pair(tmp_path: Path, nats_server: NatsServer) -> AsyncIterator[list[Replica]]:
    replicas = [Replica(tmp_path / "a", nats_server), Replica(tmp_path / "b", nats_server)]
    for replica in replicas:
        await replica.start()
    yield replicas
    for replica in replicas:
        await replica.stop()


def doc(doc_id: str, texts: list[str], fence: int = 0, keep: tuple[str, ...] = ()) -> pb.DocumentReplacement:
    return pb.DocumentReplacement(
        doc_id=doc_id,
        upserts=[text_chunk(COLLECTION, doc_id, t, title=doc_id, ordinal=i) for i, t in enumerate(texts)],
        keep_chunk_ids=list(keep),
        fence=fence,
    )


async def replace(stub: Any, *docs: pb.DocumentReplacement) -> pb.ReplaceDocumentsResponse:
    return await stub.ReplaceDocuments(
        pb.ReplaceDocumentsRequest(collection=COLLECTION, documents=docs), timeout=20
    )


async def listing(stub: Any) -> list[tuple[str, int, list[str]]]:
    out: list[tuple[str, int, list[str]]] = []
    token = ""
    while True:
        reply = await stub.ListDocuments(
            pb.ListDocumentsRequest(collection=COLLECTION, page_size=2, page_token=token), timeout=10
        )
        out.extend((d.doc_id, d.fence, list(d.chunk_ids)) for d in reply.documents)
        token = reply.next_page_token
        if not token:
            return out


async def caught_up(stubs: list[Any], timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        positions = []
        for stub in stubs:
            try:
                positions.append(
                    (await stub.GetStats(pb.GetStatsRequest(collection=COLLECTION))).log_position
                )
            except aio.AioRpcError:
                positions.append(-1)
        if len(set(positions)) == 1 and positions[0] > 0:
            return
        assert asyncio.get_running_loop().time() < deadline, positions
        await asyncio.sleep(0.05)


async def test_writes_through_either_replica_reach_both_with_fences(pair: list[Replica]) -> None:
    a, b = pair[0].stub, pair[1].stub
    await asyncio.gather(
        replace(a, doc("d1", ["ragmesh one alpha", "ragmesh one beta"], fence=1)),
        replace(b, doc("d2", ["ragmesh two gamma"], fence=1)),
    )
    again = await replace(b, doc("d1", ["ragmesh one alpha", "ragmesh one beta"], fence=1))
    assert not again.stale_doc_ids and again.upserted == 2  # equal fence: a retry, applied again
    unfenced = await replace(a, doc("d2", ["from an unfenced writer"], fence=0))
    assert not unfenced.stale_doc_ids  # unfenced: applied, the stored fence stays
    await replace(a, doc("d2", ["ragmesh two again"], fence=4))
    older = await replace(b, doc("d2", ["late writer"], fence=3))
    assert list(older.stale_doc_ids) == ["d2"] and older.upserted == 0
    await replace(b, doc("d1", [], fence=9))  # delete: a tombstone with fence 9
    assert (await b.Delete(pb.DeleteRequest(collection=COLLECTION, doc_ids=["nope"]))).removed == 0
    await caught_up([a, b])
    first, second = await listing(a), await listing(b)
    assert first == second
    assert [(d, f, len(c)) for d, f, c in first] == [("d1", 9, 0), ("d2", 4, 1)]
    hits_a = await a.SearchBm25(pb.SearchBm25Request(collection=COLLECTION, query="two again", top_k=5))
    hits_b = await b.SearchBm25(pb.SearchBm25Request(collection=COLLECTION, query="two again", top_k=5))
    assert [h.chunk_id for h in hits_a.hits] == [h.chunk_id for h in hits_b.hits] == first[1][2]


async def test_a_replica_with_an_empty_disk_comes_back_from_the_log(pair: list[Replica]) -> None:
    a = pair[0].stub
    for i in range(5):
        await replace(a, doc(f"e{i}", [f"ragmesh entry {i}", f"ragmesh more {i}"], fence=1))
    await pair[1].stop()
    await replace(a, doc("e0", [], fence=2))
    shutil.rmtree(pair[1].root)
    b = await pair[1].start()
    await caught_up([a, b])
    assert await listing(a) == await listing(b)
    chunks = await b.GetChunks(pb.GetChunksRequest(collection=COLLECTION, chunk_ids=(await listing(b))[1][2]))
    assert {c.text for c in chunks.chunks} == {"ragmesh entry 1", "ragmesh more 1"}


async def test_a_corrupt_collection_is_quarantined_and_rebuilt_from_the_log(pair: list[Replica]) -> None:
    a = pair[0].stub
    await replace(a, doc("x", ["ragmesh x text"], fence=1))
    other = pb.ReplaceDocumentsRequest(collection="other", documents=[doc("y", ["ragmesh y text"], fence=1)])
    await a.ReplaceDocuments(other, timeout=20)
    await pair[0].stop()
    (pair[0].root / COLLECTION / "index" / "meta.json").write_text("{ not json")
    a = await pair[0].start()
    stats = await a.GetStats(pb.GetStatsRequest(collection="other"))
    assert stats.chunks == 1
    reasons = [p / "QUARANTINE_REASON" for p in (pair[0].root / ".quarantine").iterdir()]
    assert len(reasons) == 1 and reasons[0].read_text()
    await caught_up([a, pair[1].stub])
    assert await listing(a) == await listing(pair[1].stub)
    assert [d for d, _f, _c in await listing(a)] == ["x"]


async def test_quarantined_collection_answers_unavailable_with_the_reason(tmp_path: Path) -> None:
    settings = SparseSettings(port=0, log_format="text", sparse_data_dir=tmp_path, store_log="local")
    store = SparseStore(settings)
    await store.start()
    try:
        await store.quarantine("broken", "its local data does not load", "/secret/path: checksum mismatch")
        with pytest.raises(Exception) as err:
            store.get("broken")
        assert getattr(err.value, "code", None) == grpc.StatusCode.UNAVAILABLE
        assert "its local data does not load" in str(err.value)
        assert "/secret/path" not in str(err.value)  # internals stay in the log
    finally:
        await store.stop()


def test_snapshot_copy_restores_the_same_documents(tmp_path: Path) -> None:
    source = open_collection(tmp_path / "src")
    first, second = chunk("d1", "ragmesh alpha"), chunk("d2", "ragmesh beta")
    put(source, "d1", first)
    put(source, "d2", second)
    copy = tmp_path / "copy"
    covered = source.copy_for_snapshot(copy, lambda: 42, "LOG")
    put(source, "d3", chunk("d3", "ragmesh after the copy"))  # writes go on after the copy
    assert covered == 42
    archive = tmp_path / "snap.tar"
    _pack(copy, archive)
    restored_dir = tmp_path / "dst" / COLLECTION
    restored_dir.mkdir(parents=True)
    _unpack(archive, restored_dir)
    restored = Collection.open(tmp_path / "dst", COLLECTION, 32 * 1024 * 1024, 1.5)
    assert restored.write_chunk_files() == 2
    assert (restored.log_position, restored.snapshot_log_id) == (42, "LOG")
    assert [(e.doc_id, e.chunk_ids) for e in restored.list_documents("", 10)] == [
        ("d1", [first.chunk_id]),
        ("d2", [second.chunk_id]),
    ]
    assert sorted(restored.files.chunk_ids()) == sorted([first.chunk_id, second.chunk_id])


def test_an_entry_applied_again_after_a_crash_changes_nothing(tmp_path: Path) -> None:
    """The state is written right after tantivy's commit: a crash in between leaves it one entry
    behind, and that entry is applied again on restart. Doing so must change nothing."""
    collection = open_collection(tmp_path)
    old, kept = chunk("d", "ragmesh old part"), chunk("d", "ragmesh kept part")
    put(collection, "d", old, kept)
    new = chunk("d", "ragmesh new part")
    entry = [DocumentUpdate("d", [new], [kept.chunk_id, "f" * 32], fence=3)]
    first = collection.replace_documents(entry, pos=7)
    before = (collection.stats(), collection.list_documents("", 10), collection.files.chunk_ids())
    collection.state.set_log("", 6)  # as if the crash came before the state was written
    again = collection.replace_documents(entry, pos=7)
    assert (first.upserted, first.removed, first.missing_chunk_ids) == (1, 1, ["f" * 32])
    assert (again.upserted, again.removed, again.missing_chunk_ids) == (1, 0, ["f" * 32])
    assert (collection.stats(), collection.list_documents("", 10), sorted(collection.files.chunk_ids())) == (
        before[0],
        before[1],
        sorted(before[2]),
    )
    assert collection.log_position == 7
