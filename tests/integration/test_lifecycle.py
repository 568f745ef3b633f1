"""The document lifecycle on a stack with production timings: lease 120 s, ack_wait 60 s, five
attempts, the default backoffs, two worker processes. The session stack's short timings (4 s
leases) are what hid these failures; here only the parts of the mesh ingestion needs run
(NATS, SeaweedFS, embedder, index, sparse, the ingestion API and two workers).

What a test cannot wait for in production time is simulated on the real status bucket: a
claim held by another live worker (renewed by the test), workers that died mid-document (a
claim whose lease ran out), a worker frozen past its lease (SIGSTOP, then its lease is expired
in the bucket: the time it would have spent frozen).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from meshkit.domain.ids import doc_key, sha256_hex
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2
from ragmesh_cli.stack import Stack

from .meshclients import Mesh
from .test_ingest import INDEXED, dead_letters, new_collection, section_doc

pytestmark = pytest.mark.integration

PRODUCTION_ENV = {
    "RAGMESH_INGEST_ACK_WAIT_S": "60",
    "RAGMESH_INGEST_LEASE_S": "120",
    "RAGMESH_INGEST_MAX_DELIVER": "5",
    "RAGMESH_INGEST_RETRY_BACKOFF_S": "1,2,5,10",
    "RAGMESH_LOG_LEVEL": "INFO",
}
SERVICES = ["embedder", "index", "sparse", "ingestion", "worker"]
WORKERS = 2
STATUS_BUCKET = "ragmesh_doc_status"


@pytest.fixture(scope="module")
def prod_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("prodstack"), workers=WORKERS, services=SERVICES, extra_env=PRODUCTION_ENV
    ) as running:
        yield running


@pytest.fixture
async def mesh(prod_stack: Stack) -> AsyncIterator[Mesh]:
    clients = Mesh(prod_stack)
    yield clients
    await clients.close()


@pytest.fixture
async def nc(prod_stack: Stack) -> AsyncIterator[NATS]:
    client = await nats.connect(f"nats://{prod_stack.address('nats')}")
    yield client
    await client.close()


def workers_of(stack: Stack) -> list[str]:
    return [name for name in stack.names() if stack.component(name).kind == "worker"]


class Status:
    """The status bucket, read and written with a client of the test's own."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc

    async def get(self, key: str) -> tuple[dict[str, Any], int]:
        kv = await self.nc.jetstream().key_value(STATUS_BUCKET)
        entry = await kv.get(key)
        return json.loads(entry.value or b"{}"), int(entry.revision or 0)

    async def edit(self, key: str, **changes: Any) -> None:
        kv = await self.nc.jetstream().key_value(STATUS_BUCKET)
        for _ in range(100):
            raw, revision = await self.get(key)
            raw.update(changes)
            try:
                await kv.update(key, json.dumps(raw).encode(), last=revision)
                return
            except Exception:
                await asyncio.sleep(0.01)
        raise AssertionError(f"could not edit {key}")


async def until_all_events_settled(nc: NATS, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        info = await nc.jetstream().consumer_info("RAGMESH_INGEST", "ingest-workers")
        if info.num_ack_pending == 0 and info.num_pending == 0:
            return
        assert time.monotonic() < deadline, f"events still in flight after {timeout}s: {info}"
        await asyncio.sleep(0.5)


def note(word: str) -> str:
    return f"# Note\n\nThis ragmesh note is about {word} and nothing else."


# --- "busy" costs nothing ---------------------------------------------------------------------


@pytest.mark.timeout(180)
async def test_resubmission_while_another_worker_holds_it_is_indexed(mesh: Mesh, nc: NATS) -> None:
    """Busy naks used to spend deliveries: the re-submitted version reached max_deliver while
    another worker held the document, was dead-lettered and left QUEUED with no event."""
    collection = new_collection()
    key = doc_key(collection, "held.md")
    status = Status(nc)
    await mesh.ingest(collection, [("held.md", note("first"))])
    await mesh.wait_settled(collection, ["held.md"])
    stop = asyncio.Event()

    async def hold() -> None:
        # Another live worker on the document: its claim, its lease renewed (short, so that
        # the old code's busy delays, which followed the lease, come back quickly).
        while not stop.is_set():
            await status.edit(
                key, state="processing", owner="other-live-worker", lease_until=time.time() + 1.0
            )
            await asyncio.sleep(0.3)

    holder = asyncio.create_task(hold())
    try:
        await asyncio.sleep(0.5)
        await mesh.ingest(collection, [("held.md", note("second"))])
        await asyncio.sleep(12)  # the event comes back "busy" again and again meanwhile
    finally:
        stop.set()
        await holder
    # The holder finishes its (older) version: a newer request is recorded, so it leaves it queued.
    await status.edit(key, state="queued", owner="", lease_until=0.0)
    settled = (await mesh.wait_settled(collection, ["held.md"], timeout=60))["held.md"]
    assert settled.state == INDEXED, settled
    assert settled.content_sha256 == sha256_hex(note("second").encode())
    assert await dead_letters(mesh, collection) == []


# --- dead-lettering by the worker's own count ---------------------------------------------------


@pytest.mark.timeout(240)
async def test_worker_dead_letters_a_document_whose_workers_died_with_the_api_down(
    mesh: Mesh, nc: NATS, prod_stack: Stack
) -> None:
    """Five workers in a row claimed the document and died mid-document. The API process,
    which used to move such an event from a JetStream advisory, is down: the next worker must
    dead-letter it by its own count."""
    collection = new_collection()
    key = doc_key(collection, "poison.md")
    status = Status(nc)
    workers = workers_of(prod_stack)
    for name in workers:
        prod_stack.kill(name, signal.SIGSTOP)
    try:
        await asyncio.sleep(1.5)  # pull requests the stopped workers had open expire
        await mesh.ingest(collection, [("poison.md", note("poison"))])
        await asyncio.to_thread(prod_stack.stop, "ingestion")
        js = nc.jetstream()
        consumer = await js.pull_subscribe_bind(durable="ingest-workers", stream="RAGMESH_INGEST")
        try:
            for attempt in range(1, 6):
                [msg] = await consumer.fetch(1, timeout=10)
                raw, _ = await status.get(key)
                died: dict[str, Any] = {
                    "state": "processing",
                    "owner": f"died-{attempt}",
                    "lease_until": time.time() - 1,  # its lease ran out
                    "attempts": attempt,
                }
                if "charged" in raw:
                    died["charged"] = raw["charged"] + 1
                await status.edit(key, **died)
                await msg.nak()  # (its ack_wait ran out)
        finally:
            await consumer.unsubscribe()
        for name in workers:
            prod_stack.kill(name, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while (await status.get(key))[0].get("state") != "failed":
            assert time.monotonic() < deadline, f"not dead-lettered: {(await status.get(key))[0]}"
            await asyncio.sleep(0.2)
    finally:
        for name in workers:
            prod_stack.kill(name, signal.SIGCONT)
        if prod_stack.component("ingestion").pid is None:
            await asyncio.to_thread(prod_stack.start, "ingestion")
    letters = await dead_letters(mesh, collection)
    assert [(d.doc_id, d.attempts) for d in letters] == [("poison.md", 5)]
    assert "stopped mid-document" in letters[0].reason
    statuses = await mesh.statuses(collection, ["poison.md"])
    assert statuses["poison.md"].state == ingestion_pb2.DOCUMENT_STATE_FAILED


# --- a stale worker is fenced ------------------------------------------------------------------


def big_doc(word: str, sections: int = 120) -> str:
    return section_doc(*[f"{word} part {i}" for i in range(sections)])


@pytest.mark.timeout(300)
async def test_worker_frozen_past_its_lease_cannot_bring_its_version_back(
    mesh: Mesh, nc: NATS, prod_stack: Stack
) -> None:
    """A worker is frozen (SIGSTOP) mid-document for longer than its lease; the other worker
    indexes the newer version. Thawed, the frozen one used to write its old version over it
    and leave the document QUEUED with no event."""
    collection = new_collection()
    key = doc_key(collection, "big.md")
    status = Status(nc)
    await mesh.ingest(collection, [("big.md", big_doc("oldversion"))])
    deadline = time.monotonic() + 60
    owner = ""
    while not owner:
        raw, _ = await status.get(key)
        if raw.get("state") == "processing" and raw.get("owner"):
            owner = raw["owner"]
        assert time.monotonic() < deadline, "no worker claimed the document"
        await asyncio.sleep(0.01)
    frozen = next(name for name in workers_of(prod_stack) if owner.startswith(f"{name}-"))
    prod_stack.kill(frozen, signal.SIGSTOP)
    try:
        raw, _ = await status.get(key)
        assert raw.get("state") == "processing", "the document finished before the freeze: rerun"
        await status.edit(key, lease_until=time.time() - 1)  # frozen past its lease
        await asyncio.sleep(1.5)  # a pull request the frozen worker had open expires
        new = big_doc("newversion", sections=3)
        await mesh.ingest(collection, [("big.md", new)])
        settled = (await mesh.wait_settled(collection, ["big.md"], timeout=120))["big.md"]
        assert settled.state == INDEXED and settled.content_sha256 == sha256_hex(new.encode())
    finally:
        prod_stack.kill(frozen, signal.SIGCONT)
    # The thawed worker finishes what it was doing: wait until every event is settled.
    await until_all_events_settled(nc)
    settled = (await mesh.statuses(collection, ["big.md"]))["big.md"]
    assert (settled.state, settled.content_sha256) == (INDEXED, sha256_hex(new.encode())), settled
    assert settled.chunks == 3
    chunks = await mesh.sparse_chunks_of(collection, "big.md")
    assert len(chunks) == 3 and await mesh.index_chunks(collection) == 3
    texts = await mesh.sparse.GetChunks(
        sparse_pb2.GetChunksRequest(collection=collection, chunk_ids=[c.chunk_id for c in chunks]), timeout=10
    )
    assert all("newversion" in c.text for c in texts.chunks)


# --- a short infrastructure outage delays documents, it does not fail them ---------------------


@pytest.mark.timeout(300)
async def test_object_store_down_for_half_a_minute_delays_and_loses_nothing(
    mesh: Mesh, prod_stack: Stack
) -> None:
    """With production backoffs the old code spent its five deliveries in 18 s of an S3
    outage and dead-lettered every document; infrastructure failures now wait for a window
    (10 min by default) without counting."""
    collection = new_collection()
    doc_ids = [f"s3-{i}.md" for i in range(6)]
    workers = workers_of(prod_stack)
    for name in workers:
        prod_stack.kill(name, signal.SIGSTOP)
    try:
        await mesh.ingest(collection, [(d, note(f"outage {d}")) for d in doc_ids])
        await asyncio.to_thread(prod_stack.stop, "s3")
    finally:
        for name in workers:
            prod_stack.kill(name, signal.SIGCONT)
    try:
        await asyncio.sleep(30)
        waiting = await mesh.statuses(collection, doc_ids)
        # A document whose backoff just ended is claimed again (PROCESSING) while its fetch
        # retries; the reason from its last try stays until the outcome is recorded.
        retrying = {ingestion_pb2.DOCUMENT_STATE_QUEUED, ingestion_pb2.DOCUMENT_STATE_PROCESSING}
        assert {s.state for s in waiting.values()} <= retrying, waiting
        assert all("object store unavailable" in s.reason for s in waiting.values()), waiting
    finally:
        await asyncio.to_thread(prod_stack.start, "s3")
    statuses = await mesh.wait_settled(collection, doc_ids, timeout=150)
    assert {s.state for s in statuses.values()} == {INDEXED}, statuses
    assert await dead_letters(mesh, collection) == []
