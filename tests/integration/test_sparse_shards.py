"""Sparse shards on a real stack: two sparse shards (with the shipped settings), one index shard,
the embedder, the ingestion API, a worker and the gateway.

- every document lives on exactly the sparse shard meshkit.domain.ids.document_shard names, with
  all its chunks, and both shards hold some;
- a gateway search merges both shards' BM25 and exact hits and hydrates results from both;
- a deleted document leaves its shard;
- a write that names a document another shard owns is refused with FAILED_PRECONDITION;
- a sparse shard that is down is a typed degradation: the search still answers, from the other
  shard and the dense leg, and it does not report the down shard's words as unknown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from grpc import aio

from meshkit.domain.ids import document_shard
from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from ragmesh_cli.stack import Stack

from .meshclients import Mesh
from .test_ingest import DELETED, new_collection

pytestmark = pytest.mark.integration

SERVICES = ["embedder", "index", "sparse", "ingestion", "worker", "gateway"]
SHARDS = 2
# Each document names a rare word of its own, so that a BM25 search finds it wherever it lives.
DOCS = [(f"note-{i}.md", f"zork{i:02d}") for i in range(12)]


def doc_text(doc_id: str, word: str) -> str:
    sections = [
        f"## Part {k}\n\nThis ragmesh note {doc_id} part {k} is about {word} and basalt columns. "
        + "It goes on for a while. " * 30
        for k in range(2)
    ]
    return f"# {doc_id}\n\n" + "\n\n".join(sections)


@pytest.fixture(scope="module")
def sharded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("sparse-shards"),
        workers=1,
        services=SERVICES,
        sparse_shards=SHARDS,
        health_timeout_s=120.0,
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
async def corpus(sharded_stack: Stack) -> AsyncIterator[str]:
    mesh = Mesh(sharded_stack)
    collection = new_collection()
    try:
        await mesh.ingest(collection, [(doc_id, doc_text(doc_id, word)) for doc_id, word in DOCS])
        await mesh.wait_settled(collection, [doc_id for doc_id, _ in DOCS], timeout=240)
    finally:
        await mesh.close()
    yield collection


@pytest.fixture
async def mesh(sharded_stack: Stack) -> AsyncIterator[Mesh]:
    clients = Mesh(sharded_stack)
    yield clients
    await clients.close()


async def documents_on(shard: sparse_pb2_grpc.SparseServiceStub, collection: str) -> set[str]:
    try:
        reply = await shard.ListDocuments(
            sparse_pb2.ListDocumentsRequest(collection=collection, page_size=1000), timeout=10
        )
    except aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return set()
        raise
    # A deleted document keeps its fence (a late write cannot bring it back) but no chunks.
    return {d.doc_id for d in reply.documents if d.chunk_ids}


def search_request(collection: str, query: str, **fields: object) -> gateway_pb2.SearchRequest:
    return gateway_pb2.SearchRequest(collection=collection, query=query, top_k=10, rerank=False, **fields)


async def test_every_document_lives_on_the_shard_that_owns_it(mesh: Mesh, corpus: str) -> None:
    assert len(mesh.sparse_shards) == SHARDS
    held = [await documents_on(shard, corpus) for shard in mesh.sparse_shards]
    assert all(held), f"both shards should hold documents of 12, got {[len(h) for h in held]}"
    assert set().union(*held) == {doc_id for doc_id, _ in DOCS}
    for number, docs in enumerate(held):
        assert {document_shard(d, SHARDS) for d in docs} == {number}
    chunks = [
        (await shard.GetStats(sparse_pb2.GetStatsRequest(collection=corpus), timeout=10)).chunks
        for shard in mesh.sparse_shards
    ]
    assert sum(chunks) == await mesh.index_chunks(corpus)


async def test_gateway_search_merges_both_shards(mesh: Mesh, corpus: str, sharded_stack: Stack) -> None:
    gateway = gateway_pb2_grpc.GatewayServiceStub(mesh.channel("gateway"))
    found_on: set[int] = set()
    for doc_id, word in DOCS:
        reply = await gateway.Search(search_request(corpus, word), timeout=20)
        assert not reply.degradations, reply.degradations
        assert reply.results[0].doc_id == doc_id
        assert reply.results[0].text, "the result is hydrated from its shard"
        found_on.add(document_shard(doc_id, SHARDS))
    assert found_on == set(range(SHARDS))
    # One query whose hits come from both shards: BM25 and exact lists are merged, not one shard's.
    both = [DOCS[i] for i in range(len(DOCS)) if document_shard(DOCS[i][0], SHARDS) == 0][:1] + [
        DOCS[i] for i in range(len(DOCS)) if document_shard(DOCS[i][0], SHARDS) == 1
    ][:1]
    query = " ".join(word for _, word in both)
    reply = await gateway.Search(search_request(corpus, query), timeout=20)
    # Each document has two chunks with its word: the first two documents are those two.
    ranked = list(dict.fromkeys(r.doc_id for r in reply.results))
    assert set(ranked[:2]) == {doc_id for doc_id, _ in both}, ranked
    assert not reply.unknown_terms


async def test_a_write_to_the_wrong_shard_is_refused(mesh: Mesh, corpus: str) -> None:
    doc_id = next(d for d, _ in DOCS if document_shard(d, SHARDS) == 1)
    wrong = mesh.sparse_shards[0]
    request = sparse_pb2.ReplaceDocumentsRequest(
        collection=corpus,
        documents=[
            sparse_pb2.DocumentReplacement(
                doc_id=doc_id,
                upserts=[sparse_pb2.ChunkText(chunk_id="f" * 32, doc_id=doc_id, text="misplaced")],
            )
        ],
    )
    with pytest.raises(aio.AioRpcError) as err:
        await wrong.ReplaceDocuments(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "belongs to sparse shard 1 of 2" in (err.value.details() or "")
    assert doc_id not in await documents_on(wrong, corpus)


async def test_delete_leaves_the_owning_shard(mesh: Mesh) -> None:
    collection = new_collection()
    names = ["a.md", "b.md", "c.md", "d.md"]
    await mesh.ingest(collection, [(n, doc_text(n, "quartzite")) for n in names])
    await mesh.wait_settled(collection, names)
    gone = names[0]
    await mesh.ingestion.DeleteDocuments(
        ingestion_pb2.DeleteDocumentsRequest(collection=collection, doc_ids=[gone]), timeout=10
    )
    await mesh.wait_settled(collection, [gone], want=DELETED)
    held = [await documents_on(shard, collection) for shard in mesh.sparse_shards]
    assert set().union(*held) == set(names[1:])


async def test_a_shard_down_is_a_degradation_not_a_failure(
    mesh: Mesh, corpus: str, sharded_stack: Stack
) -> None:
    gateway = gateway_pb2_grpc.GatewayServiceStub(mesh.channel("gateway"))
    down = 1
    name = sharded_stack.shard_replicas(down, "sparse")[0].name
    lost_doc, lost_word = next((d, w) for d, w in DOCS if document_shard(d, SHARDS) == down)
    kept_doc, kept_word = next((d, w) for d, w in DOCS if document_shard(d, SHARDS) != down)
    await asyncio.to_thread(sharded_stack.stop, name)
    try:
        reply = await gateway.Search(search_request(corpus, f"{kept_word} {lost_word}"), timeout=20)
        assert reply.results, "the other shard and the dense leg still answer"
        assert kept_doc in {r.doc_id for r in reply.results}
        assert [d.stage for d in reply.degradations] == [gateway_pb2.STAGE_SPARSE], reply.degradations
        assert f"sparse-{down}:" in reply.degradations[0].message
        # The down shard may hold the word: it is not reported unknown.
        assert lost_word not in reply.unknown_terms
    finally:
        await asyncio.to_thread(sharded_stack.start, name)
    # Back once the gateway's breaker for the shard lets a trial call through.
    deadline = time.monotonic() + 60
    while True:
        healed = await gateway.Search(search_request(corpus, lost_word), timeout=20)
        if not healed.degradations or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    assert not healed.degradations and healed.results[0].doc_id == lost_doc
