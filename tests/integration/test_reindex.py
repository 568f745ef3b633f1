"""Collections record their embedder and refuse another; ``ragmesh reindex`` moves a collection
to a new generation while searches keep answering (meshkit.domain.collections, cli reindex).

Against the real stack: the embedder replicas are restarted with the same ONNX file declared
under another model id, which is exactly what a changed model looks like to the mesh."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import nats
import pytest

from meshkit.domain.collections import COLLECTIONS_BUCKET, CollectionRecord, EmbedderIdentity
from meshkit.settings import EmbedderSettings, GatewaySettings
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh_cli import reindex
from ragmesh_cli.stack import Stack
from ragmesh_client import AsyncClient, FailedPreconditionError, RagmeshError, RetryPolicy, SearchResponse

from .meshclients import Mesh, replicas_of
from .test_ingest import FAILED, INDEXED, new_collection

pytestmark = pytest.mark.integration

DEFAULT = EmbedderSettings()
RENAMED = "all-MiniLM-L6-v2-int8-renamed"
DOCS = [
    ("basalt.md", "# Basalt\n\nBasalt is a volcanic rock formed from rapidly cooling lava flows."),
    ("tides.md", "# Tides\n\nOcean tides are driven by the gravitational pull of the moon and the sun."),
    ("sourdough.md", "# Sourdough\n\nA sourdough starter is a fermented culture of flour and water."),
]


@pytest.fixture
async def mesh(stack: Stack) -> AsyncIterator[Mesh]:
    clients = Mesh(stack)
    yield clients
    await clients.close()


async def record_of(stack: Stack, collection: str) -> CollectionRecord:
    """The record as NATS holds it, read with a client of our own."""
    nc = await nats.connect(f"nats://{stack.address('nats')}")
    try:
        entry = await (await nc.jetstream().key_value(COLLECTIONS_BUCKET)).get(collection)
        assert entry.value is not None
        return CollectionRecord.from_bytes(entry.value)
    finally:
        await nc.close()


async def restart_embedders(stack: Stack, model_name: str | None) -> None:
    """Every embedder replica restarted, declaring ``model_name`` (None: the default)."""
    for name in replicas_of(stack, "embedder"):
        stack.stop(name)
        env = stack.component(name).env
        if model_name is None:
            env.pop("RAGMESH_EMBEDDER_MODEL_NAME", None)
        else:
            env["RAGMESH_EMBEDDER_MODEL_NAME"] = model_name
        await stack.start_async(name)


@pytest.fixture
async def default_embedder_after(stack: Stack) -> AsyncIterator[None]:
    """Whatever the test does to the embedder, the session's other tests get the default back."""
    yield
    await restart_embedders(stack, None)


def gateway_of(mesh: Mesh) -> AsyncClient:
    """The gateway through ragmesh_client, never retrying: every failed search counts."""
    return mesh.client(retry=RetryPolicy(max_attempts=1))


async def search(gateway: AsyncClient, collection: str, query: str) -> SearchResponse:
    # No reranking: the loop measures availability, and a reranked search takes seconds on a
    # loaded 2-core box, too few of them would span the reindex.
    return await gateway.search(collection, query, top_k=5, rerank=False, timeout=20)


async def refused_search(gateway: AsyncClient, collection: str) -> RagmeshError:
    """The search's refusal, once the gateway's breaker has let the restarted embedder back in
    (until then the dense leg is only degraded and the search answers from the sparse legs)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await search(gateway, collection, "volcanic rock")
        except RagmeshError as exc:
            return exc
        assert time.monotonic() < deadline, "the search was never refused"
        await asyncio.sleep(0.5)


async def test_another_embedder_is_refused_on_search_and_ingest(
    stack: Stack, mesh: Mesh, default_embedder_after: None
) -> None:
    gateway = gateway_of(mesh)
    collection = new_collection()
    await mesh.ingest_indexed(collection, DOCS)
    record = await record_of(stack, collection)
    assert record.generation == 1
    assert record.embedder == EmbedderIdentity(
        DEFAULT.embedder_model_name, 384, DEFAULT.embedder_model_sha256
    )
    assert (await search(gateway, collection, "volcanic rock")).results

    await restart_embedders(stack, RENAMED)

    refused = await refused_search(gateway, collection)
    assert isinstance(refused, FailedPreconditionError), refused
    message = refused.message
    assert f"'{DEFAULT.embedder_model_name}'" in message and f"'{RENAMED}'" in message
    assert f"ragmesh reindex --collection {collection}" in message
    with pytest.raises(FailedPreconditionError):
        await gateway.ask(collection, "what is basalt?", timeout=30)

    await mesh.ingest(
        collection, [("glacier.md", "# Glaciers\n\nA ragmesh note: glacier ice flows slowly downhill.")]
    )
    status = (await mesh.wait_settled(collection, ["glacier.md"]))["glacier.md"]
    assert status.state == FAILED
    assert status.reason.startswith("FAILED_PRECONDITION") and f"'{RENAMED}'" in status.reason
    assert f"ragmesh reindex --collection {collection}" in status.reason
    # Nothing of the other model reached the stores; the record still names the first one.
    assert await mesh.sparse_chunks_of(collection, "glacier.md") == []
    assert (await record_of(stack, collection)).embedder == record.embedder

    # A new collection simply records the embedder that serves now.
    other = new_collection()
    await mesh.ingest_indexed(other, DOCS[:1])
    assert (await record_of(stack, other)).embedder == EmbedderIdentity(
        RENAMED, 384, DEFAULT.embedder_model_sha256
    )


SUBSET = Path(__file__).parent / "data" / "scifact_30.jsonl"


def scifact_subset() -> list[ingestion_pb2.Document]:
    """The first 30 SciFact abstracts, as `ragmesh ingest corpus.jsonl` submits BEIR lines."""
    docs = []
    for line in SUBSET.read_text().splitlines():
        row = json.loads(line)
        docs.append(
            ingestion_pb2.Document(
                doc_id=row["_id"],
                title=row["title"].strip(),
                content=row["text"].encode(),
                format=ingestion_pb2.DOCUMENT_FORMAT_TEXT,
            )
        )
    return docs


class SearchLoop:
    """Searches the collection back to back, recording every answer and every failure."""

    def __init__(self, gateway: AsyncClient, collection: str, queries: list[str]) -> None:
        self.gateway, self.collection, self.queries = gateway, collection, queries
        self.answers: list[SearchResponse] = []
        self.failures: list[str] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        i = 0
        while not self._stop.is_set():
            query = self.queries[i % len(self.queries)]
            i += 1
            try:
                reply = await search(self.gateway, self.collection, query)
            except RagmeshError as exc:
                self.failures.append(f"{query!r}: {exc.code.name}: {exc.message}")
            else:
                self.answers.append(reply)
                if not reply.results:
                    self.failures.append(f"{query!r}: no results")
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()


async def sparse_chunks(mesh: Mesh, collection: str) -> int:
    try:
        return int((await mesh.sparse_stats(collection)).chunks)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return 0


def dense_refused(reply: SearchResponse) -> bool:
    return any(d.stage == "embedder" for d in reply.degradations)


async def test_reindex_moves_to_the_new_embedder_while_searches_answer(
    stack: Stack, mesh: Mesh, default_embedder_after: None
) -> None:
    gateway = gateway_of(mesh)
    collection = new_collection()
    docs = scifact_subset()
    await mesh.ingestion.IngestDocuments(
        ingestion_pb2.IngestDocumentsRequest(collection=collection, documents=docs), timeout=60
    )
    doc_ids = [d.doc_id for d in docs]
    statuses = await mesh.wait_settled(collection, doc_ids)
    assert {s.state for s in statuses.values()} == {INDEXED}
    before = await record_of(stack, collection)
    assert before.embedder is not None and before.embedder.model == DEFAULT.embedder_model_name

    # The model changes: the collection is refused until it is reindexed.
    await restart_embedders(stack, RENAMED)
    refused = await refused_search(gateway, collection)
    assert isinstance(refused, FailedPreconditionError), refused

    loop = SearchLoop(gateway, collection, [d.title for d in docs])
    out = io.StringIO()
    run = asyncio.create_task(
        reindex.reindex(stack.address("ingestion"), collection, interval_s=0.5, timeout_s=300, out=out)
    )
    # From the moment the reindex has begun (and the gateway's record cache has seen it), every
    # search answers: from the old generation's sparse legs while the new one is built, then
    # from the new generation, dense leg included.
    deadline = time.monotonic() + 30
    while not (await record_of(stack, collection)).pending_generation:
        assert not run.done(), out.getvalue()
        assert time.monotonic() < deadline, "the reindex never began"
        await asyncio.sleep(0.1)
    await asyncio.sleep(GatewaySettings().gateway_collection_cache_s + 0.5)
    searching = asyncio.create_task(loop.run())
    try:
        code = await asyncio.wait_for(run, 300)
    finally:
        loop.stop()
        await searching
    lines = out.getvalue().splitlines()
    print("\n".join(["", *lines, f"{len(loop.answers)} searches answered during the reindex"]))
    assert code == 0, lines
    assert any(": building generation 2" in line for line in lines), lines
    assert "done: generation 2" in lines[-1], lines

    assert loop.failures == [], loop.failures[:5]
    assert len(loop.answers) >= 5
    # The searches spanned the switch: some answered without the dense leg, the last with it.
    assert any(dense_refused(r) for r in loop.answers)
    assert not dense_refused(loop.answers[-1])

    after = await record_of(stack, collection)
    assert after.generation == 2 and after.pending_generation == 0 and after.retired_generation == 0
    assert after.embedder == EmbedderIdentity(RENAMED, 384, DEFAULT.embedder_model_sha256)
    # Every document is in the new generation, reported under the collection's name; the old
    # generation's stores hold none any more.
    statuses = await mesh.statuses(collection, doc_ids)
    assert {s.state for s in statuses.values()} == {INDEXED}
    assert {s.collection for s in statuses.values()} == {collection}
    assert (await mesh.sparse_stats(f"{collection}__g2")).documents == len(docs)
    assert await sparse_chunks(mesh, collection) == 0
    assert await mesh.index_chunks(collection) == 0

    # The collection takes new documents as before, into its new generation.
    await mesh.ingest_indexed(collection, [("extra.md", "# Extra\n\nA ragmesh note on white matter.")])
    assert (await mesh.sparse_stats(f"{collection}__g2")).documents == len(docs) + 1
