"""The extractor service, over gRPC, against an OpenAI-compatible server over HTTP that answers
with partly malformed JSON (a stand-in server: the real model's malformations cannot be
produced on demand): the malformed entry is skipped, the batch goes on with the good ones, the
passage whose entry was bad is represented by its raw snippet, and the issue is reported."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from grpc import aio

from meshkit.rpc.server import start_service
from meshkit.settings import ExtractorSettings
from ragmesh.extractor.v1 import extractor_pb2, extractor_pb2_grpc
from services.extractor.servicer import build_spec

pytestmark = pytest.mark.integration

PASSAGES = [
    "Caloric restriction slowed the epigenetic clock of rhesus monkeys by several years.",
    "Methylation age was measured with a clock of 353 CpG sites in blood samples.",
    "Older animals on a restricted diet kept more muscle mass than controls.",
]
# Entry 2 has a fact that is not a string: malformed. Entries 1 and 3 are good.
MAP_REPLY = {
    "facts": [
        {"passage": 1, "fact": "Caloric restriction slowed the epigenetic clock of rhesus monkeys."},
        {"passage": 2, "fact": {"text": "not a string"}},
        {"passage": 3, "fact": "Restricted older animals kept more muscle mass."},
    ]
}


class ScriptedChat(BaseHTTPRequestHandler):
    """/v1/chat/completions answering every call with MAP_REPLY as the assistant's content."""

    calls: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ScriptedChat.calls.append(body)
        reply = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(MAP_REPLY)}}],
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def llm_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


async def test_a_malformed_entry_is_skipped_and_the_batch_goes_on(llm_url: str) -> None:
    settings = ExtractorSettings(
        port=0, log_format="text", llm_base_url=llm_url, llm_timeout_s=10, extractor_relevance_gate=False
    )
    spec, _ = build_spec(settings)
    running = await start_service(spec, settings)
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            reply = await extractor_pb2_grpc.ExtractorServiceStub(channel).Extract(
                extractor_pb2.ExtractRequest(
                    query="Does caloric restriction slow the methylation clock?",
                    passages=[
                        extractor_pb2.Passage(id=f"p{i}", doc_id=f"d{i}", text=text, score=3.0 - i)
                        for i, text in enumerate(PASSAGES)
                    ],
                    mode=extractor_pb2.EXTRACTION_MODE_LLM,
                ),
                timeout=20,
            )
    finally:
        await running.stop(0)
    origins = {fact.passage_id: fact.origin for fact in reply.facts}
    assert origins == {
        "p0": extractor_pb2.FACT_ORIGIN_LLM,
        "p1": extractor_pb2.FACT_ORIGIN_SNIPPET,
        "p2": extractor_pb2.FACT_ORIGIN_LLM,
    }
    snippet = next(f.text for f in reply.facts if f.passage_id == "p1")
    assert "353 CpG sites" in snippet
    assert [issue.kind for issue in reply.issues] == ["malformed_entry"]
    assert reply.mode == extractor_pb2.EXTRACTION_MODE_LLM and not reply.degraded_reason
    assert reply.llm_calls == 1 and len(ScriptedChat.calls) == 1
    # The server was asked for schema-constrained output.
    assert ScriptedChat.calls[0]["response_format"]["type"] == "json_schema"
