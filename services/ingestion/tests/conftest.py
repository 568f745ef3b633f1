"""A harness for the lifecycle tests: a real nats-server per test (JetStream, KV and
compare-and-set are the subject), the real ingestion API and workers in this process, and
fakes only where a failure or an interleaving has to be injected: an in-memory object store
(``ObjectStore.from_settings`` returns it) and gRPC servers for the embedder, an index shard
and the sparse store that keep each document's chunk set and fence the way the real stores'
contract says (a replacement with a fence below the last applied one is refused and
reported in ``stale_doc_ids``).

Settings are production's where timing is the point: lease 120 s, ack_wait 60 s, five
attempts, the default retry backoffs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import urllib.request
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from grpc import aio
from nats.aio.client import Client as NATS

from meshkit.settings import IngestionSettings
from meshkit.storage.objectstore import ObjectNotFound, ObjectStore
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from ragmesh_cli import procutil

PRODUCTION = {
    "ingest_lease_s": 120.0,
    "ingest_ack_wait_s": 60.0,
    "ingest_max_deliver": 5,
    "ingest_retry_backoff_s": "1,2,5,10",
}
STATUS_BUCKET = "ragmesh_doc_status"
MD = ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN


# --- NATS -------------------------------------------------------------------------------------


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    port, monitor = procutil.free_ports(2)
    proc = subprocess.Popen(
        [
            procutil.find_binary("nats-server"),
            "-js",
            "-sd",
            str(tmp_path / "nats"),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "-m",
            str(monitor),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                url = f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true"
                with urllib.request.urlopen(url, timeout=1) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "nats-server did not become healthy"
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- object store -----------------------------------------------------------------------------

Hook = Callable[[str], Awaitable[None]]


class FakeObjectStore:
    """ObjectStore's API over a dict. ``on_put``/``on_get`` run before the operation (to pause
    it or make it fail), ``after_put`` once the bytes are stored."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.deleted: list[str] = []
        self.on_put: Hook | None = None
        self.after_put: Hook | None = None
        self.on_get: Hook | None = None

    async def ensure_bucket(self, bucket: str) -> None:
        return None

    async def put(self, bucket: str, key: str, data: bytes, **_: Any) -> None:
        if self.on_put is not None:
            await self.on_put(key)
        self.objects[(bucket, key)] = data
        if self.after_put is not None:
            await self.after_put(key)

    async def get(self, bucket: str, key: str) -> bytes:
        if self.on_get is not None:
            await self.on_get(key)
        try:
            return self.objects[(bucket, key)]
        except KeyError:
            raise ObjectNotFound(f"{bucket}/{key}") from None

    async def delete(self, bucket: str, key: str) -> None:
        self.deleted.append(key)
        self.objects.pop((bucket, key), None)

    async def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        return [k for b, k in self.objects if b == bucket and k.startswith(prefix)]

    def keys(self) -> list[str]:
        return [k for _b, k in self.objects]


# --- stores -----------------------------------------------------------------------------------


@dataclass
class DocState:
    chunks: set[str] = field(default_factory=set)
    fence: int = 0


@dataclass
class FakeStore:
    """One store's documents: chunk set and fence per (collection, doc_id)."""

    name: str
    docs: dict[tuple[str, str], DocState] = field(default_factory=lambda: defaultdict(DocState))
    applied: list[tuple[str, int]] = field(default_factory=list)
    refused: list[tuple[str, int]] = field(default_factory=list)
    # doc_id -> an event the next write of it waits on (a worker paused mid-write).
    pause_next: dict[str, asyncio.Event] = field(default_factory=dict)
    entered: dict[str, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))

    async def replace(
        self, collection: str, docs: list[tuple[str, list[str], list[str], int]]
    ) -> tuple[list[str], list[str]]:
        """docs: (doc_id, upsert ids, keep ids, fence) -> (missing keep ids, stale doc ids)."""
        for doc_id, *_ in docs:
            self.entered[doc_id].set()
            gate = self.pause_next.pop(doc_id, None)
            if gate is not None:
                await gate.wait()
        missing: list[str] = []
        stale: list[str] = []
        for doc_id, upserts, keeps, fence in docs:
            state = self.docs[(collection, doc_id)]
            if fence < state.fence:
                stale.append(doc_id)
                self.refused.append((doc_id, fence))
                continue
            present = [c for c in keeps if c in state.chunks]
            missing += [c for c in keeps if c not in state.chunks]
            state.chunks = set(upserts) | set(present)
            state.fence = fence
            self.applied.append((doc_id, fence))
        return missing, stale

    def chunks(self, collection: str, doc_id: str) -> set[str]:
        return set(self.docs[(collection, doc_id)].chunks)


class FakeIndex(index_pb2_grpc.IndexServiceServicer):
    def __init__(self, store: FakeStore) -> None:
        self.store = store
        # doc_id -> the last replacement received for it.
        self.replacements: dict[str, Any] = {}

    async def ReplaceDocuments(self, request: Any, context: Any) -> Any:
        self.replacements.update((d.doc_id, d) for d in request.documents)
        docs = [
            (d.doc_id, [c.chunk_id for c in d.upserts], list(d.keep_chunk_ids), d.fence)
            for d in request.documents
        ]
        missing, stale = await self.store.replace(request.collection, docs)
        return index_pb2.ReplaceDocumentsResponse(missing_chunk_ids=missing, stale_doc_ids=stale)


class FakeSparse(sparse_pb2_grpc.SparseServiceServicer):
    def __init__(self, store: FakeStore) -> None:
        self.store = store
        self.texts: dict[str, str] = {}
        self.replacements: dict[str, Any] = {}

    async def ReplaceDocuments(self, request: Any, context: Any) -> Any:
        self.replacements.update((d.doc_id, d) for d in request.documents)
        docs = []
        for d in request.documents:
            for c in d.upserts:
                self.texts[c.chunk_id] = c.text
            docs.append((d.doc_id, [c.chunk_id for c in d.upserts], list(d.keep_chunk_ids), d.fence))
        missing, stale = await self.store.replace(request.collection, docs)
        return sparse_pb2.ReplaceDocumentsResponse(missing_chunk_ids=missing, stale_doc_ids=stale)


class FakeEmbedder(embedder_pb2_grpc.EmbedderServiceServicer):
    def __init__(self) -> None:
        self.texts = 0
        # The identity its replies carry (a test swaps the model under a collection).
        self.model = "fake-embedder"
        self.model_sha256 = "a" * 64
        # The next call waits on this (a worker paused while embedding).
        self.pause_next: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def Embed(self, request: Any, context: Any) -> Any:
        self.entered.set()
        gate, self.pause_next = self.pause_next, None
        if gate is not None:
            await gate.wait()
        self.texts += len(request.texts)
        vectors = [common_pb2.Vector(values=[float(len(t) % 7), 1.0, 0.5, 0.25]) for t in request.texts]
        return embedder_pb2.EmbedResponse(vectors=vectors, model=self.model, model_sha256=self.model_sha256)


@dataclass
class Stores:
    index: FakeStore
    sparse: FakeStore
    embedder: FakeEmbedder
    sparse_service: FakeSparse
    addresses: dict[str, str]
    index_service: FakeIndex | None = None


async def _serve(register: Callable[[aio.Server], None]) -> tuple[aio.Server, str]:
    server = aio.server()
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def fake_stores() -> AsyncIterator[Stores]:
    index, sparse = FakeStore("index"), FakeStore("sparse")
    embedder = FakeEmbedder()
    sparse_service = FakeSparse(sparse)
    index_service = FakeIndex(index)
    servers = [
        await _serve(lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(embedder, s)),
        await _serve(lambda s: index_pb2_grpc.add_IndexServiceServicer_to_server(index_service, s)),
        await _serve(lambda s: sparse_pb2_grpc.add_SparseServiceServicer_to_server(sparse_service, s)),
    ]
    addresses = {"embedder": servers[0][1], "index": servers[1][1], "sparse": servers[2][1]}
    yield Stores(index, sparse, embedder, sparse_service, addresses, index_service)
    for server, _ in servers:
        await server.stop(None)


# --- the harness ------------------------------------------------------------------------------


class Harness:
    """The ingestion API and workers of this process, on one real nats-server."""

    def __init__(
        self, nats_url: str, stores: Stores, objects: FakeObjectStore, data_dir: Path | None = None
    ) -> None:
        self.nats_url = nats_url
        # The API's status index lives here (one API at a time, as in a deployment).
        self.data_dir = data_dir
        self.stores = stores
        self.objects = objects
        self.api: Any = None
        self.workers: list[Any] = []
        self.nc: NATS | None = None
        self.overrides: dict[str, Any] = {}

    def settings(self, **overrides: Any) -> IngestionSettings:
        values: dict[str, Any] = {
            **PRODUCTION,
            "nats_url": self.nats_url,
            "embedder_address": self.stores.addresses["embedder"],
            "index_addresses": self.stores.addresses["index"],
            "sparse_addresses": self.stores.addresses["sparse"],
            "client_timeout_s": 10.0,
            **({"ingest_index_dir": self.data_dir / "api-index"} if self.data_dir else {}),
            **self.overrides,
            **overrides,
        }
        return IngestionSettings(**values)

    async def connect(self) -> NATS:
        if self.nc is None:
            self.nc = await nats.connect(self.nats_url)
        return self.nc

    async def start_api(self, **overrides: Any) -> Any:
        from services.ingestion.servicer import IngestionServicer

        self.api = IngestionServicer(self.settings(**overrides))
        await self.api.start()
        return self.api

    async def start_worker(self, name: str = "w", **overrides: Any) -> Any:
        from services.ingestion.worker import IngestWorker

        worker = IngestWorker(self.settings(ingest_worker_id=name, **overrides))
        await worker.start()
        self.workers.append(worker)
        return worker

    async def stop_worker(self, worker: Any) -> None:
        await worker.stop()
        self.workers.remove(worker)

    async def submit(
        self, collection: str, doc_id: str, content: str | bytes, fmt: int = MD
    ) -> ingestion_pb2.SubmitResult:
        return (await self.submit_many(collection, [(doc_id, content)], fmt))[0]

    async def submit_many(
        self, collection: str, docs: list[tuple[str, str | bytes]], fmt: int = MD
    ) -> list[ingestion_pb2.SubmitResult]:
        documents = [
            ingestion_pb2.Document(
                doc_id=doc_id, format=fmt, content=content.encode() if isinstance(content, str) else content
            )
            for doc_id, content in docs
        ]
        request = ingestion_pb2.IngestDocumentsRequest(collection=collection, documents=documents)
        reply = await self.api.IngestDocuments(request, None)
        return list(reply.results)

    async def dead_letters(self, collection: str = "") -> list[ingestion_pb2.DeadLetter]:
        request = ingestion_pb2.ListDeadLettersRequest(collection=collection, limit=10_000)
        return list((await self.api.ListDeadLetters(request, None)).dead_letters)

    async def status(self, collection: str, doc_id: str) -> ingestion_pb2.DocumentStatus:
        request = ingestion_pb2.GetDocumentStatusRequest(collection=collection, doc_ids=[doc_id])
        reply = await self.api.GetDocumentStatus(request, None)
        return reply.documents[0]

    async def raw_status(self, key: str) -> tuple[dict[str, Any], int]:
        """The status entry as JSON, read with a client of our own (not the code under test)."""
        kv = await (await self.connect()).jetstream().key_value(STATUS_BUCKET)
        entry = await kv.get(key)
        return json.loads(entry.value or b"{}"), int(entry.revision or 0)

    async def edit_status(self, key: str, **changes: Any) -> None:
        """Change fields of a status entry (compare-and-set, retried): what another party
        (a worker's claim, the passage of time) would have written."""
        kv = await (await self.connect()).jetstream().key_value(STATUS_BUCKET)
        for _ in range(50):
            raw, revision = await self.raw_status(key)
            raw.update(changes)
            try:
                await kv.update(key, json.dumps(raw).encode(), last=revision)
                return
            except Exception:
                await asyncio.sleep(0.01)
        raise AssertionError(f"could not edit the status of {key}")

    async def wait_state(
        self, collection: str, doc_id: str, state: int, timeout: float = 20.0
    ) -> ingestion_pb2.DocumentStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = await self.status(collection, doc_id)
            if status.state == state:
                return status
            if time.monotonic() > deadline:
                name = ingestion_pb2.DocumentState.Name(status.state)
                raise AssertionError(
                    f"{doc_id} is {name} ({status.reason!r}), not {ingestion_pb2.DocumentState.Name(state)}"
                )
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for worker in list(self.workers):
            with contextlib.suppress(Exception):
                await worker.stop()
        if self.api is not None:
            with contextlib.suppress(Exception):
                await self.api.stop()
        if self.nc is not None:
            await self.nc.close()


@pytest.fixture
async def harness(
    nats_url: str, fake_stores: Stores, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[Harness]:
    objects = FakeObjectStore()
    monkeypatch.setattr(ObjectStore, "from_settings", classmethod(lambda cls, settings: objects))
    running = Harness(nats_url, fake_stores, objects, tmp_path)
    try:
        yield running
    finally:
        await running.close()
