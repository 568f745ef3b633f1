"""Replicas of the stateful stores on a real stack: 2 index shards with 2 replicas each, 2 sparse
replicas, NATS, SeaweedFS, the embedder, the ingestion API and a worker, with the shipped
settings (nothing shortened).

- every replica of every store ends up with the same documents, fences and chunk ids, whichever
  replica each write reached;
- a replica killed (SIGKILL) while writes go on catches up when it is back;
- a replica whose disk is lost comes back from its snapshot in the object store plus the log,
  without losing what was written after the snapshot;
- a corrupt collection does not stop its replica from starting: it is quarantined, the other
  collections are served, and it is restored from the object store and the log.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from ragmesh_cli.stack import Stack

from .meshclients import Mesh
from .test_ingest import DELETED, INDEXED, new_collection

pytestmark = pytest.mark.integration

SERVICES = ["embedder", "index", "sparse", "ingestion", "worker"]
SHARDS = 2
CONVERGE_S = 90.0
TOPICS = ["basalt columns", "sourdough bread", "tidal pools", "glacier caves", "dune fields", "coral reefs"]

View = tuple[int, int, tuple[tuple[str, int, tuple[str, ...]], ...] | None]


def doc_text(doc_id: str, version: int) -> str:
    """Several chunks, each saying which document and version it is."""
    sections = [
        f"## Part {k}\n\nThis ragmesh note {doc_id} v{version} part {k} is about "
        f"{TOPICS[(k + version) % len(TOPICS)]}. " + "It goes on for a while. " * 40
        for k in range(3)
    ]
    return f"# {doc_id}\n\n" + "\n\n".join(sections)


@pytest.fixture(scope="module")
def store_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("replicas"),
        workers=1,
        index_shards=SHARDS,
        services=SERVICES,
        extra_env={"RAGMESH_LOG_LEVEL": "INFO"},
        replicas={"index": 2, "sparse": 2},
        health_timeout_s=120.0,
    ) as stack:
        yield stack


@pytest.fixture
async def mesh(store_stack: Stack) -> AsyncIterator[Mesh]:
    clients = Mesh(store_stack)
    yield clients
    await clients.close()


class Replicas:
    """A channel to every replica of every store."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self._channels: dict[str, aio.Channel] = {}

    def channel(self, name: str) -> aio.Channel:
        if name not in self._channels:
            self._channels[name] = aio.insecure_channel(self.stack.address(name))
        return self._channels[name]

    def index(self, name: str) -> index_pb2_grpc.IndexServiceStub:
        return index_pb2_grpc.IndexServiceStub(self.channel(name))

    def sparse(self, name: str) -> sparse_pb2_grpc.SparseServiceStub:
        return sparse_pb2_grpc.SparseServiceStub(self.channel(name))

    def groups(self) -> dict[str, list[str]]:
        """Store (index shard n, sparse) -> its replicas' component names."""
        out = {f"index shard {i}": [c.name for c in self.stack.shard_replicas(i)] for i in range(SHARDS)}
        out["sparse"] = [n for n in self.stack.names() if self.stack.component(n).kind == "sparse"]
        return out

    async def view(self, name: str, collection: str) -> View | str:
        """(chunks, documents, listing) of one replica, or why it has none."""
        is_index = self.stack.component(name).kind == "index"
        stub: Any = self.index(name) if is_index else self.sparse(name)
        pb: Any = index_pb2 if is_index else sparse_pb2
        try:
            stats = await stub.GetStats(pb.GetStatsRequest(collection=collection), timeout=10)
        except aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return stats.chunks, stats.documents, await self._listing(stub, pb, collection)

    @staticmethod
    async def _listing(
        stub: Any, pb: Any, collection: str
    ) -> tuple[tuple[str, int, tuple[str, ...]], ...] | None:
        out: list[tuple[str, int, tuple[str, ...]]] = []
        token = ""
        while True:
            try:
                reply = await stub.ListDocuments(
                    pb.ListDocumentsRequest(collection=collection, page_token=token), timeout=30
                )
            except aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return None  # a build without ListDocuments: the counts still compare
                raise
            out.extend((d.doc_id, d.fence, tuple(d.chunk_ids)) for d in reply.documents)
            token = reply.next_page_token
            if not token:
                return tuple(out)

    async def converged(self, collection: str, timeout: float = CONVERGE_S) -> dict[str, View]:
        """Until the replicas of each store agree; returns each store's view."""
        deadline = time.monotonic() + timeout
        while True:
            views = {
                store: [await self.view(n, collection) for n in names]
                for store, names in self.groups().items()
            }
            differ = {
                store: dict(zip(self.groups()[store], [_summary(v) for v in vs], strict=True))
                for store, vs in views.items()
                if any(v != vs[0] for v in vs) or isinstance(vs[0], str)
            }
            if not differ:
                return {store: vs[0] for store, vs in views.items() if not isinstance(vs[0], str)}
            if time.monotonic() > deadline:
                raise AssertionError(f"replicas of a store still differ after {timeout:.0f}s: {differ}")
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


def _summary(view: View | str) -> Any:
    if isinstance(view, str):
        return view
    chunks, documents, listing = view
    return {"chunks": chunks, "documents": documents, "listed": None if listing is None else len(listing)}


@pytest.fixture
async def replicas(store_stack: Stack) -> AsyncIterator[Replicas]:
    r = Replicas(store_stack)
    yield r
    await r.close()


async def ingest(mesh: Mesh, collection: str, versions: dict[str, int]) -> None:
    docs = [(d, doc_text(d, v)) for d, v in versions.items()]
    for i in range(0, len(docs), 8):
        await mesh.ingest(collection, docs[i : i + 8])
    statuses = await mesh.wait_settled(collection, list(versions), timeout=240)
    bad = {d: ingestion_pb2.DocumentState.Name(s.state) for d, s in statuses.items() if s.state != INDEXED}
    assert not bad, bad


async def delete(mesh: Mesh, collection: str, doc_ids: list[str]) -> None:
    await mesh.ingestion.DeleteDocuments(
        ingestion_pb2.DeleteDocumentsRequest(collection=collection, doc_ids=doc_ids), timeout=30
    )
    await mesh.wait_settled(collection, doc_ids, timeout=240, want=DELETED)


async def assert_stores_hold(
    mesh: Mesh, views: dict[str, View], collection: str, live: list[str], gone: list[str]
) -> None:
    """The converged stores hold exactly the live documents, in their last version."""
    statuses = await mesh.statuses(collection, live)
    chunks = sum(s.chunks for s in statuses.values())
    index_chunks = sum(views[f"index shard {i}"][0] for i in range(SHARDS))
    assert (index_chunks, views["sparse"][0], views["sparse"][1]) == (chunks, chunks, len(live))
    listing = views["sparse"][2]
    if listing is not None:
        with_chunks = {d for d, _f, c in listing if c}
        assert with_chunks == set(live) and not with_chunks & set(gone)
        all_ids = [c for _d, _f, ids in listing for c in ids]
        assert len(all_ids) == len(set(all_ids)), "a chunk id is held twice"


async def test_every_replica_of_every_store_holds_the_same_documents(mesh: Mesh, replicas: Replicas) -> None:
    collection = new_collection()
    docs = {f"doc-{i:02d}.md": 1 for i in range(12)}
    await ingest(mesh, collection, docs)
    # Edits and deletes spread over the replicas like the first writes.
    await ingest(mesh, collection, {d: 2 for d in list(docs)[:4]})
    await delete(mesh, collection, list(docs)[9:])
    views = await replicas.converged(collection)
    await assert_stores_hold(mesh, views, collection, list(docs)[:9], list(docs)[9:])
    hits = await mesh.bm25(collection, "ragmesh note doc-00.md v2", top_k=5)
    assert hits and hits[0].doc_id == "doc-00.md"


async def test_a_killed_replica_catches_up(mesh: Mesh, replicas: Replicas, store_stack: Stack) -> None:
    collection = new_collection()
    docs = {f"k-{i:02d}.md": 1 for i in range(6)}
    await ingest(mesh, collection, docs)
    victims = ["index-0-2", "sparse-2"]
    for name in victims:
        store_stack.kill(name, signal.SIGKILL)
    # Writes go on: callers retry on the live replica of each store.
    more = {f"k-{i:02d}.md": 2 for i in range(3, 10)}
    await ingest(mesh, collection, more)
    await delete(mesh, collection, ["k-00.md"])
    for name in victims:
        await asyncio.to_thread(store_stack.start, name)
    views = await replicas.converged(collection)
    live = sorted((set(docs) | set(more)) - {"k-00.md"})
    await assert_stores_hold(mesh, views, collection, live, ["k-00.md"])


async def test_a_replica_that_lost_its_disk_comes_back_with_every_write(
    mesh: Mesh, replicas: Replicas, store_stack: Stack
) -> None:
    collection = new_collection()
    first = {f"s-{i:02d}.md": 1 for i in range(6)}
    await ingest(mesh, collection, first)
    # Snapshots of the first writes reach the object store: the index one on request, the sparse
    # one from a graceful stop (each store also snapshots on its own timer).
    for shard in range(SHARDS):
        reply = await replicas.index(f"index-{shard}-2").Snapshot(
            index_pb2.SnapshotRequest(collection=collection), timeout=60
        )
        assert reply.uploaded
    await asyncio.to_thread(store_stack.stop, "sparse-2")
    await asyncio.to_thread(store_stack.start, "sparse-2")
    # Written after the snapshots: only the log has it when the disk is lost.
    later = {f"s-{i:02d}.md": 2 for i in range(3, 9)}
    await ingest(mesh, collection, later)
    await delete(mesh, collection, ["s-00.md"])
    victims = ["index-1-2", "sparse-2"]
    for name in victims:
        store_stack.kill(name, signal.SIGKILL)
        shutil.rmtree(store_stack.state_dir / name)
    for name in victims:
        await asyncio.to_thread(store_stack.start, name)
    views = await replicas.converged(collection)
    live = sorted((set(first) | set(later)) - {"s-00.md"})
    await assert_stores_hold(mesh, views, collection, live, ["s-00.md"])
    for name in victims:
        log_text = store_stack.log_path(name).read_text()
        assert "collection restored from the object store" in log_text, f"{name} did not restore a snapshot"


async def test_a_corrupt_collection_is_quarantined_and_the_shard_serves_the_others(
    mesh: Mesh, replicas: Replicas, store_stack: Stack
) -> None:
    bad, good = new_collection(), new_collection()
    bad_docs = [f"b-{i}.md" for i in range(4)]
    await ingest(mesh, bad, dict.fromkeys(bad_docs, 1))
    await ingest(mesh, good, {f"g-{i}.md": 1 for i in range(4)})
    victims = ["index-0-2", "sparse-2"]
    for name in victims:
        await asyncio.to_thread(store_stack.stop, name)  # graceful: writes its snapshots
    _corrupt_index_snapshot(store_stack.state_dir / "index-0-2" / bad)
    (store_stack.state_dir / "sparse-2" / bad / "index" / "meta.json").write_text("{ not json")
    for name in victims:
        await asyncio.to_thread(store_stack.start, name)  # starts and reports SERVING
    for name in victims:
        quarantined = store_stack.state_dir / name / ".quarantine"
        reasons = [p / "QUARANTINE_REASON" for p in quarantined.iterdir() if p.name.startswith(bad)]
        assert len(reasons) == 1 and reasons[0].read_text(), f"{name} did not quarantine {bad}"
        view = await replicas.view(name, good)
        assert not isinstance(view, str) and view[0] > 0, f"{name} does not serve {good}: {view}"
    # Restored from the object store and the log: the replicas agree again, on every write.
    await assert_stores_hold(mesh, await replicas.converged(bad), bad, bad_docs, [])


def _corrupt_index_snapshot(collection_dir: Path) -> None:
    snapshot = collection_dir / (collection_dir / "CURRENT").read_text().strip()
    with (snapshot / "vectors.npy").open("r+b") as f:
        f.seek(-16, 2)
        f.write(b"\xff" * 16)
