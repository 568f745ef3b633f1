"""Sparse shards over a real nats-server: each shard takes only the documents it owns
(meshkit.domain.ids.document_shard), keeps them on its own log subject, and refuses log entries
written for another shard count."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from meshkit.domain.ids import document_shard
from meshkit.settings import SparseSettings
from ragmesh.sparse.v1 import sparse_pb2 as pb
from services.sparse.store import (
    SparseStore,
    encode_delete,
    encode_replace,
    snapshot_prefix,
    split_layout,
)
from tests.support.natsserver import NatsServer, nats_server_binary

from .conftest import COLLECTION
from .test_replication import Replica, caught_up, doc, listing, replace

SHARDS = 2


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    if nats_server_binary() is None:
        pytest.skip("nats-server not installed")
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server
    server.stop()


def shard_settings(root: Path, server: NatsServer, shard: int, count: int = SHARDS) -> SparseSettings:
    return SparseSettings(
        port=0,
        log_format="text",
        sparse_data_dir=root,
        sparse_upload_snapshots=False,
        nats_url=server.url,
        store_log_poll_s=0.2,
        sparse_shard=shard,
        sparse_shard_count=count,
    )


@pytest.fixture
async def shards(tmp_path: Path, nats_server: NatsServer) -> AsyncIterator[list[Replica]]:
    replicas = []
    for shard in range(SHARDS):
        replica = Replica(tmp_path / f"s{shard}", nats_server)
        replica.settings = shard_settings(tmp_path / f"s{shard}", nats_server, shard)
        await replica.start()
        replicas.append(replica)
    yield replicas
    for replica in replicas:
        await replica.stop()


def owned_by(shard: int, count: int = 6) -> list[str]:
    names = (f"doc-{i}.md" for i in range(1000))
    return [name for name in names if document_shard(name, SHARDS) == shard][:count]


async def test_each_shard_takes_only_its_documents(shards: list[Replica]) -> None:
    for number, replica in enumerate(shards):
        await replace(replica.stub, *(doc(d, [f"{d} about basalt"]) for d in owned_by(number)))
    for number, replica in enumerate(shards):
        await caught_up([replica.stub])
        assert [d for d, _, _ in await listing(replica.stub)] == sorted(owned_by(number))
        # A document the other shard owns is refused whole, and leaves nothing behind.
        stranger = owned_by(1 - number)[0]
        with pytest.raises(aio.AioRpcError) as err:
            await replace(replica.stub, doc(owned_by(number)[0], ["mine"]), doc(stranger, ["not mine"]))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"belongs to sparse shard {1 - number} of {SHARDS}" in (err.value.details() or "")
        with pytest.raises(aio.AioRpcError) as err:
            await replica.stub.Delete(pb.DeleteRequest(collection=COLLECTION, doc_ids=[stranger]), timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        hits = await replica.stub.SearchBm25(
            pb.SearchBm25Request(collection=COLLECTION, query="mine basalt", top_k=50), timeout=10
        )
        assert {h.doc_id for h in hits.hits} == set(owned_by(number))


def test_entries_carry_their_layout_and_another_one_is_refused(tmp_path: Path) -> None:
    request = pb.ReplaceDocumentsRequest(collection=COLLECTION, documents=[doc("a.md", ["x"])])
    # One shard writes what every replica wrote before sparse was sharded.
    assert split_layout(encode_replace(request)) == (1, encode_replace(request))
    sharded = encode_replace(request, 3)
    count, rest = split_layout(sharded)
    assert count == 3 and rest == encode_replace(request)
    assert split_layout(encode_delete(pb.DeleteRequest(collection=COLLECTION, doc_ids=["a.md"]), 2))[0] == 2

    settings = SparseSettings(
        sparse_data_dir=tmp_path, store_log="local", sparse_upload_snapshots=False, sparse_shard_count=2
    )
    store = SparseStore(settings)
    assert store.decode(encode_replace(request, 2)).collection == COLLECTION
    for other in (encode_replace(request), encode_replace(request, 3)):
        with pytest.raises(ValueError, match="this layout has 2"):
            store.decode(other)


def test_one_shard_keeps_the_layout_of_an_unsharded_store(tmp_path: Path) -> None:
    assert snapshot_prefix(0, 1) == "sparse/"
    assert snapshot_prefix(1, 2) == "sparse/shard-1-of-2/"
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        SparseStore(
            SparseSettings(sparse_data_dir=tmp_path, store_log="local", sparse_shard=2, sparse_shard_count=2)
        )
