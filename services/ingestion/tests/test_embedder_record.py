"""The collection's embedder record on the write path (meshkit.domain.collections): the real API and
workers on a real nats-server with production timings, fake stores and embedder (conftest) whose
reply identity the test swaps, as a restart of the embedder with another model would."""

from __future__ import annotations

import nats

from meshkit.domain.collections import COLLECTIONS_BUCKET, CollectionRecord, EmbedderIdentity
from ragmesh.ingestion.v1 import ingestion_pb2

from .conftest import Harness

INDEXED = ingestion_pb2.DOCUMENT_STATE_INDEXED
FAILED = ingestion_pb2.DOCUMENT_STATE_FAILED


def doc(word: str) -> str:
    return f"# Note\n\nA ragmesh note about {word} and nothing else."


async def record_of(harness: Harness, collection: str) -> CollectionRecord:
    """The record as stored, read with a client of our own (not the code under test)."""
    nc = await nats.connect(harness.nats_url)
    try:
        entry = await (await nc.jetstream().key_value(COLLECTIONS_BUCKET)).get(collection)
        assert entry.value is not None
        return CollectionRecord.from_bytes(entry.value)
    finally:
        await nc.close()


async def test_first_document_records_the_embedder_and_another_embedder_is_refused(harness: Harness) -> None:
    await harness.start_api()
    await harness.start_worker()
    await harness.submit("c", "a.md", doc("alpha"))
    await harness.wait_state("c", "a.md", INDEXED)
    record = await record_of(harness, "c")
    assert record.generation == 1
    assert record.embedder == EmbedderIdentity("fake-embedder", 4, "a" * 64)

    # The embedder comes back with another model: its vectors must not join the collection.
    embedder = harness.stores.embedder
    embedder.model, embedder.model_sha256 = "other-model", "b" * 64
    embedded = embedder.texts
    await harness.submit("c", "b.md", doc("beta"))
    failed = await harness.wait_state("c", "b.md", FAILED)
    assert failed.reason.startswith("FAILED_PRECONDITION")
    assert "'fake-embedder'" in failed.reason and "'other-model'" in failed.reason
    assert "ragmesh reindex --collection c" in failed.reason
    assert embedder.texts > embedded  # it was embedded, then refused before any store write
    assert harness.stores.index.chunks("c", "b.md") == set()
    assert harness.stores.sparse.chunks("c", "b.md") == set()
    assert (await record_of(harness, "c")).embedder == record.embedder
    # Refused for good: it is dead-lettered with the reason, replayable once fixed.
    letters = await harness.dead_letters("c")
    assert [letter.doc_id for letter in letters] == ["b.md"]

    # A collection with no record yet takes the embedder that serves now.
    await harness.submit("d", "a.md", doc("gamma"))
    await harness.wait_state("d", "a.md", INDEXED)
    assert (await record_of(harness, "d")).embedder == EmbedderIdentity("other-model", 4, "b" * 64)


async def test_same_model_name_with_another_file_is_refused(harness: Harness) -> None:
    await harness.start_api()
    await harness.start_worker()
    await harness.submit("c", "a.md", doc("alpha"))
    await harness.wait_state("c", "a.md", INDEXED)
    harness.stores.embedder.model_sha256 = "c" * 64  # same name, other weights
    await harness.submit("c", "b.md", doc("beta"))
    failed = await harness.wait_state("c", "b.md", FAILED)
    assert "sha256 aaaaaaaaaaaaaaaa" in failed.reason and "sha256 cccccccccccccccc" in failed.reason
