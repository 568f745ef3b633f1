"""The secure local stack (``ragmesh up --secure``): API keys on the public services, mTLS with a
certificate per service identity on every gRPC hop, NATS over TLS with a user per service, S3
over HTTPS with a key per service; two index shards, two ingestion workers, two embedder
replicas and a gateway of two processes, production timings (no test overrides of lease, ack
wait or deliveries).

- a full ingest -> search -> ask works with all of it on, through the API and the CLI;
- the LLM server answers only callers with the stack's LLM key, which the answer stages hold;
- nobody without a mesh certificate gets anything from an internal stage (plaintext or TLS),
  whatever the method (sparse GetChunks and Delete, index Search, embedder Embed ...);
- a mesh identity reaches only the methods its service is allowed to call;
- tenant A's key reaches nothing of tenant B's collection, by any public method.

NATS and S3 grants, and each process's own credentials: test_secure_grants.py (the same stack,
one for both files: conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc import aio

from meshkit.rpc.identity import EMBEDDER, EXTRACTOR, GATEWAY, INDEX, INGESTION, INGESTION_WORKER, SPARSE
from meshkit.rpc.tls import ClientTLS, open_channel
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.extractor.v1 import extractor_pb2, extractor_pb2_grpc
from ragmesh.gateway.v1 import gateway_pb2 as gw
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2 as ing
from ragmesh.ingestion.v1 import ingestion_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
from ragmesh.planner.v1 import planner_pb2, planner_pb2_grpc
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from ragmesh_cli import channels
from ragmesh_cli.main import main
from ragmesh_cli.stack import Stack
from tests.integration.meshclients import Mesh

from .secure_mesh import ALPHA, BETA, BROKEN, refused, tenant

pytestmark = pytest.mark.integration


# ------------------------------------------------------------------ the happy path, auth on


async def test_ingest_search_and_ask_with_everything_on(
    secure_stack: Stack, indexed: dict[str, list[str]]
) -> None:
    mesh = tenant(secure_stack, "tenant-a")
    try:
        gateway = gateway_pb2_grpc.GatewayServiceStub(mesh.channel("gateway"))
        found = await gateway.Search(
            gw.SearchRequest(collection=ALPHA, query="how do I rotate an API key?"), timeout=30
        )
        assert found.results and found.results[0].doc_id == "rotation.md", found
        assert not found.degradations, found.degradations
        question = gw.AskRequest(
            collection=ALPHA, query="How do I rotate an API key?", mode=gw.ANSWER_MODE_EXTRACTIVE
        )
        events = await _drain(gateway.AskStream(gw.AskStreamRequest(request=question), timeout=90))
        answer = events[-1].answer
        assert answer.answered and answer.citations, answer
        # Every stage answered over mTLS: nothing was skipped.
        assert not answer.degradations, answer.degradations
        assert {c.doc_id for c in answer.citations} <= set(indexed[ALPHA])
    finally:
        await mesh.close()


async def test_the_llm_server_answers_the_answer_stages_only(
    secure_stack: Stack, indexed: dict[str, list[str]]
) -> None:
    """llama.cpp here has no TLS: its bearer key is what keeps other local processes off it."""
    assert secure_stack.secrets is not None
    url = f"http://{secure_stack.address('llm')}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4}
    tenant_key = secure_stack.api_key("tenant-a")
    async with httpx.AsyncClient(timeout=60) as client:
        for headers in ({}, {"Authorization": f"Bearer {tenant_key}"}):
            assert (await client.post(url, json=body, headers=headers)).status_code == 401, headers
        key = secure_stack.secrets.llm_api_key()
        allowed = await client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
        assert allowed.status_code == 200, allowed.text
    mesh = tenant(secure_stack, "tenant-a")
    try:
        gateway = gateway_pb2_grpc.GatewayServiceStub(mesh.channel("gateway"))
        question = gw.AskRequest(
            collection=ALPHA, query="How do I rotate an API key?", mode=gw.ANSWER_MODE_LLM
        )
        answer = await gateway.Ask(question, timeout=120)
        assert answer.answered and answer.citations, answer
        # Extractor and narrator reached the model: at most its output was refused (invalid, or
        # looping: the small local model does loop).
        refused = (gw.DEGRADATION_REASON_INVALID_OUTPUT, gw.DEGRADATION_REASON_DEGENERATE_OUTPUT)
        failed = [d for d in answer.degradations if d.reason not in refused]
        assert not failed, failed
    finally:
        await mesh.close()


def test_the_cli_works_unchanged_on_a_secure_stack(
    secure_stack: Stack,
    indexed: dict[str, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for name in [n for n in os.environ if n.startswith("RAGMESH_")]:
        monkeypatch.delenv(name)
    state = ["--state-dir", str(secure_stack.state_dir)]
    assert main([*state, "search", "request limits RESOURCE_EXHAUSTED", "--collection", ALPHA, "--json"]) == 0
    assert "limits.md" in capsys.readouterr().out
    assert main([*state, "status", "--collection", BETA, "--json"]) == 0  # ops reads every collection
    assert '"indexed": 1' in capsys.readouterr().out
    # A sync's dry run lists the collection (ListDocuments) with the CLI's key over TLS.
    (tmp_path / "new.md").write_text("# New\n\nA page.\n")
    assert main([*state, "ingest", str(tmp_path), "--collection", ALPHA, "--sync", "--dry-run"]) == 0
    assert "would add: 1\n  new.md" in capsys.readouterr().out
    # The command's TLS and key are gone once it returned: nothing leaks into later tests.
    assert channels.client_tls() is None and channels.api_key() == ""


# ------------------------------------------------------------------ internal stages


def internal_calls(
    stack: Stack, chunk_ids: Sequence[str] = ("0" * 32,)
) -> list[tuple[str, str, Callable[[aio.Channel], Awaitable[Any]]]]:
    """One call to each internal stage that would hand out or change data: (component, name, call);
    GetChunks asks for ``chunk_ids`` (tenant B's)."""
    vector = common_pb2.Vector(values=[0.1] * 384)
    passage = reranker_pb2.Passage(id="a", text="t")
    excerpt = extractor_pb2.Passage(id="a", text="t")
    return [
        ("sparse", "GetChunks", lambda ch: sparse_pb2_grpc.SparseServiceStub(ch).GetChunks(
            sparse_pb2.GetChunksRequest(collection=BETA, chunk_ids=list(chunk_ids)), timeout=5)),
        ("sparse", "SearchBm25", lambda ch: sparse_pb2_grpc.SparseServiceStub(ch).SearchBm25(
            sparse_pb2.SearchBm25Request(collection=BETA, query="zanzibarite", top_k=5), timeout=5)),
        ("sparse", "Delete", lambda ch: sparse_pb2_grpc.SparseServiceStub(ch).Delete(
            sparse_pb2.DeleteRequest(collection=BETA, doc_ids=["secret.md"]), timeout=5)),
        *[
            (f"index-{i}", "Search", lambda ch: index_pb2_grpc.IndexServiceStub(ch).Search(
                index_pb2.SearchRequest(collection=BETA, vector=vector, top_k=5), timeout=5))
            for i in range(stack.index_shards)
        ],
        ("index-0", "Delete", lambda ch: index_pb2_grpc.IndexServiceStub(ch).Delete(
            index_pb2.DeleteRequest(collection=BETA, doc_ids=["secret.md"]), timeout=5)),
        ("embedder", "Embed", lambda ch: embedder_pb2_grpc.EmbedderServiceStub(ch).Embed(
            embedder_pb2.EmbedRequest(texts=["hello"]), timeout=5)),
        ("planner", "Plan", lambda ch: planner_pb2_grpc.PlannerServiceStub(ch).Plan(
            planner_pb2.PlanRequest(query="hello"), timeout=5)),
        ("reranker", "Rerank", lambda ch: reranker_pb2_grpc.RerankerServiceStub(ch).Rerank(
            reranker_pb2.RerankRequest(query="q", passages=[passage]), timeout=5)),
        ("extractor", "Extract", lambda ch: extractor_pb2_grpc.ExtractorServiceStub(ch).Extract(
            extractor_pb2.ExtractRequest(query="q", passages=[excerpt]), timeout=5)),
        ("narrator", "Narrate", lambda ch: narrator_pb2_grpc.NarratorServiceStub(ch).Narrate(
            narrator_pb2.NarrateRequest(query="q"), timeout=5)),
    ]  # fmt: skip


async def test_nobody_without_a_mesh_certificate_reaches_an_internal_stage(
    secure_stack: Stack, indexed: dict[str, list[str]]
) -> None:
    ops = Mesh(secure_stack)
    try:
        secret_chunks = [hit.chunk_id for hit in await ops.bm25(BETA, "zanzibarite")]
        assert secret_chunks
        ca = secure_stack.client_tls().ca_file
        anonymous: list[ClientTLS | None] = [None, ClientTLS(ca, server_name="localhost")]
        outcomes = {}
        for component, method, call in internal_calls(secure_stack, secret_chunks):
            for tls in anonymous:
                async with open_channel(secure_stack.address(component), tls=tls) as channel:
                    outcomes[(component, method, tls is not None)] = await refused(call(channel))
        # No TLS handshake without a certificate from the mesh CA: the call never reaches a handler.
        assert set(outcomes.values()) == {grpc.StatusCode.UNAVAILABLE}, outcomes
        # Tenant B's document is intact after the anonymous Delete attempts, in both stores.
        chunks = await ops.sparse.GetChunks(
            sparse_pb2.GetChunksRequest(collection=BETA, chunk_ids=secret_chunks), timeout=10
        )
        assert all("zanzibarite" in c.text for c in chunks.chunks) and len(chunks.chunks) == len(
            secret_chunks
        )
        assert await ops.index_chunks(BETA) >= 1
    finally:
        await ops.close()


async def test_each_identity_reaches_only_what_its_service_calls(
    secure_stack: Stack, indexed: dict[str, list[str]]
) -> None:
    calls = {(c, m): call for c, m, call in internal_calls(secure_stack)}
    denied = [
        (EMBEDDER, "sparse", "Delete"),
        (EMBEDDER, "sparse", "GetChunks"),
        (GATEWAY, "sparse", "Delete"),
        (GATEWAY, "index-0", "Delete"),
        (INGESTION_WORKER, "sparse", "GetChunks"),
        (INGESTION_WORKER, "index-1", "Search"),
        (EXTRACTOR, "narrator", "Narrate"),
        (INDEX, "embedder", "Embed"),
        (SPARSE, "index-0", "Search"),
        (INGESTION, "sparse", "SearchBm25"),
    ]
    for identity, component, method in denied:
        async with open_channel(
            secure_stack.address(component), tls=secure_stack.client_tls(identity)
        ) as channel:
            with pytest.raises(aio.AioRpcError) as err:
                await calls[(component, method)](channel)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, (identity, component, method)
        assert f"identity '{identity}' may not call" in (err.value.details() or "")
    # The callers the mesh needs get through (GetChunks reads what the gateway hydrates).
    for identity, component, method in [(GATEWAY, "sparse", "SearchBm25"), (EXTRACTOR, "embedder", "Embed")]:
        async with open_channel(
            secure_stack.address(component), tls=secure_stack.client_tls(identity)
        ) as channel:
            await calls[(component, method)](channel)


# ------------------------------------------------------------------ tenants


async def test_tenant_a_reaches_nothing_of_collection_b(
    secure_stack: Stack, indexed: dict[str, list[str]]
) -> None:
    a = tenant(secure_stack, "tenant-a")
    try:
        gateway = gateway_pb2_grpc.GatewayServiceStub(a.channel("gateway"))
        api = a.ingestion
        ask = gw.AskRequest(collection=BETA, query="launch code word", mode=gw.ANSWER_MODE_EXTRACTIVE)
        attempts: dict[str, Awaitable[Any]] = {
            "Search": gateway.Search(gw.SearchRequest(collection=BETA, query="zanzibarite"), timeout=10),
            "Ask": gateway.Ask(ask, timeout=10),
            "AskStream": _drain(gateway.AskStream(gw.AskStreamRequest(request=ask), timeout=10)),
            "GetDocumentStatus": api.GetDocumentStatus(
                ing.GetDocumentStatusRequest(collection=BETA, doc_ids=["secret.md"]), timeout=10
            ),
            "GetCollectionStatus": api.GetCollectionStatus(
                ing.GetCollectionStatusRequest(collection=BETA), timeout=10
            ),
            "ListDeadLetters(beta)": api.ListDeadLetters(
                ing.ListDeadLettersRequest(collection=BETA), timeout=10
            ),
            "ListDeadLetters(all)": api.ListDeadLetters(ing.ListDeadLettersRequest(), timeout=10),
            "ListDocuments(beta)": api.ListDocuments(ing.ListDocumentsRequest(collection=BETA), timeout=10),
            "ReplayDeadLetters(beta)": api.ReplayDeadLetters(
                ing.ReplayDeadLettersRequest(collection=BETA), timeout=10
            ),
            "ReplayDeadLetters(all)": api.ReplayDeadLetters(ing.ReplayDeadLettersRequest(), timeout=10),
            "DeleteDocuments": api.DeleteDocuments(
                ing.DeleteDocumentsRequest(collection=BETA, doc_ids=["secret.md"]), timeout=10
            ),
            "IngestDocuments": a.ingest(BETA, [("planted.md", "# planted\n\nnot yours")]),
        }
        outcomes = {name: await refused(call) for name, call in attempts.items()}
        assert set(outcomes.values()) == {grpc.StatusCode.PERMISSION_DENIED}, outcomes
        # What A may list holds none of B; what A may search holds none of B's text; B's dead
        # letter is still there for B.
        b = tenant(secure_stack, "tenant-b")
        letters = await b.ingestion.ListDeadLetters(ing.ListDeadLettersRequest(collection=BETA), timeout=10)
        await b.close()
        assert [d.doc_id for d in letters.dead_letters] == [BROKEN]
        # In our words: the PDF parser's exception and text stay in the worker's log.
        assert [d.reason for d in letters.dead_letters] == [
            "unparseable PDF: the file is damaged or is not a PDF"
        ]
        collections = await api.ListCollections(ing.ListCollectionsRequest(), timeout=10)
        assert list(collections.collections) == [ALPHA]
        mine = await gateway.Search(
            gw.SearchRequest(collection=ALPHA, query="zanzibarite launch code"), timeout=10
        )
        assert all(r.doc_id in indexed[ALPHA] and "zanzibarite" not in r.text for r in mine.results)
        # Without a key, or over plaintext, the public services refuse too.
        async with open_channel(secure_stack.address("gateway"), tls=a.tls) as keyless:
            search = gw.SearchRequest(collection=ALPHA, query="keys")
            assert await refused(gateway_pb2_grpc.GatewayServiceStub(keyless).Search(search, timeout=10)) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
        async with aio.insecure_channel(secure_stack.address("ingestion")) as plaintext:
            request = ing.ListCollectionsRequest()
            stub = ingestion_pb2_grpc.IngestionServiceStub(plaintext)
            assert await refused(stub.ListCollections(request, timeout=10)) == grpc.StatusCode.UNAVAILABLE
    finally:
        await a.close()


async def _drain(stream: Any) -> list[Any]:
    return [event async for event in stream]
