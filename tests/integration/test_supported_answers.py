"""The issue's vitamin D example on the local stack, with the real local LLM (SmolLM2) writing the
answer and the real cross-encoder checking it: asked "Does vitamin D supplementation reduce the
risk of fractures?" over a passage that says so (a meta-analysis) and one that only talks
around it (cutaneous production of vitamin D, the passage the demo's LLM answer cited), every
sentence the answer keeps is one its citations support.

Whatever the LLM writes, a sentence survives only quoted from its passage or accepted by the
cross-encoder against a sentence of a passage it cites. The test checks the second again
itself, through the reranker service, with the gateway's own threshold: a gateway that kept a
sentence on word overlap alone, or bound it to the wrong passage, fails here."""

from __future__ import annotations

import pytest

from meshkit.settings import GatewaySettings
from meshkit.text.answering import cited_numbers, split_sentences, strip_citations
from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc
from ragmesh_cli.stack import Stack

from .meshclients import Mesh
from .test_ask import ASK_SERVICES, ASK_TIMEOUT_S
from .test_ingest import new_collection

pytestmark = pytest.mark.integration

QUESTION = "Does vitamin D supplementation reduce the risk of fractures?"
SUPPORTING = "meta-analysis"
DOCS = {
    SUPPORTING: "In a meta-analysis of randomized trials, oral vitamin D supplementation of 700 to 800 IU "
    "per day reduced the risk of hip fractures and of any nonvertebral fracture in older persons.",
    "cutaneous": "Cutaneous production of vitamin D declines with age. Vitamin D insufficiency and "
    "deficiency exacerbate osteoporosis, cause osteomalacia, and increase the risk of skeletal "
    "fractures. Supplementation of vitamin D in the elderly is common.",
    "compliance": "Compliance with daily supplementation was assessed by counting returned tablets at "
    "each visit. Participants who missed more than a fifth of their doses were contacted by a nurse.",
    "dosing": "The trial gave a single annual oral dose to women aged 70 years or older living in the "
    "community. Doses were given in autumn or winter.",
}
MIN_SUPPORT = GatewaySettings().calibration.ask_support_min_score


@pytest.fixture(scope="module")
async def vitamin_d(stack: Stack) -> str:
    if not set(stack.services) >= ASK_SERVICES:
        pytest.skip(f"the answering services {sorted(ASK_SERVICES - set(stack.services))} are not here")
    mesh = Mesh(stack)
    try:
        collection = new_collection()
        await mesh.ingest_indexed(collection, list(DOCS.items()))
        return collection
    finally:
        await mesh.close()


async def best_support(stack: Stack, sentence: str, passages: list[str]) -> float:
    """The reranker service's best log-odds that a sentence of ``passages`` is evidence for
    ``sentence``: the check the gateway makes, asked again independently."""
    evidence = [s for passage in passages for s in split_sentences(passage)]
    mesh = Mesh(stack)
    try:
        reply = await reranker_pb2_grpc.RerankerServiceStub(mesh.channel("reranker")).Rerank(
            reranker_pb2.RerankRequest(
                query=sentence,
                passages=[reranker_pb2.Passage(id=str(i), text=text) for i, text in enumerate(evidence)],
                min_score=-1000.0,  # every pair's score, none cut
                uncached=True,
            ),
            timeout=30,
        )
    finally:
        await mesh.close()
    assert not reply.fallback and reply.scored == len(evidence), reply
    return max(result.score for result in reply.results)


async def test_the_llm_answer_keeps_only_sentences_its_citations_support(
    stack: Stack, vitamin_d: str, gateway: gateway_pb2_grpc.GatewayServiceStub
) -> None:
    answer = await gateway.Ask(
        pb.AskRequest(collection=vitamin_d, query=QUESTION, mode=pb.ANSWER_MODE_LLM), timeout=ASK_TIMEOUT_S
    )
    assert answer.answered, answer
    assert SUPPORTING in {c.doc_id for c in answer.citations}, answer.citations
    doc_of = {c.number: c.doc_id for c in answer.citations}
    for sentence in answer.sentences:
        cited = [DOCS[doc_of[n]] for n in cited_numbers(sentence.text)]
        assert cited, sentence
        if sentence.support_check == narrator_pb2.SUPPORT_CHECK_QUOTED:
            body = strip_citations(sentence.text).strip()
            assert any(body in passage for passage in cited), sentence
            continue
        # Not quoted: the cross-encoder must have accepted it, and must accept it again here.
        assert sentence.support_check == narrator_pb2.SUPPORT_CHECK_CROSS_ENCODER, sentence
        assert sentence.support_score >= MIN_SUPPORT, sentence
        again = await best_support(stack, strip_citations(sentence.text), cited)
        assert again >= MIN_SUPPORT, (sentence.text, again)
