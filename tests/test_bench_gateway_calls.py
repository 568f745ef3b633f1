"""The benchmarks' gateway calls, now made through ragmesh_client, against a scripted gateway
over the wire: each sends what it sent before (request fields the client does not map go as
they are) and reads what it read before (results, leg lists, degradations, answers)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from bench import answer_tune, peer_bench, qa_retrieval, rerank_inprocess, search_bench, tune_fusion
from bench.qa import QAItem
from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh_cli.channels import gateway_client


class Gateway(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self) -> None:
        self.searches: list[gateway_pb2.SearchRequest] = []
        self.asks: list[gateway_pb2.AskRequest] = []

    def Search(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.searches.append(request)
        reply = gateway_pb2.SearchResponse(
            results=[
                gateway_pb2.SearchResult(chunk_id=f"{d}#0", doc_id=d, title=d.upper(), text=f"about {d}")
                for d in ("a.md", "b.md", "a.md")
            ],
            unknown_terms=["zxq"],
            degradations=[
                gateway_pb2.Degradation(
                    stage=gateway_pb2.STAGE_SPARSE, reason=gateway_pb2.DEGRADATION_REASON_DEADLINE
                )
            ],
        )
        reply.results[0].rerank_score = 2.5
        if request.include_leg_results:
            reply.leg_results.append(
                gateway_pb2.LegResult(
                    leg=gateway_pb2.LEG_BM25,
                    hits=[gateway_pb2.LegHit(chunk_id="b.md#0", doc_id="b.md", score=7)],
                )
            )
        return reply

    def Ask(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.asks.append(request)
        return gateway_pb2.AskResponse(
            answer="A [1].",
            answered=True,
            citations=[gateway_pb2.AnswerCitation(number=1, doc_id="a.md")],
            mode=gateway_pb2.ANSWER_MODE_EXTRACTIVE,
        )


@pytest.fixture
def gateway() -> Iterator[tuple[Gateway, str]]:
    servicer = Gateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_qa_retrieval_sends_its_request_as_is(gateway: tuple[Gateway, str]) -> None:
    fake, address = gateway
    item = QAItem("q1", "test", "what is a?", True, ("b.md",), "b.md", "a")
    report = asyncio.run(qa_retrieval.measure(address, "docs", [item], max_variations=3, fused_only=True))
    assert report["fused"] == {"top1": 0.0, "top5": 1.0, "top10": 1.0}
    sent = fake.searches[0]
    assert (sent.max_variations, sent.collapse_documents, sent.top_k, sent.rerank) == (3, True, 10, False)


def test_search_and_peer_bench_read_results_and_degradations(gateway: tuple[Gateway, str]) -> None:
    fake, address = gateway

    async def both() -> tuple[search_bench.Answer, list[str], Counter[str]]:
        degraded: Counter[str] = Counter()
        async with search_bench.gateway_client(address) as bench_client, gateway_client(address) as peer:
            answer = await search_bench.gateway_search(bench_client)("q")
            docs = await peer_bench.ragmesh_search(peer, "docs", degraded)("q")
        return answer, docs, degraded

    answer, docs, degraded = asyncio.run(both())
    assert answer.chunk_ids == ("a.md#0", "b.md#0", "a.md#0") and answer.degraded
    assert docs == ["a.md", "b.md"] and degraded == Counter({"sparse:deadline": 1})
    assert [s.collection for s in fake.searches] == [search_bench.COLLECTION, "docs"]
    assert fake.searches[1].collapse_documents and not fake.searches[1].rerank


def test_rerank_and_fusion_tuning_get_the_gateway_s_messages(gateway: tuple[Gateway, str]) -> None:
    fake, address = gateway
    found = asyncio.run(rerank_inprocess.fused_candidates(address, "docs", {"q1": "a"}, 30))
    assert isinstance(found["q1"][0], gateway_pb2.SearchResult) and found["q1"][0].rerank_score == 2.5
    assert fake.searches[0].top_k == 30 and not fake.searches[0].rerank
    legs = asyncio.run(tune_fusion.fetch_leg_lists(address, "docs", {"q1": "a"}, 2, 50, 1))
    assert [(h.chunk_id, h.score) for h in legs["q1"]["bm25"]] == [("b.md#0", 7.0)]
    assert (fake.searches[1].pool_size, fake.searches[1].max_variations) == (50, 2)


def test_answer_tune_searches_and_asks(gateway: tuple[Gateway, str]) -> None:
    fake, address = gateway
    questions: list[dict[str, Any]] = [{"question": "what is a?"}]
    asyncio.run(answer_tune._search(address, "docs", questions, 1))
    assert questions[0]["results"][0] == {
        "chunk_id": "a.md#0",
        "doc_id": "a.md",
        "title": "A.MD",
        "text": "about a.md",
        "rerank": 2.5,
    }
    assert questions[0]["results"][1]["rerank"] is None and questions[0]["unknown"] == ["zxq"]
    asyncio.run(answer_tune._ask_all(address, "docs", questions, 1))
    assert (questions[0]["answered"], questions[0]["cited"], questions[0]["answer"]) == (
        True,
        ["a.md"],
        "A [1].",
    )
    assert fake.asks[0].mode == gateway_pb2.ANSWER_MODE_EXTRACTIVE
