"""A scripted LLM writes fluent, cited sentences that its citations do not support; the real
narrator (lexical verification) and the real reranker with the shipped cross-encoder sit
behind the gateway (the other stages are fakes). The unsupported sentences must not survive:
rebound to the passage that supports them, or dropped. The issue's vitamin D example: "Vitamin
D supplementation reduces the risk of fractures [1]." citing a passage on the cutaneous
production of vitamin D, said twice (the second time without its final stop)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from meshkit.llm.factory import Messages
from meshkit.rpc.server import start_service
from meshkit.settings import NarratorSettings, RerankerSettings
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.narrator.v1 import narrator_pb2
from services.gateway.tests.conftest import COLLECTION, NAME_OF, running_gateway
from services.narrator.servicer import build_spec as narrator_spec
from services.reranker.model import CrossEncoderModel
from services.reranker.servicer import build_spec as reranker_spec

ModelT = TypeVar("ModelT", bound=BaseModel)
MODEL_DIR = Path(__file__).resolve().parents[3] / "models" / "reranker" / "ragmesh-minilm-l6-ce-v1"
QUERY = "Does vitamin D supplementation reduce the risk of fractures?"
# Its middle sentence is the SciFact abstract's (doc 275294) that the demo's LLM answer cited:
# the cross-encoder scores the claim against it higher (1.97) than against the meta-analysis
# (1.81), but it holds only 3 of the claim's 5 content words ("supplementation", "reduces" not).
CUTANEOUS = (
    "Cutaneous production of vitamin D declines with age. Vitamin D insufficiency and deficiency "
    "exacerbate osteoporosis, cause osteomalacia, and increase the risk of skeletal fractures. "
    "Supplementation of vitamin D in the elderly is common."
)
META_ANALYSIS = (
    "In a meta-analysis of randomized trials, oral vitamin D supplementation of 700 to 800 IU per day "
    "reduced the risk of hip fractures in older persons."
)
CHUNKS = {
    "c0": CUTANEOUS,
    "c1": META_ANALYSIS,
    "c3": "Compliance with the supplementation regimen was 80 percent. Tablets were taken with breakfast.",
    "c4": "Calcium intake was measured by a food frequency questionnaire at baseline.",
    "c2": "Bone density was measured by dual-energy x-ray absorptiometry.",
}
CLAIM = "Vitamin D supplementation reduces the risk of fractures"
_SOURCE_LINE = re.compile(r"^\[(\d+)\] [^:]*: (.*)$", re.MULTILINE)


class ScriptedLLM:
    """Writes the same fluent answer whatever it is given, citing the cutaneous passage (its
    number read from the prompt): the claim, the claim again without its final stop, and a
    sentence that mixes the passage's words with a claim it does not make."""

    def __init__(self) -> None:
        self.replies: list[str] = []

    async def chat(self, messages: Messages, **options: Any) -> str:
        raise AssertionError("the narrator does not use chat")

    async def structured(self, messages: Messages, schema: type[ModelT], **options: Any) -> ModelT:
        raise AssertionError("contradiction checks are off in this test")

    async def stream(self, messages: Messages, **options: Any) -> AsyncIterator[str]:
        prompt = str(messages[-1]["content"])
        number = next(n for n, text in _SOURCE_LINE.findall(prompt) if text.startswith("Cutaneous"))
        reply = (
            f"{CLAIM} [{number}]. "
            f"Supplementation of vitamin D reduces fractures in the elderly, as cutaneous production "
            f"declines with age [{number}]. {CLAIM} [{number}]"
        )
        self.replies.append(reply)
        for word in reply.split(" "):
            yield word + " "

    async def aclose(self) -> None:
        return None


@pytest.fixture(scope="module")
def model() -> CrossEncoderModel:
    return CrossEncoderModel.load(MODEL_DIR, provider="cpu", threads=1)


async def test_fluent_cited_unsupported_sentences_are_rebound_or_dropped(model: CrossEncoderModel) -> None:
    llm = ScriptedLLM()
    narrator_settings = NarratorSettings(port=0, log_format="text", narrator_contradictions=False)
    reranker_settings = RerankerSettings(port=0, log_format="text")
    narrator = await start_service(narrator_spec(narrator_settings, llm)[0], narrator_settings)
    reranker = await start_service(reranker_spec(reranker_settings, model)[0], reranker_settings)
    try:
        async with running_gateway(
            gateway_rerank=True,
            narrator_address=f"127.0.0.1:{narrator.port}",
            reranker_address=f"127.0.0.1:{reranker.port}",
        ) as gateway:
            gateway.fakes.chunk_texts = dict(CHUNKS)
            gateway.fakes.behaviour["extractor"] = "quote"
            response = await gateway.stub.Ask(
                gateway_pb2.AskRequest(collection=COLLECTION, query=QUERY, mode=gateway_pb2.ANSWER_MODE_LLM),
                timeout=60,
            )
    finally:
        await narrator.stop(0)
        await reranker.stop(0)
    assert llm.replies, "the LLM was not asked"
    number_of = {NAME_OF[s.chunk_id]: i for i, s in enumerate(response.sources, 1)}
    assert response.answered
    # Nothing is left citing the cutaneous passage, which supports none of it.
    assert all(number_of["c0"] not in s.sources for s in response.sentences), response
    # The claim is said once, bound to the meta-analysis that supports it, with its score.
    (claim,) = [s for s in response.sentences if s.text.startswith(CLAIM)]
    assert list(claim.sources) == [number_of["c1"]]
    assert claim.support_check == narrator_pb2.SUPPORT_CHECK_CROSS_ENCODER
    assert claim.support_score >= gateway.settings.calibration.ask_support_min_score
    reasons = {r.reason for r in response.degradations}
    assert not reasons, response.degradations
