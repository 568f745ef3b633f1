"""The reranker tier on the local stack: the gateway reranks fused candidates with the real
cross-encoder service; with the reranker killed it answers in fused order with a ``reranker``
degradation, and it reranks again once the reranker is back. Also: a model directory fetched
from the real S3 server loads and scores like the local one."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from meshkit.settings import GatewaySettings, MeshSettings, RerankerSettings
from meshkit.storage.objectstore import ObjectStore
from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh_cli.documents import WalkStats, parse_corpus_lines
from ragmesh_cli.stack import Stack
from services.reranker.fetch import fetch_model_dir
from services.reranker.model import CrossEncoderModel, ModelLoadError

from .meshclients import Mesh, replicas_of
from .test_gateway import request, search
from .test_ingest import INDEXED, new_collection

pytestmark = pytest.mark.integration
# The gateway's keep-fused margin as the test stack runs it (the settings' default).
SERVER_MARGIN = GatewaySettings().calibration.rerank_keep_fused_margin

# A known case from SciFact's test split (claim 212 and five abstracts from its corpus, kept in
# data/rerank_case.jsonl): fusion ranks the abstract that answers last of five, because the
# claim says "CR" where the abstract says "caloric restriction"; the cross-encoder scores it highest.
QUESTION = "CR is associated with higher methylation age."
CASE = Path(__file__).parent / "data" / "rerank_case.jsonl"
# Read with the CLI's own BEIR reader: the documents go in exactly as `ragmesh ingest` sends them.
DOCS = list(parse_corpus_lines(CASE.read_text().splitlines(), str(CASE), WalkStats()))
ANSWER = "22038539"
BREAKER_RESET_S = 1.0


async def ingest_case(stack: Stack) -> str:
    """The known case's abstracts in a new collection, every one indexed (also read by the
    answer tests)."""
    mesh = Mesh(stack)
    try:
        collection = new_collection()
        request = ingestion_pb2.IngestDocumentsRequest(collection=collection, documents=DOCS)
        await mesh.ingestion.IngestDocuments(request, timeout=30)
        statuses = await mesh.wait_settled(collection, [d.doc_id for d in DOCS])
        assert all(s.state == INDEXED for s in statuses.values()), statuses
        return collection
    finally:
        await mesh.close()


@pytest.fixture(scope="module")
async def corpus(stack: Stack) -> str:
    if not {"gateway", "reranker"} <= set(stack.services):
        pytest.skip("the gateway or reranker service is not in this checkout")
    return await ingest_case(stack)


def question(collection: str, rerank: bool, margin: float | None = 0.0) -> pb.SearchRequest:
    """The hard case. Margin 0 by default: these tests are about the reranker's own order (the
    server's keep-fused margin has its own test below)."""
    asked = request(collection, QUESTION, collapse_documents=True, top_k=len(DOCS), rerank=rerank)
    if margin is not None:
        asked.keep_fused_margin = margin
    return asked


def reranker_degradations(response: pb.SearchResponse) -> list[pb.Degradation]:
    return [d for d in response.degradations if d.stage == pb.STAGE_RERANKER]


def position(response: pb.SearchResponse, doc_id: str) -> int:
    return [r.doc_id for r in response.results].index(doc_id) + 1


async def test_rerank_lifts_the_answer(corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub) -> None:
    fused = await search(gateway, question(corpus, rerank=False), timeout=30)
    assert not fused.reranked and position(fused, ANSWER) >= 4, "the known case is no longer hard"
    assert all(not r.HasField("rerank_score") for r in fused.results)

    reranked = await search(gateway, question(corpus, rerank=True), timeout=30)
    assert reranked.reranked and not reranker_degradations(reranked)
    order = [(r.doc_id, round(r.rerank_score, 2), r.fused_rank) for r in reranked.results]
    # The cross-encoder scores the answer highest; the final order, which also weighs the fused
    # rank (rerank_fused_weight), moves it up to the top two.
    assert max(reranked.results, key=lambda r: r.rerank_score).doc_id == ANSWER, order
    assert position(reranked, ANSWER) <= 2, order
    assert all(r.HasField("rerank_score") for r in reranked.results)
    # Each result keeps its place in the fused list next to its rerank score.
    by_doc = {r.doc_id: i + 1 for i, r in enumerate(fused.results)}
    assert all(r.fused_rank == by_doc[r.doc_id] for r in reranked.results)
    assert "rerank" in {t.stage for t in reranked.timings}


async def test_the_servers_margin_keeps_the_fused_order_only_on_a_near_tie(
    corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    fused = await search(gateway, question(corpus, rerank=False), timeout=30)
    judged = await search(gateway, question(corpus, rerank=True, margin=None), timeout=30)
    assert judged.reranked and not reranker_degradations(judged)
    scores = {r.doc_id: r.rerank_score for r in judged.results if r.HasField("rerank_score")}
    first = fused.results[0].doc_id
    near_tie = first in scores and max(scores.values()) - scores[first] <= SERVER_MARGIN
    if near_tie:
        assert [r.doc_id for r in judged.results] == [r.doc_id for r in fused.results], scores
    else:
        assert position(judged, ANSWER) <= 2, scores


async def test_reranker_killed_gives_fused_order_then_recovers(
    stack: Stack, corpus: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    fused = await search(gateway, question(corpus, rerank=False), timeout=30)
    fused_order = [r.doc_id for r in fused.results]
    # Every replica: the gateway balances over them and would route around just one.
    replicas = replicas_of(stack, "reranker")
    for name in replicas:
        await asyncio.to_thread(stack.kill, name)
    try:
        started = time.monotonic()
        degraded = await search(gateway, question(corpus, rerank=True), timeout=5)
        assert time.monotonic() - started < 5
        assert not degraded.reranked
        assert [r.doc_id for r in degraded.results] == fused_order
        assert all(not r.HasField("rerank_score") for r in degraded.results)
        found = reranker_degradations(degraded)
        assert len(found) == 1, degraded.degradations
        assert found[0].reason in (pb.DEGRADATION_REASON_UNAVAILABLE, pb.DEGRADATION_REASON_BREAKER_OPEN)
        assert len(degraded.degradations) == 1  # the retrieval legs are untouched
    finally:
        for name in replicas:
            await asyncio.to_thread(stack.start, name)

    await asyncio.sleep(BREAKER_RESET_S)
    deadline = time.monotonic() + 30
    while True:
        back = await search(gateway, question(corpus, rerank=True), timeout=30)
        if back.reranked:
            break
        assert time.monotonic() < deadline, f"still not reranked: {back.degradations}"
        await asyncio.sleep(0.3)
    assert position(back, ANSWER) <= 2 and not back.degradations


async def test_model_directory_from_the_object_store(stack: Stack, tmp_path: Path) -> None:
    """Upload the bundled model to the stack's S3 server, fetch it back, load it, score with it;
    a tampered upload is refused and leaves no model folder in the cache."""
    local = RerankerSettings().reranker_model_dir
    env = stack.client_env()
    settings = MeshSettings(
        s3_endpoint=env["RAGMESH_S3_ENDPOINT"],
        s3_access_key=env["RAGMESH_S3_ACCESS_KEY"],
        s3_secret_key=env["RAGMESH_S3_SECRET_KEY"],
    )
    objects = ObjectStore.from_settings(settings)
    bucket, prefix = settings.models_bucket, f"{new_collection()}/reranker"
    await objects.ensure_bucket(bucket)
    for path in sorted(local.iterdir()):
        await objects.put_file(bucket, f"{prefix}/{path.name}", str(path))

    fetched = await fetch_model_dir(objects, f"s3://{bucket}/{prefix}", tmp_path / "cache")
    remote = await asyncio.to_thread(CrossEncoderModel.load, fetched)
    here = await asyncio.to_thread(CrossEncoderModel.load, local)
    passages = [d.content.decode() for d in DOCS]
    assert remote.score(QUESTION, passages)[0].tolist() == here.score(QUESTION, passages)[0].tolist()

    tampered = tmp_path / "tampered"
    shutil.copytree(local, tampered)
    (tampered / "tokenizer.json").write_text("{}")
    await objects.put_file(bucket, f"{prefix}-bad/manifest.json", str(tampered / "manifest.json"))
    await objects.put_file(bucket, f"{prefix}-bad/model.onnx", str(tampered / "model.onnx"))
    await objects.put_file(bucket, f"{prefix}-bad/tokenizer.json", str(tampered / "tokenizer.json"))
    with pytest.raises(ModelLoadError, match="integrity"):
        await fetch_model_dir(objects, f"s3://{bucket}/{prefix}-bad", tmp_path / "cache2")
    assert not [p for p in (tmp_path / "cache2").iterdir() if not p.name.startswith(".")]
