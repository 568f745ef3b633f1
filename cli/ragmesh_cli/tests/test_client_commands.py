"""``ragmesh search`` and ``ragmesh ask`` run on ragmesh_client: the same flags and output as
before, plus what the client brings (a transient UNAVAILABLE on a search is retried, the API key
goes with the streamed answer too, errors print as ``error: CODE: message``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh_cli.main import main


def _answer() -> gateway_pb2.AskResponse:
    return gateway_pb2.AskResponse(
        answer="Mint a new key, then remove the old one [1].",
        answered=True,
        citations=[
            gateway_pb2.AnswerCitation(
                number=1, doc_id="keys.md", chunk_id="keys.md#0", title="Keys", snippet="Mint a new key"
            )
        ],
        sentences=[narrator_pb2.Sentence(text="Mint a new key, then remove the old one [1].", sources=[1])],
        sources=[gateway_pb2.ExploredSource(chunk_id="keys.md#0", doc_id="keys.md", cited=True)],
        mode=gateway_pb2.ANSWER_MODE_EXTRACTIVE,
        timings=[gateway_pb2.StageTiming(stage="total", ms=40.0)],
    )


class Gateway(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self) -> None:
        self.fail_next: list[grpc.StatusCode] = []
        self.metadata: list[dict[str, str]] = []

    def _enter(self, context: grpc.ServicerContext) -> None:
        self.metadata.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        if self.fail_next:
            code = self.fail_next.pop(0)
            context.abort(code, f"scripted {code.name.lower()}")

    def Search(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter(context)
        return gateway_pb2.SearchResponse(
            results=[gateway_pb2.SearchResult(chunk_id="keys.md#0", doc_id="keys.md", text="Mint a key")],
            searched_query=request.query,
        )

    def AskStream(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self._enter(context)
        yield gateway_pb2.AskStreamResponse(progress=gateway_pb2.AskProgress(stage="search", ms=3.0, count=5))
        yield gateway_pb2.AskStreamResponse(delta="Mint a new key")
        yield gateway_pb2.AskStreamResponse(answer=_answer())


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[Gateway]:
    servicer = Gateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("RAGMESH_GATEWAY_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.setenv("RAGMESH_STATE_DIR", str(tmp_path))
    yield servicer
    server.stop(None)


def test_ask_streams_the_text_then_prints_the_verified_answer(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ask", "How do I rotate a key?", "--api-key", "k-1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(
        "Mint a new key\n\nverified answer:\nMint a new key, then remove the old one [1]."
    )
    assert "  [1] keys.md (keys.md#0): Keys — Mint a new key" in captured.out
    assert "1 of 1 passages read are cited; mode extractive" in captured.out
    assert "[search: 5 in 3 ms]" in captured.err
    # The key goes with the streamed call, as with every other.
    assert gateway.metadata[-1]["authorization"] == "Bearer k-1"


def test_ask_json_is_the_verified_answer_with_timings(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ask", "How do I rotate a key?", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["answer"] == "Mint a new key, then remove the old one [1]."
    assert document["citations"][0]["doc_id"] == "keys.md"
    assert document["first_token_ms"] is not None and document["total_ms"] >= document["first_token_ms"]


def test_search_retries_a_transient_unavailable(gateway: Gateway, capsys: pytest.CaptureFixture[str]) -> None:
    gateway.fail_next = [grpc.StatusCode.UNAVAILABLE]
    assert main(["search", "rotate keys"]) == 0
    assert "keys.md" in capsys.readouterr().out
    assert len(gateway.metadata) == 2


def test_a_refused_ask_prints_the_status_and_fails(
    gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway.fail_next = [grpc.StatusCode.PERMISSION_DENIED]
    assert main(["ask", "q", "--collection", "secret"]) == 1
    assert capsys.readouterr().err.strip() == "error: PERMISSION_DENIED: scripted permission_denied"
    assert len(gateway.metadata) == 1
