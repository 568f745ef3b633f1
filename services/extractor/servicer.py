"""gRPC face of the extractor: request validation, defaults, and the wire format.

Validation rules (what callers can rely on):
- ``query``: a non-whitespace character (INVALID_ARGUMENT), at most extractor_max_query_chars
  characters (RESOURCE_EXHAUSTED).
- ``passages``: 1..extractor_max_passages (none: INVALID_ARGUMENT, more: RESOURCE_EXHAUSTED).
  Each: id 1..512 characters and unique, doc_id at most 512, text not blank, score finite when
  set (INVALID_ARGUMENT); text at most extractor_max_passage_chars and title at most
  MAX_TITLE_CHARS characters (RESOURCE_EXHAUSTED).
- ``mode``: a known ExtractionMode (INVALID_ARGUMENT); unspecified takes extractor_mode.
- ``batch_size``: at most extractor_max_batch_size (RESOURCE_EXHAUSTED); 0 takes the default.
- ``max_facts`` and ``context_budget_tokens``: 0 takes the default; any other value is used.
Failures of the LLM or the embedder never fail the call: they degrade it (see pipeline.py).
"""

from __future__ import annotations

import math
import time

from grpc import aio

from meshkit.core.errors import invalid_argument, resource_exhausted
from meshkit.domain.ids import MAX_ITEM_ID_CHARS, check_item_list
from meshkit.llm.factory import LLM, make_llm
from meshkit.rpc.identity import GATEWAY, OPS, Callers, allow
from meshkit.rpc.server import ITEM_OVERHEAD_BYTES, Hook, ServiceSpec, text_request_bytes
from meshkit.settings import ExtractorSettings
from ragmesh.extractor.v1 import extractor_pb2, extractor_pb2_grpc
from services.extractor.embedder import EmbedderClient
from services.extractor.extractive import Embed
from services.extractor.facts import ORIGIN_NAMES, Job, Mode, Outcome, Source, resolve_scores
from services.extractor.metrics import FACTS, GATED_OUT, ISSUES, REQUEST_SECONDS
from services.extractor.pipeline import Extractor

SERVICE_NAME = "extractor"
MAX_TITLE_CHARS = 2000

_MODES: dict[extractor_pb2.ExtractionMode, Mode] = {
    extractor_pb2.EXTRACTION_MODE_LLM: "llm",
    extractor_pb2.EXTRACTION_MODE_EXTRACTIVE: "extractive",
}
_WIRE_MODES = {name: value for value, name in _MODES.items()}


def validate(request: extractor_pb2.ExtractRequest, settings: ExtractorSettings) -> None:
    if not request.query.strip():
        raise invalid_argument("query is empty")
    if len(request.query) > settings.extractor_max_query_chars:
        raise resource_exhausted(
            f"query has {len(request.query)} characters; the limit is {settings.extractor_max_query_chars}"
        )
    validate_passages(request, settings)
    if request.mode != extractor_pb2.EXTRACTION_MODE_UNSPECIFIED and request.mode not in _MODES:
        raise invalid_argument(f"mode {request.mode} is not a known ExtractionMode")
    if request.batch_size > settings.extractor_max_batch_size:
        raise resource_exhausted(
            f"batch_size {request.batch_size} exceeds the limit {settings.extractor_max_batch_size}"
        )


def validate_passages(request: extractor_pb2.ExtractRequest, settings: ExtractorSettings) -> None:
    passages = request.passages
    if not passages:
        raise invalid_argument("passages must hold at least one passage")
    check_item_list([p.id for p in passages], "passages", settings.extractor_max_passages)
    for i, passage in enumerate(passages):
        if len(passage.doc_id) > MAX_ITEM_ID_CHARS:
            raise invalid_argument(f"passages[{i}].doc_id is longer than {MAX_ITEM_ID_CHARS} characters")
        if not passage.text.strip():
            raise invalid_argument(f"passages[{i}].text is empty")
        if len(passage.text) > settings.extractor_max_passage_chars:
            raise resource_exhausted(
                f"passages[{i}].text has {len(passage.text)} characters; "
                f"the limit is {settings.extractor_max_passage_chars}"
            )
        if len(passage.title) > MAX_TITLE_CHARS:
            raise resource_exhausted(
                f"passages[{i}].title has {len(passage.title)} characters; the limit is {MAX_TITLE_CHARS}"
            )
        if passage.HasField("score") and not math.isfinite(passage.score):
            raise invalid_argument(f"passages[{i}].score must be a finite number")


def to_job(request: extractor_pb2.ExtractRequest, settings: ExtractorSettings) -> Job:
    """A validated request with the server's defaults filled in."""
    scores = resolve_scores([p.score if p.HasField("score") else None for p in request.passages])
    sources = [
        Source(i, p.id, p.doc_id, p.title, p.text, score)
        for i, (p, score) in enumerate(zip(request.passages, scores, strict=True))
    ]
    return Job(
        query=request.query.strip(),
        sources=sources,
        mode=_MODES.get(request.mode, settings.extractor_mode),
        max_facts=request.max_facts or settings.extractor_max_facts,
        batch_size=request.batch_size or settings.extractor_batch_size,
        budget_tokens=request.context_budget_tokens or settings.extractor_context_budget_tokens,
    )


def to_response(outcome: Outcome) -> extractor_pb2.ExtractResponse:
    return extractor_pb2.ExtractResponse(
        facts=[
            extractor_pb2.Fact(
                text=f.text,
                passage_id=f.source.id,
                doc_id=f.source.doc_id,
                origin=f.origin,
                score=f.score,
            )
            for f in outcome.facts
        ],
        mode=_WIRE_MODES[outcome.mode],
        degraded_reason=outcome.degraded_reason,
        issues=[
            extractor_pb2.ExtractIssue(batch=i.batch, kind=i.kind, message=i.message) for i in outcome.issues
        ],
        llm_calls=outcome.llm_calls,
        gated_out=outcome.gated_out,
        summary_rounds=outcome.summary_rounds,
    )


def record(outcome: Outcome, seconds: float) -> None:
    REQUEST_SECONDS.labels(outcome.mode).observe(seconds)
    for fact in outcome.facts:
        FACTS.labels(ORIGIN_NAMES.get(fact.origin, "unknown")).inc()
    for issue in outcome.issues:
        ISSUES.labels(issue.kind).inc()
    GATED_OUT.inc(outcome.gated_out)


class ExtractorServicer(extractor_pb2_grpc.ExtractorServiceServicer):
    def __init__(self, settings: ExtractorSettings, extractor: Extractor) -> None:
        self._settings = settings
        self._extractor = extractor

    async def Extract(
        self, request: extractor_pb2.ExtractRequest, context: aio.ServicerContext
    ) -> extractor_pb2.ExtractResponse:
        validate(request, self._settings)
        job = to_job(request, self._settings)
        started = time.perf_counter()
        outcome = await self._extractor.extract(job)
        record(outcome, time.perf_counter() - started)
        return to_response(outcome)


# Who may call the extractor (RAGMESH_SERVICE_AUTH=mtls).
CALLERS: Callers = {"Extract": allow(GATEWAY, OPS)}


def max_request_bytes(settings: ExtractorSettings) -> int:
    """The largest legal Extract: the most passages, each of the longest length, and a query."""
    return text_request_bytes(
        settings.extractor_max_passages,
        settings.extractor_max_passage_chars,
        ITEM_OVERHEAD_BYTES,
        settings.extractor_max_query_chars,
    )


def build_spec(
    settings: ExtractorSettings, llm: LLM | None = None, embed: Embed | None = None
) -> tuple[ServiceSpec, ExtractorServicer]:
    """The service spec for run_service/start_service; tests inject a fake ``llm`` and
    ``embed``. What this builds itself (the LLM client, the embedder client) it also closes."""
    on_start: list[Hook] = []
    on_stop: list[Hook] = []
    if llm is None:
        llm = make_llm(settings, target="extractor-llm")
        on_stop.append(llm.aclose)
    if embed is None:
        client = EmbedderClient(settings)
        embed = client
        on_start.append(client.start)
        on_stop.append(client.close)
    servicer = ExtractorServicer(settings, Extractor(settings, llm, embed))

    def register(server: aio.Server) -> None:
        extractor_pb2_grpc.add_ExtractorServiceServicer_to_server(servicer, server)

    spec = ServiceSpec(
        name=SERVICE_NAME,
        grpc_services=[extractor_pb2.DESCRIPTOR.services_by_name["ExtractorService"].full_name],
        register=register,
        on_start=on_start,
        on_stop=on_stop,
        multiprocess_safe=True,
        callers=CALLERS,
        max_request_bytes=max_request_bytes(settings),
        # Each call holds LLM requests for seconds; more at once only queues behind the LLM tier.
        max_concurrent_rpcs=128,
    )
    return spec, servicer
