"""The read path end to end on real servers: ingest a small corpus, search it through the
gateway, then take the sparse service away (stopped, then slowed down by a proxy) and check
that searches still answer from the remaining legs, with the right degradations, within the
caller's deadline, and that they are whole again once sparse is back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from grpc import aio

from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh_cli.stack import Stack

from .meshclients import Mesh
from .test_ingest import new_collection

pytestmark = pytest.mark.integration

DOCS = [
    (
        "volcano.md",
        "# Volcanoes\n\nMagma chambers erupt through vents as lava. Basalt flows cool into new rock "
        "and ash clouds drift for hundreds of kilometres.",
    ),
    (
        "bread.md",
        "# Baking\n\nSourdough bread needs a starter culture of wild yeast and a long, slow "
        "fermentation before the loaf is baked.",
    ),
    (
        "errors.md",
        "# Error codes\n\nError ERR-4312 means the flux capacitor overheated; let it cool for ten "
        "minutes and restart the device.",
    ),
    (
        "tides.md",
        "# Tides\n\nThe moon's gravity pulls the oceans, raising high tides twice a day along most coasts.",
    ),
]
DENSE, BM25, EXACT = pb.LEG_DENSE, pb.LEG_BM25, pb.LEG_EXACT
# TEST_ENV in conftest: breakers close again after a second.
BREAKER_RESET_S = 1.0


@pytest.fixture(scope="module")
async def corpus(stack: Stack) -> AsyncIterator[str]:
    if "gateway" not in stack.services:
        pytest.skip("the gateway service is not in this checkout")
    mesh = Mesh(stack)
    try:
        collection = new_collection()
        await mesh.ingest_indexed(collection, DOCS)
        yield collection
    finally:
        await mesh.close()


def request(collection: str, query: str, **fields: object) -> pb.SearchRequest:
    return pb.SearchRequest(collection=collection, query=query, **fields)


async def search(
    gateway: gateway_pb2_grpc.GatewayServiceStub, query: pb.SearchRequest, timeout: float
) -> pb.SearchResponse:
    # wait_for_ready: the gateway may have just restarted, with our channel still in backoff.
    return await gateway.Search(query, timeout=timeout, wait_for_ready=True)


def unexpected(response: pb.SearchResponse, stack: Stack) -> list[pb.Degradation]:
    """Degradations a healthy mesh should not show (a planner-less checkout loses the plan)."""
    allowed = set() if "planner" in stack.services else {pb.STAGE_PLANNER}
    return [d for d in response.degradations if d.stage not in allowed]


def sparse_degradation(response: pb.SearchResponse) -> pb.Degradation:
    found = [d for d in response.degradations if d.stage == pb.STAGE_SPARSE]
    assert len(found) == 1, response.degradations
    return found[0]


async def test_search_fuses_every_leg_with_ranks_and_text(
    stack: Stack, corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    # Fused order is what this test checks: reranking has its own tests (test_rerank.py).
    response = await search(
        gateway,
        request(corpus, "what does error ERR-4312 mean", include_leg_results=True, rerank=False),
        timeout=10,
    )
    assert not unexpected(response, stack)
    top = response.results[0]
    assert top.doc_id == "errors.md"
    assert "ERR-4312" in top.text and top.title
    legs = {r.leg: r for r in top.leg_ranks}
    assert DENSE in legs and BM25 in legs and all(r.rank >= 1 for r in top.leg_ranks)
    assert top.fused_score > 0
    assert [r.fused_score for r in response.results] == sorted(
        (r.fused_score for r in response.results), reverse=True
    )
    listed = {lr.leg for lr in response.leg_results}
    assert {DENSE, BM25} <= listed
    if "ERR-4312" in response.plan.hard_keywords:
        assert EXACT in listed and EXACT in legs
    assert {t.stage for t in response.timings} >= {"planner", "embed", "dense", "bm25", "fuse", "hydrate"}

    collapsed = await search(
        gateway,
        request(corpus, "lava and magma from volcanoes", collapse_documents=True, top_k=4),
        timeout=10,
    )
    assert collapsed.results[0].doc_id == "volcano.md"
    assert len({r.doc_id for r in collapsed.results}) == len(collapsed.results)


async def test_short_deadline_answers_or_fails_fast_never_hangs(
    corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    for _ in range(3):
        started = time.monotonic()
        try:
            response = await search(gateway, request(corpus, "sourdough starter"), timeout=0.3)
        except aio.AioRpcError as exc:
            assert exc.code().name == "DEADLINE_EXCEEDED"
        else:
            assert response.results
        assert time.monotonic() - started < 0.5


class SlowProxy:
    """A TCP relay that holds every byte coming back from the upstream for ``delay_s``: the
    sparse service as the gateway sees it becomes slow without touching its code."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        self.host, port = upstream.rsplit(":", 1)
        self.port = int(port)
        self.delay_s = delay_s
        self.server: asyncio.Server | None = None
        self.relays: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.relays:
            task.cancel()
        await asyncio.gather(*self.relays, return_exceptions=True)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._relay(reader, writer))
        self.relays.add(task)
        task.add_done_callback(self.relays.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, slow=False),
                self._pipe(up_reader, writer, slow=True),
                return_exceptions=True,
            )
        finally:
            for w in (writer, up_writer):
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slow: bool) -> None:
        while data := await reader.read(65536):
            if slow and self.delay_s:
                await asyncio.sleep(self.delay_s)
            writer.write(data)
            await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def gateway_env(stack: Stack, **env: str) -> AsyncIterator[None]:
    """Restart the gateway process with extra environment, and restore it afterwards."""
    component = stack.component("gateway")
    saved = dict(component.env)
    await asyncio.to_thread(stack.stop, "gateway")
    component.env.update(env)
    try:
        await asyncio.to_thread(stack.start, "gateway")
        yield
    finally:
        await asyncio.to_thread(stack.stop, "gateway")
        component.env.clear()
        component.env.update(saved)
        await asyncio.to_thread(stack.start, "gateway")


async def test_slow_sparse_is_cut_at_the_deadline(
    stack: Stack, corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    proxy = SlowProxy(stack.address("sparse"), delay_s=0.0)
    address = await proxy.start()
    try:
        async with gateway_env(stack, RAGMESH_SPARSE_ADDRESSES=address):
            # Through the proxy at full speed: the search is whole (the relay itself works).
            whole = await search(gateway, request(corpus, "sourdough starter culture"), timeout=10)
            assert not unexpected(whole, stack) and whole.results[0].doc_id == "bread.md"
            assert BM25 in {r.leg for r in whole.results[0].leg_ranks}

            proxy.delay_s = 3.0
            deadline_s = 1.5
            started = time.monotonic()
            cut = await search(gateway, request(corpus, "sourdough starter culture"), timeout=deadline_s)
            elapsed = time.monotonic() - started
            assert elapsed < deadline_s
            degraded = sparse_degradation(cut)
            assert degraded.reason == pb.DEGRADATION_REASON_DEADLINE
            assert BM25 in degraded.legs
            assert cut.results and all(BM25 not in {r.leg for r in x.leg_ranks} for x in cut.results)
            assert cut.results[0].doc_id == "bread.md"  # dense alone still finds it
            proxy.delay_s = 0.0
    finally:
        await proxy.stop()


async def test_sparse_down_degrades_opens_breaker_and_recovers(
    stack: Stack, corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    query = request(corpus, "moon gravity and ocean tides")
    await asyncio.to_thread(stack.stop, "sparse")
    try:
        reasons = []
        for _ in range(6):  # breaker_fail_max (5) failures at most, then the breaker refuses
            response = await search(gateway, query, timeout=10)
            assert response.results and response.results[0].doc_id == "tides.md"
            degraded = sparse_degradation(response)
            # Hydration falls back to the index shards' stored payload.
            assert response.results[0].text and degraded.fallback == pb.FALLBACK_INDEX_PAYLOAD
            assert set(degraded.legs) >= {BM25}
            reasons.append(degraded.reason)
            if degraded.reason == pb.DEGRADATION_REASON_BREAKER_OPEN:
                break
        assert reasons[0] == pb.DEGRADATION_REASON_UNAVAILABLE
        assert reasons[-1] == pb.DEGRADATION_REASON_BREAKER_OPEN
    finally:
        await asyncio.to_thread(stack.start, "sparse")

    # After breaker_reset_s the breaker lets a trial call through; it succeeds and closes.
    await asyncio.sleep(BREAKER_RESET_S)
    deadline = time.monotonic() + 20
    while True:
        response = await search(gateway, query, timeout=10)
        if not unexpected(response, stack):
            break
        assert time.monotonic() < deadline, f"still degraded: {response.degradations}"
        await asyncio.sleep(0.3)
    top = response.results[0]
    assert top.doc_id == "tides.md" and "moon" in top.text
    assert BM25 in {r.leg for r in top.leg_ranks}
