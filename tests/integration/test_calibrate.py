"""``ragmesh calibrate`` on the local stack as ``ragmesh up --secure`` runs it (API keys, TLS on
every hop, two workers, two index shards): it reads a collection's documents through the real
gateway, measures fused against reranked with the real cross-encoder on their pseudo-queries,
records the choice through the ingestion API (in the collection record in NATS), ``status``
shows it, and the gateway's searches that leave ``rerank`` unset follow it until it is cleared."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from meshkit.settings import GatewaySettings
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh_cli.main import main
from ragmesh_cli.stack import Stack

from .meshclients import Mesh
from .test_gateway import request, search
from .test_ingest import INDEXED, new_collection
from .test_reindex import scifact_subset
from .test_rerank import DOCS

pytestmark = pytest.mark.integration
CACHE_S = GatewaySettings().gateway_collection_cache_s


async def calibrate(stack: Stack, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    # In a thread: the command runs an event loop of its own.
    code = await asyncio.to_thread(main, ["calibrate", *args, "--state-dir", str(stack.state_dir)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def reranked_once_cached(
    gateway: gateway_pb2_grpc.GatewayServiceStub, collection: str, query: str, expected: bool
) -> bool:
    """Whether a search that leaves rerank unset reranks, once the gateway's record cache
    (gateway_collection_cache_s) shows the collection's record as it is now."""
    deadline = time.monotonic() + 5 * CACHE_S
    while True:
        found = (await search(gateway, request(collection, query, top_k=5), timeout=30)).reranked
        if found == expected or time.monotonic() > deadline:
            return found
        await asyncio.sleep(CACHE_S / 4)


async def test_calibrate_records_the_measured_choice_and_searches_follow_it(
    auth_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = auth_stack
    mesh = Mesh(stack)
    gateway = gateway_pb2_grpc.GatewayServiceStub(mesh.channel("gateway"))
    try:
        collection = new_collection()
        documents = [*scifact_subset(), *DOCS]
        await mesh.ingestion.IngestDocuments(
            ingestion_pb2.IngestDocumentsRequest(collection=collection, documents=documents), timeout=30
        )
        settled = await mesh.wait_settled(collection, [d.doc_id for d in documents])
        assert all(s.state == INDEXED for s in settled.values()), settled

        code, out, _ = await calibrate(stack, capsys, "--collection", collection, "--json")
        assert code == 0
        report = json.loads(out)
        assert report["documents"] == len(documents) and report["queries"] >= 30 and report["refused"] == 0
        assert set(report["measured"]) >= {"bm25", "dense", "fused", "reranked"}
        gain = report["reranked_vs_fused"]
        assert report["rerank"] == (gain["ci_high"] >= 0)

        status = await mesh.ingestion.GetCollectionStatus(
            ingestion_pb2.GetCollectionStatusRequest(collection=collection), timeout=10
        )
        recorded = status.calibration
        assert status.HasField("calibration") and recorded.rerank == report["rerank"]
        assert recorded.queries == report["queries"] and len(recorded.embedder_sha256) == 64
        assert recorded.rerank_gain == pytest.approx(gain["mean_diff"], abs=1e-6)

        # A search that leaves rerank unset follows the calibration; one that sets it, itself.
        query = "vitamin D and bone fractures"
        assert await reranked_once_cached(gateway, collection, query, report["rerank"]) == report["rerank"]
        opposite = await search(gateway, request(collection, query, top_k=5, rerank=not report["rerank"]), 30)
        assert opposite.reranked == (not report["rerank"])

        code, _, _ = await calibrate(stack, capsys, "--collection", collection, "--clear")
        assert code == 0
        status = await mesh.ingestion.GetCollectionStatus(
            ingestion_pb2.GetCollectionStatusRequest(collection=collection), timeout=10
        )
        assert not status.HasField("calibration")
        # The server default again (the test stack reranks).
        assert await reranked_once_cached(gateway, collection, query, True)
    finally:
        await mesh.close()


async def test_calibrating_a_small_collection_is_refused_and_records_nothing(
    auth_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = auth_stack
    mesh = Mesh(stack)
    try:
        collection = new_collection()
        await mesh.ingestion.IngestDocuments(
            ingestion_pb2.IngestDocumentsRequest(collection=collection, documents=DOCS), timeout=30
        )
        await mesh.wait_settled(collection, [d.doc_id for d in DOCS])
        code, _, err = await calibrate(stack, capsys, "--collection", collection)
        assert code == 1 and "at least 30 are needed" in err
        status = await mesh.ingestion.GetCollectionStatus(
            ingestion_pb2.GetCollectionStatusRequest(collection=collection), timeout=10
        )
        assert not status.HasField("calibration")
    finally:
        await mesh.close()
