"""``ReindexCollection`` (services/ingestion/reindex.py) with the real API and workers on a real
nats-server and production timings, fake stores and embedder (conftest): the new generation is
built through the pipeline, readers switch in one step, the old generation is deleted, and a
crash of the API midway leaves the old generation serving and the reindex resumable."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from meshkit.domain.collections import COLLECTIONS_BUCKET, CollectionRecord, EmbedderIdentity
from ragmesh.ingestion.v1 import ingestion_pb2
from services.ingestion.events import IngestEvent
from services.ingestion.lifecycle.entries import DocStatus
from services.ingestion.lifecycle.machine import DELETED
from services.ingestion.lifecycle.machine import INDEXED as INDEXED_STATE
from services.ingestion.lifecycle.requests import PREPARATION_VERSION
from services.ingestion.reindex import plan_build

from .conftest import Harness

INDEXED = ingestion_pb2.DOCUMENT_STATE_INDEXED
BUILDING = ingestion_pb2.REINDEX_PHASE_BUILDING
DONE = ingestion_pb2.REINDEX_PHASE_DONE
DOCS = {
    f"{word}.md": f"# {word}\n\nA ragmesh note about {word} and nothing else." for word in ("a", "b", "c")
}


async def record_of(harness: Harness, collection: str) -> CollectionRecord:
    kv = await (await harness.connect()).jetstream().key_value(COLLECTIONS_BUCKET)
    entry = await kv.get(collection)
    assert entry.value is not None
    return CollectionRecord.from_bytes(entry.value)


async def step(api: Any, collection: str, start: bool = False) -> ingestion_pb2.ReindexCollectionResponse:
    request = ingestion_pb2.ReindexCollectionRequest(collection=collection, start=start)
    reply: ingestion_pb2.ReindexCollectionResponse = await api.ReindexCollection(request, None)
    return reply


async def until_done(
    api: Any, collection: str, timeout: float = 30.0, start: bool = False
) -> ingestion_pb2.ReindexCollectionResponse:
    deadline = time.monotonic() + timeout
    while True:
        reply = await step(api, collection, start)
        start = False
        if reply.phase == DONE:
            return reply
        assert time.monotonic() < deadline, reply
        await asyncio.sleep(0.1)


async def indexed(harness: Harness, collection: str, names: list[str]) -> None:
    for name in names:
        await harness.wait_state(collection, name, INDEXED)


async def test_reindex_builds_switches_and_retires(harness: Harness) -> None:
    api = await harness.start_api(reindex_retire_delay_s=0.0)
    await harness.start_worker()
    await harness.submit_many("c", list(DOCS.items()))
    await indexed(harness, "c", list(DOCS))
    old_chunks = {name: harness.stores.index.chunks("c", name) for name in DOCS}
    assert all(old_chunks.values())

    harness.stores.embedder.model, harness.stores.embedder.model_sha256 = "new-model", "b" * 64
    first = await step(api, "c", start=True)
    assert (first.phase, first.serving_generation, first.other_generation) == (BUILDING, 1, 2)
    assert first.documents == 3
    # While it builds, a new document goes to both generations.
    await harness.submit("c", "d.md", "# d\n\nA ragmesh note about d.")
    done = await until_done(api, "c")
    assert done.serving_generation == 2 and done.serving_model == "new-model"

    record = await record_of(harness, "c")
    assert (record.generation, record.pending_generation, record.retired_generation) == (2, 0, 0)
    assert record.embedder == EmbedderIdentity("new-model", 4, "b" * 64)
    for name in [*DOCS, "d.md"]:
        assert harness.stores.index.chunks("c__g2", name), name
        assert harness.stores.sparse.chunks("c__g2", name), name
        assert harness.stores.index.chunks("c", name) == set(), name  # the old generation is gone
        status = await harness.status("c", name)  # reported under the collection's own name
        assert (status.collection, status.state) == ("c", INDEXED)
    listed = await api.ListCollections(ingestion_pb2.ListCollectionsRequest(), None)
    assert list(listed.collections) == ["c"]
    # Done is done: another call without start changes nothing.
    assert (await step(api, "c")).phase == DONE


async def test_a_crash_midway_leaves_the_old_generation_serving_and_resumes(harness: Harness) -> None:
    api = await harness.start_api(reindex_retire_delay_s=0.0, reindex_batch_documents=1)
    await harness.start_worker()
    await harness.submit_many("c", list(DOCS.items()))
    await indexed(harness, "c", list(DOCS))
    first = await step(api, "c", start=True)
    assert first.phase == BUILDING
    await harness.api.stop()  # the API dies after one step of one document

    record = await record_of(harness, "c")
    assert (record.generation, record.pending_generation) == (1, 2)  # readers still on generation 1
    assert all(harness.stores.index.chunks("c", name) for name in DOCS)

    api = await harness.start_api(reindex_retire_delay_s=0.0, reindex_batch_documents=1)
    done = await until_done(api, "c")
    assert done.serving_generation == 2
    assert all(harness.stores.index.chunks("c__g2", name) for name in DOCS)


async def test_reserved_generation_names_are_refused(harness: Harness) -> None:
    api = await harness.start_api()
    request = ingestion_pb2.IngestDocumentsRequest(
        collection="c__g2",
        documents=[ingestion_pb2.Document(doc_id="a.md", content=b"# a\n\nbody", format=1)],
    )
    try:
        await api.IngestDocuments(request, None)
    except Exception as exc:
        assert "reserved" in str(exc)
    else:
        raise AssertionError("a generation's name was accepted")


def _status(doc_id: str, state: str, sha: str, collection: str = "c") -> DocStatus:
    request = IngestEvent(
        op="upsert", collection=collection, doc_id=doc_id, content_sha256=sha, object_key="k"
    )
    return DocStatus(
        collection=collection,
        doc_id=doc_id,
        state=state,
        request=request,
        target_sha256=sha,
        indexed_sha256=sha if state == INDEXED_STATE else "",
        indexed_version=PREPARATION_VERSION,
    )


def test_plan_copies_what_the_new_generation_lacks_and_deletes_what_the_old_one_lost() -> None:
    source = [
        _status("a", INDEXED_STATE, "1"),
        _status("b", INDEXED_STATE, "2"),
        _status("gone", DELETED, ""),
    ]
    target = {
        "a": _status("a", INDEXED_STATE, "1", "c__g2"),
        "b": _status("b", INDEXED_STATE, "old", "c__g2"),
        "gone": _status("gone", INDEXED_STATE, "9", "c__g2"),
    }
    plan = plan_build(source, target, "c__g2")
    assert [s.doc_id for s in plan.copies] == ["b"]
    assert plan.deletes == ["gone"]
    assert (plan.documents, plan.indexed, plan.pending, plan.failed) == (2, 1, 2, 0)


async def test_a_collection_indexed_before_records_existed_can_be_reindexed(harness: Harness) -> None:
    api = await harness.start_api(reindex_retire_delay_s=0.0)
    await harness.start_worker()
    await harness.submit_many("c", list(DOCS.items()))
    await indexed(harness, "c", list(DOCS))
    kv = await (await harness.connect()).jetstream().key_value(COLLECTIONS_BUCKET)
    await kv.purge("c")  # as an older version left it: documents, no record
    await until_done(api, "c", start=True)
    record = await record_of(harness, "c")
    assert record.generation == 2 and record.embedder == EmbedderIdentity("fake-embedder", 4, "a" * 64)
    assert all(harness.stores.index.chunks("c__g2", name) for name in DOCS)
