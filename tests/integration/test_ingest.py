"""The write path end to end on real servers: nats-server (JetStream), SeaweedFS (S3), and
every ragmesh service as its own process, all on loopback ports the session picked."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio

from meshkit.domain.ids import doc_id_problem
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2
from ragmesh_cli.stack import Stack

from .meshclients import MD, PDF, Mesh, replicas_of

pytestmark = pytest.mark.integration

INDEXED = ingestion_pb2.DOCUMENT_STATE_INDEXED
FAILED = ingestion_pb2.DOCUMENT_STATE_FAILED
DELETED = ingestion_pb2.DOCUMENT_STATE_DELETED


def section_doc(*bodies: str) -> str:
    """A Markdown document whose sections are each long enough to be their own chunk."""
    parts = []
    for i, body in enumerate(bodies):
        filler = " ".join(f"{body} ragmesh sentence {j} about section {i}." for j in range(18))
        parts.append(f"## Section {i}\n\n{filler}\n")
    return "\n".join(parts)


def new_collection() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def mesh(stack: Stack) -> AsyncIterator[Mesh]:
    clients = Mesh(stack)
    yield clients
    await clients.close()


async def test_ingested_document_is_searchable_in_index_and_sparse(mesh: Mesh) -> None:
    collection = new_collection()
    docs = [
        (
            "volcano.md",
            "# Volcanoes\n\nMagma chambers erupt through vents as lava; ragmesh notes basalt flows.",
        ),
        ("bread.md", "# Baking\n\nSourdough bread needs a starter culture and a long ragmesh fermentation."),
    ]
    reply = await mesh.ingest(collection, docs)
    assert [r.outcome for r in reply.results] == [ingestion_pb2.SUBMIT_OUTCOME_QUEUED] * 2
    statuses = await mesh.wait_settled(collection, ["volcano.md", "bread.md"])
    assert {s.state for s in statuses.values()} == {INDEXED}

    dense = await mesh.dense_search(collection, "how does lava come out of a mountain")
    assert dense[0].doc_id == "volcano.md"
    bm25 = await mesh.bm25(collection, "sourdough starter")
    assert bm25[0].doc_id == "bread.md"
    chunks = await mesh.sparse.GetChunks(
        sparse_pb2.GetChunksRequest(collection=collection, chunk_ids=[bm25[0].chunk_id]), timeout=10
    )
    assert "Sourdough" in chunks.chunks[0].text


async def test_unchanged_reingest_embeds_nothing_and_edit_embeds_only_changed_chunks(mesh: Mesh) -> None:
    collection = new_collection()
    original = section_doc("alpha", "bravo", "charlie")
    await mesh.ingest(collection, [("doc.md", original)])
    first = (await mesh.wait_settled(collection, ["doc.md"]))["doc.md"]
    assert first.state == INDEXED and first.chunks == 3
    before_chunks = {h.chunk_id for h in await mesh.sparse_chunks_of(collection, "doc.md")}
    assert len(before_chunks) == 3

    embedded = mesh.stage_metric("embedder", "ragmesh_embedder_texts_total")
    reply = await mesh.ingest(collection, [("doc.md", original)])
    assert reply.results[0].outcome == ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED
    assert mesh.stage_metric("embedder", "ragmesh_embedder_texts_total") == embedded

    edited = section_doc("alpha", "bravo-changed", "charlie")
    await mesh.ingest(collection, [("doc.md", edited)])
    await asyncio.sleep(0.2)
    second = (await mesh.wait_settled(collection, ["doc.md"]))["doc.md"]
    assert second.state == INDEXED and second.content_sha256 != first.content_sha256
    assert mesh.stage_metric("embedder", "ragmesh_embedder_texts_total") == embedded + 1

    after_chunks = {h.chunk_id for h in await mesh.sparse_chunks_of(collection, "doc.md")}
    assert len(after_chunks) == 3 and len(after_chunks & before_chunks) == 2
    stale = before_chunks - after_chunks
    got = await mesh.sparse.GetChunks(
        sparse_pb2.GetChunksRequest(collection=collection, chunk_ids=list(stale)), timeout=10
    )
    assert not got.chunks, "the stale chunk must be gone from the sparse store"
    assert await mesh.index_chunks(collection) == 3
    assert (await mesh.bm25(collection, "changed"))[0].doc_id == "doc.md"


async def test_delete_removes_every_chunk_everywhere(mesh: Mesh) -> None:
    collection = new_collection()
    await mesh.ingest(
        collection, [("keep.md", section_doc("kept")), ("drop.md", section_doc("dropped", "x"))]
    )
    await mesh.wait_settled(collection, ["keep.md", "drop.md"])
    assert await mesh.index_chunks(collection) == 3

    await mesh.ingestion.DeleteDocuments(
        ingestion_pb2.DeleteDocumentsRequest(collection=collection, doc_ids=["drop.md"]), timeout=10
    )
    status = (await mesh.wait_settled(collection, ["drop.md"], want=DELETED))["drop.md"]
    assert status.state == DELETED
    assert await mesh.index_chunks(collection) == 1
    assert (await mesh.sparse_stats(collection)).documents == 1
    assert await mesh.sparse_chunks_of(collection, "drop.md") == []
    assert {h.doc_id for h in await mesh.dense_search(collection, "dropped")} == {"keep.md"}

    with pytest.raises(aio.AioRpcError) as err:
        await mesh.ingestion.DeleteDocuments(
            ingestion_pb2.DeleteDocumentsRequest(collection=collection, doc_ids=["drop.md"]), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def assert_exactly_once(mesh: Mesh, collection: str, doc_ids: list[str]) -> None:
    statuses = await mesh.wait_settled(collection, doc_ids, timeout=240)
    assert {s.state for s in statuses.values()} == {INDEXED}
    expected = sum(s.chunks for s in statuses.values())
    assert await mesh.index_chunks(collection) == expected
    sparse = await mesh.sparse_stats(collection)
    assert (sparse.chunks, sparse.documents) == (expected, len(doc_ids))


async def test_worker_killed_mid_document_finishes_after_restart(mesh: Mesh, stack: Stack) -> None:
    collection = new_collection()
    doc_ids = [f"bulk-{i:03d}.md" for i in range(120)]
    await mesh.ingest(collection, [(d, section_doc(f"topic{d}", "more")) for d in doc_ids])
    # Kill while part of the corpus is indexed and the rest is in a worker's hands.
    for _ in range(200):
        counts = await mesh.ingestion.GetCollectionStatus(
            ingestion_pb2.GetCollectionStatusRequest(collection=collection), timeout=5
        )
        if counts.indexed >= 10:
            break
        await asyncio.sleep(0.05)
    stack.kill("worker-0", signal.SIGKILL)
    await asyncio.sleep(0.5)
    await asyncio.to_thread(stack.start, "worker-0")
    await assert_exactly_once(mesh, collection, doc_ids)


async def test_nats_restart_mid_ingest_completes(mesh: Mesh, stack: Stack) -> None:
    collection = new_collection()
    doc_ids = [f"n-{i:03d}.md" for i in range(80)]
    await mesh.ingest(collection, [(d, section_doc(f"nats{d}")) for d in doc_ids])
    await asyncio.to_thread(stack.stop, "nats")
    await asyncio.sleep(1.0)
    await asyncio.to_thread(stack.start, "nats")
    await assert_exactly_once(mesh, collection, doc_ids)


async def dead_letters(mesh: Mesh, collection: str) -> list[ingestion_pb2.DeadLetter]:
    reply = await mesh.ingestion.ListDeadLetters(
        ingestion_pb2.ListDeadLettersRequest(collection=collection), timeout=10
    )
    return list(reply.dead_letters)


async def test_unparseable_pdf_is_dead_lettered_with_its_reason(mesh: Mesh) -> None:
    collection = new_collection()
    await mesh.ingest(collection, [("broken.pdf", b"%PDF-1.4\n garbage that is no pdf at all")], fmt=PDF)
    status = (await mesh.wait_settled(collection, ["broken.pdf"]))["broken.pdf"]
    assert status.state == FAILED and "pdf" in status.reason.lower()
    letters = await dead_letters(mesh, collection)
    assert [(d.doc_id, d.attempts) for d in letters] == [("broken.pdf", 1)]
    assert "pdf" in letters[0].reason.lower()


async def test_embedder_down_dead_letters_then_replay_succeeds(mesh: Mesh, stack: Stack) -> None:
    collection = new_collection()
    embedders = replicas_of(stack, "embedder")
    for name in embedders:
        await asyncio.to_thread(stack.stop, name)
    try:
        await mesh.ingest(collection, [("late.md", section_doc("waiting"))])
        status = (await mesh.wait_settled(collection, ["late.md"], timeout=90))["late.md"]
        assert status.state == FAILED and "embedder" in status.reason
    finally:
        for name in embedders:
            await asyncio.to_thread(stack.start, name)
    letters = await dead_letters(mesh, collection)
    assert len(letters) == 1 and letters[0].attempts >= 2 and "embedder" in letters[0].reason

    reply = await mesh.ingestion.ReplayDeadLetters(
        ingestion_pb2.ReplayDeadLettersRequest(collection=collection), timeout=10
    )
    assert reply.replayed == 1
    status = (await mesh.wait_settled(collection, ["late.md"], timeout=90))["late.md"]
    assert status.state == INDEXED
    assert await dead_letters(mesh, collection) == []
    assert await mesh.index_chunks(collection) == 1


@pytest.mark.parametrize(
    ("doc_id", "content", "fmt", "fragment"),
    [
        ("empty.md", b"", MD, "empty"),
        ("blank.md", b"  \n\t ", MD, "empty"),
        ("latin1.md", b"caf\xe9 au lait", MD, "utf-8"),
        ("../etc/passwd", b"x", MD, ".."),
        ("a" * 300, b"x", MD, "limit"),
        ("thing.xyz", b"stuff", 0, "format"),
        ("fake.pdf", b"not a pdf", PDF, "pdf"),
        ("huge.md", b"x" * 1_100_000, MD, "limit"),
    ],
)
async def test_a_bad_document_is_rejected_alone_and_nothing_of_it_is_written(
    mesh: Mesh, doc_id: str, content: bytes, fmt: int, fragment: str
) -> None:
    collection = new_collection()
    reply = await mesh.ingest(
        collection, [("good.md", "# Fine\n\nA valid ragmesh document.", MD), (doc_id, content, fmt)]
    )
    good, bad = reply.results
    assert good.outcome == ingestion_pb2.SUBMIT_OUTCOME_QUEUED
    assert bad.outcome == ingestion_pb2.SUBMIT_OUTCOME_REJECTED
    assert fragment.lower() in bad.reason.lower()
    # The valid document in the same request went in; the bad one left no trace.
    assert (await mesh.wait_settled(collection, ["good.md"]))["good.md"].state == INDEXED
    if doc_id_problem(doc_id) is None:
        with pytest.raises(aio.AioRpcError) as missing:
            await mesh.statuses(collection, [doc_id])
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_bad_collection_and_empty_request(mesh: Mesh) -> None:
    for collection in ["", "Upper", "x" * 100, "a/b"]:
        with pytest.raises(aio.AioRpcError) as err:
            await mesh.ingest(collection, [("a.md", "# ok")])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(aio.AioRpcError) as err:
        await mesh.ingestion.IngestDocuments(ingestion_pb2.IngestDocumentsRequest(collection="ok"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
