"""Thin clients over a running stack for the integration tests: real gRPC channels to the
real services, plus the helpers the tests share (submit, wait, count, metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from meshkit.rpc.tls import ClientTLS, open_channel
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from ragmesh_cli.channels import api_key_interceptors
from ragmesh_cli.stack import ALL_SERVICES, Stack
from ragmesh_client import TLS, AsyncClient, RetryPolicy

# Every service but the LLM server, for stacks whose tests ask for no LLM answer (the local model
# would cost CPU for nothing they check). The secure stack of tests/integration/secure runs it.
SERVICES_WITHOUT_LLM = [kind for kind in ALL_SERVICES if kind != "llm"]

MD = ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN
TEXT = ingestion_pb2.DOCUMENT_FORMAT_TEXT
PDF = ingestion_pb2.DOCUMENT_FORMAT_PDF


class Mesh:
    """Stubs of the stack's services; on a secure stack, over TLS as ``tls``'s identity (the
    stack's ``ops`` by default) and with ``api_key`` on every call."""

    def __init__(self, stack: Stack, tls: ClientTLS | None = None, api_key: str | None = None) -> None:
        self.stack = stack
        self.tls = tls if tls is not None else (stack.client_tls() if stack.secure else None)
        self.api_key = api_key if api_key is not None else (stack.api_key() if stack.secure else None)
        self._channels: list[aio.Channel] = []
        self._clients: list[AsyncClient] = []
        self.ingestion = ingestion_pb2_grpc.IngestionServiceStub(self._channel("ingestion"))
        self.embedder = embedder_pb2_grpc.EmbedderServiceStub(self._channel("embedder"))
        # One replica per sparse shard (the first); ``sparse`` is shard 0, the only one of most stacks.
        self.sparse_shards = [
            sparse_pb2_grpc.SparseServiceStub(self._channel(replicas[0].name))
            for replicas in (stack.shard_replicas(i, "sparse") for i in range(stack.sparse_shards))
            if replicas
        ]
        self.sparse = self.sparse_shards[0]
        # One replica per shard (the first): replicas hold the same data once caught up.
        self.shards = [
            index_pb2_grpc.IndexServiceStub(self._channel(replicas[0].name))
            for replicas in (stack.shard_replicas(i) for i in range(stack.index_shards))
            if replicas
        ]

    def client(self, retry: RetryPolicy | None = None) -> AsyncClient:
        """A ragmesh_client to the stack's gateway and ingestion API as this identity, with this
        key; closed with the channels. Tests about behaviour use it; tests about the wire
        (metadata, identities, raw status details) keep the stubs. ``retry``: the client's
        policy (default: its own; RetryPolicy(max_attempts=1) where a test counts failures)."""
        tls = self.tls
        client = AsyncClient(
            self.stack.address("gateway"),
            ingestion=self.stack.address("ingestion"),
            api_key=self.api_key,
            tls=None if tls is None else TLS(tls.ca_file, tls.cert_file, tls.key_file, tls.server_name),
            retry=retry,
        )
        self._clients.append(client)
        return client

    def channel(self, name: str) -> aio.Channel:
        """A channel to one component, closed with the others."""
        return self._channel(name)

    def _channel(self, name: str) -> aio.Channel:
        interceptors = api_key_interceptors(self.api_key) if self.api_key else None
        channel = open_channel(
            self.stack.address(name),
            [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)],
            self.tls,
            interceptors,
        )
        self._channels.append(channel)
        return channel

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        for client in self._clients:
            await client.close()

    # --- ingestion ------------------------------------------------------------------------

    async def ingest(
        self,
        collection: str,
        docs: Sequence[tuple[str, str | bytes] | tuple[str, str | bytes, int]],
        fmt: int = MD,
    ) -> ingestion_pb2.IngestDocumentsResponse:
        """Submit documents; an entry may carry its own format as a third item."""
        documents = []
        for entry in docs:
            doc_id, body = entry[0], entry[1]
            documents.append(
                ingestion_pb2.Document(
                    doc_id=doc_id,
                    format=entry[2] if len(entry) == 3 else fmt,  # type: ignore[misc]
                    content=body.encode() if isinstance(body, str) else body,
                )
            )
        request = ingestion_pb2.IngestDocumentsRequest(collection=collection, documents=documents)
        return await self.ingestion.IngestDocuments(request, timeout=30)

    async def ingest_indexed(self, collection: str, docs: Sequence[tuple[str, str | bytes]]) -> None:
        """Submit documents and wait until every one is indexed (fails the test otherwise)."""
        await self.ingest(collection, docs)
        statuses = await self.wait_settled(collection, [d for d, _ in docs])
        assert all(s.state == ingestion_pb2.DOCUMENT_STATE_INDEXED for s in statuses.values()), statuses

    async def statuses(
        self, collection: str, doc_ids: Sequence[str]
    ) -> dict[str, ingestion_pb2.DocumentStatus]:
        reply = await self.ingestion.GetDocumentStatus(
            ingestion_pb2.GetDocumentStatusRequest(collection=collection, doc_ids=list(doc_ids)), timeout=10
        )
        return {d.doc_id: d for d in reply.documents}

    async def wait_settled(
        self,
        collection: str,
        doc_ids: Sequence[str],
        timeout: float = 120.0,
        want: int = ingestion_pb2.DOCUMENT_STATE_INDEXED,
    ) -> dict[str, ingestion_pb2.DocumentStatus]:
        """Until every document reaches ``want`` (or FAILED); fails the test on timeout."""
        deadline = time.monotonic() + timeout
        final = {want, ingestion_pb2.DOCUMENT_STATE_FAILED}
        while True:
            statuses: dict[str, ingestion_pb2.DocumentStatus] = {}
            for i in range(0, len(doc_ids), 500):
                statuses.update(await self.statuses(collection, doc_ids[i : i + 500]))
            if all(s.state in final for s in statuses.values()):
                return statuses
            if time.monotonic() > deadline:
                pending = {
                    k: ingestion_pb2.DocumentState.Name(v.state)
                    for k, v in statuses.items()
                    if v.state not in final
                }
                raise AssertionError(f"not settled after {timeout}s: {dict(list(pending.items())[:10])}")
            await asyncio.sleep(0.2)

    # --- stores ---------------------------------------------------------------------------

    async def embed_query(self, text: str) -> list[float]:
        reply = await self.embedder.Embed(
            embedder_pb2.EmbedRequest(texts=[text], kind=embedder_pb2.TEXT_KIND_QUERY), timeout=30
        )
        return list(reply.vectors[0].values)

    async def dense_search(self, collection: str, query: str, top_k: int = 10) -> list[index_pb2.SearchHit]:
        vector = common_pb2.Vector(values=await self.embed_query(query))
        hits: list[index_pb2.SearchHit] = []
        for shard in self.shards:
            reply = await shard.Search(
                index_pb2.SearchRequest(collection=collection, vector=vector, top_k=top_k), timeout=10
            )
            hits.extend(reply.hits)
        return sorted(hits, key=lambda h: -h.score)[:top_k]

    async def bm25(self, collection: str, query: str, top_k: int = 10) -> list[sparse_pb2.SearchHit]:
        reply = await self.sparse.SearchBm25(
            sparse_pb2.SearchBm25Request(collection=collection, query=query, top_k=top_k), timeout=10
        )
        return list(reply.hits)

    async def index_chunks(self, collection: str) -> int:
        total = 0
        for shard in self.shards:
            try:
                reply = await shard.GetStats(index_pb2.GetStatsRequest(collection=collection), timeout=10)
            except aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                continue
            total += reply.chunks
        return total

    async def sparse_stats(self, collection: str) -> sparse_pb2.GetStatsResponse:
        return await self.sparse.GetStats(sparse_pb2.GetStatsRequest(collection=collection), timeout=10)

    async def sparse_chunks_of(self, collection: str, doc_id: str) -> list[sparse_pb2.SearchHit]:
        """Every chunk of a document in the sparse store (a filtered exact search on a word
        the test documents all contain)."""
        reply = await self.sparse.SearchExact(
            sparse_pb2.SearchExactRequest(
                collection=collection, keywords=["ragmesh"], top_k=1000, doc_ids=[doc_id]
            ),
            timeout=10,
        )
        return list(reply.hits)

    def metric(self, component: str, name: str) -> float:
        """Sum of a Prometheus counter scraped from a component's /metrics."""
        port = self.stack.component(component).ports["metrics"]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        total = 0.0
        for match in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", body, re.MULTILINE):
            total += float(match.group(1))
        return total

    def stage_metric(self, kind: str, name: str) -> float:
        """A counter summed over every replica of a stage (callers balance over them)."""
        return sum(self.metric(replica, name) for replica in replicas_of(self.stack, kind))


# --- load and resource accounting (fault and soak tests) --------------------------------------


def rss_kib(pid: int | None) -> int | None:
    """Resident memory of a process (VmRSS, KiB); None when it is not running."""
    if not pid:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (in parentheses) may hold spaces: the parent pid follows it.
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    return children


def stack_rss_kib(stack: Stack) -> dict[str, int | None]:
    """VmRSS of every component of the stack, by name: its process and all its descendants (a
    service run with several worker processes counts them all); None when it is not running."""
    children = _children_by_parent()
    report: dict[str, int | None] = {}
    for name in stack.names():
        pid = stack.component(name).pid
        own = rss_kib(pid)
        if pid is None or own is None:
            report[name] = None
            continue
        pending, total = list(children.get(pid, [])), own
        while pending:
            child = pending.pop()
            total += rss_kib(child) or 0
            pending.extend(children.get(child, []))
        report[name] = total
    return report


@dataclass
class Call:
    """One RPC (or one logical operation) made by a load loop."""

    kind: str
    started: float
    ended: float | None = None
    # None: it succeeded. Otherwise what went wrong: a status code, or an unexpected answer.
    problem: str | None = None


class CallLog:
    """Every call a load generator made, with its outcome and timing: lets a test say exactly
    which calls were in flight at a given moment and which ones failed."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    async def run(self, kind: str, work: Callable[[], Awaitable[str | None]]) -> Call:
        """Run ``work``; it returns None when the answer is as expected, else a description.
        A gRPC error is recorded as a failure; anything else is a test bug and propagates."""
        call = Call(kind, time.monotonic())
        self.calls.append(call)
        try:
            call.problem = await work()
        except aio.AioRpcError as exc:
            call.problem = f"{exc.code().name}: {exc.details()}"
        finally:
            call.ended = time.monotonic()
        return call

    def failed(self) -> list[Call]:
        return [c for c in self.calls if c.ended is not None and c.problem is not None]

    def finished_since(self, moment: float) -> list[Call]:
        """Calls started after ``moment`` that have ended."""
        return [c for c in self.calls if c.started > moment and c.ended is not None]

    def in_flight_during(self, start: float, end: float) -> list[Call]:
        """Calls that were running at some instant of [start, end]."""
        return [c for c in self.calls if c.started <= end and (c.ended is None or c.ended >= start)]

    def summary(self) -> dict[str, dict[str, int]]:
        """kind -> {"ok": n, "failed": n}."""
        out: dict[str, dict[str, int]] = {}
        for call in self.calls:
            counts = out.setdefault(call.kind, {"ok": 0, "failed": 0})
            counts["failed" if call.problem is not None else "ok"] += 1
        return out


async def drive(
    log: CallLog,
    kind: str,
    work: Callable[[], Awaitable[str | None]],
    stop: asyncio.Event,
    pause_s: float = 0.0,
) -> None:
    """Call ``work`` back to back (with ``pause_s`` between calls) until ``stop`` is set."""
    while not stop.is_set():
        await log.run(kind, work)
        if pause_s:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause_s)


def replicas_of(stack: Stack, kind: str) -> list[str]:
    """Every component of ``kind`` (a stage run as several replicas has one per replica): a test
    that takes a stage down must take all of them, the gateway routes around one."""
    return [name for name in stack.names() if stack.component(name).kind == kind]
