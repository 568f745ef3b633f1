"""The extractor step of an Ask (the map step): facts drawn from the passages read, each tied
to its passage. An extractor that fails or is late costs the answer its facts, not its arrival:
each document's first sentence stands for it instead, with a degradation."""

from __future__ import annotations

from meshkit.rpc.client import Downstream, DownstreamError
from ragmesh.extractor.v1 import extractor_pb2, extractor_pb2_grpc
from services.gateway.answer.deadlines import scope_left
from services.gateway.answer.text import Evidence, snippet_facts
from services.gateway.degradations import Degradation, from_error, from_reason

EXTRACTOR = "extractor"


def extract_request(query: str, evidence: list[Evidence], llm: bool) -> extractor_pb2.ExtractRequest:
    return extractor_pb2.ExtractRequest(
        query=query,
        passages=[
            extractor_pb2.Passage(
                id=item.chunk.chunk_id,
                doc_id=item.chunk.doc_id,
                title=item.chunk.title,
                text=item.chunk.text,
                score=item.score,
            )
            for item in evidence
        ],
        mode=extractor_pb2.EXTRACTION_MODE_LLM if llm else extractor_pb2.EXTRACTION_MODE_EXTRACTIVE,
    )


class Extraction:
    """The extractor's facts for one Ask, under the step's deadline scope."""

    def __init__(self, extractor: Downstream[extractor_pb2_grpc.ExtractorServiceStub]) -> None:
        self.extractor = extractor

    async def facts(
        self, query: str, llm: bool, evidence: list[Evidence], degradations: list[Degradation]
    ) -> list[extractor_pb2.Fact]:
        """The facts of ``evidence`` for ``query`` (by the LLM when ``llm``, else the
        extractor's own extractive rules); the passages' first sentences when it fails."""
        extractor = self.extractor
        request = extract_request(query, evidence, llm)
        try:
            # Only the extractive mode is retried: a failed LLM extraction would only be slow again
            # within the same budget.
            reply = await extractor.call(
                extractor.stub.Extract, request, timeout=scope_left(), idempotent=not llm
            )
        except DownstreamError as exc:
            degradations.append(from_error(EXTRACTOR, exc))
            return snippet_facts(evidence)
        if reply.degraded_reason:
            degradations.append(from_reason(EXTRACTOR, extractor.target, reply.degraded_reason))
        return list(reply.facts)
