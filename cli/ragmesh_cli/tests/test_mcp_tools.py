"""The MCP tools of ``ragmesh mcp`` in process (the SDK's in-memory client), over a fake gateway
and ingestion API: what each tool returns, the key it sends, and a refusal as a tool error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli.mcp_clients import Clients


class Mesh(gateway_pb2_grpc.GatewayServiceServicer, ingestion_pb2_grpc.IngestionServiceServicer):
    def __init__(self) -> None:
        self.keys: list[str] = []

    def _enter(self, collection: str, context: grpc.ServicerContext) -> None:
        self.keys.append(dict(context.invocation_metadata()).get("authorization", ""))
        if collection == "secret":
            context.set_trailing_metadata((("x-request-id", "rid-1"),))
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "key 'k' may not read collection 'secret'")

    def Search(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter(request.collection, context)
        return gateway_pb2.SearchResponse(
            results=[
                gateway_pb2.SearchResult(
                    chunk_id="c1", doc_id="a.md", title="A", text="x " * 500, fused_score=0.5
                )
            ][: request.top_k]
        )

    def Ask(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter(request.collection, context)
        return gateway_pb2.AskResponse(
            answer="Three replicas [1].",
            answered=True,
            citations=[gateway_pb2.AnswerCitation(number=1, doc_id="a.md", title="A", snippet="three")],
            mode=gateway_pb2.ANSWER_MODE_EXTRACTIVE,
        )

    def GetCollectionStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter(request.collection, context)
        return ingestion_pb2.GetCollectionStatusResponse(collection=request.collection, indexed=4, chunks=9)


@pytest.fixture
def mesh() -> Iterator[tuple[Mesh, str]]:
    servicer = Mesh()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server)
    ingestion_pb2_grpc.add_IngestionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def _payload(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    if isinstance(result.structured_content, dict):
        return result.structured_content
    return json.loads(result.content[0].text)  # type: ignore[no-any-return]


async def test_the_three_tools(
    mesh: tuple[Mesh, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from mcp import Client

    from ragmesh_cli.mcp_tools import PREVIEW_CHARS, build_server

    monkeypatch.setenv("RAGMESH_STATE_DIR", str(tmp_path))
    servicer, address = mesh
    server = build_server(Clients(address, address, "k-stdio", http=False), "docs")
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"search", "ask", "collection_status"}
        assert tools["search"].input_schema["required"] == ["query"]
        answer = _payload(await client.call_tool("ask", {"question": "How many replicas?"}))
        assert answer["answered"] and answer["citations"][0]["doc_id"] == "a.md"
        assert answer["answer"] == "Three replicas [1]." and answer["mode"] == "extractive"
        found = _payload(await client.call_tool("search", {"query": "replicas", "top_k": 1}))
        assert found["results"][0]["doc_id"] == "a.md"
        assert len(found["results"][0]["text"]) == PREVIEW_CHARS
        status = _payload(await client.call_tool("collection_status", {}))
        assert status == {
            "collection": "docs",
            "indexed": 4,
            "queued": 0,
            "processing": 0,
            "failed": 0,
            "deleting": 0,
            "chunks": 9,
        }
        too_many = await client.call_tool("search", {"query": "q", "top_k": 500})
        assert too_many.is_error and "top_k" in too_many.content[0].text
        refused = await client.call_tool("ask", {"question": "q", "collection": "secret"})
        assert refused.is_error
        assert refused.content[0].text.endswith(
            "PERMISSION_DENIED: key 'k' may not read collection 'secret' (request id rid-1)"
        )
    # Over stdio the process's one key goes with every call.
    assert set(servicer.keys) == {"Bearer k-stdio"}
