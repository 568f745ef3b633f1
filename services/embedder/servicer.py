"""gRPC face of the embedder: request validation, the micro-batcher, and the service spec.

Validation rules (what callers can rely on):
- ``texts``: 1..embedder_max_request_texts entries (empty list: INVALID_ARGUMENT, more:
  RESOURCE_EXHAUSTED). Each must contain a non-whitespace character (INVALID_ARGUMENT) and be at
  most embedder_max_text_chars characters (RESOURCE_EXHAUSTED). Texts over the model's token limit
  are truncated, not rejected, and counted in ``truncated``.
- ``kind``: TEXT_KIND_UNSPECIFIED means TEXT_KIND_PASSAGE (the bulk, ingestion-side case);
  values outside the enum are INVALID_ARGUMENT.
- Overload (more than embedder_max_queued_texts waiting) or shutdown: UNAVAILABLE, safe to retry.
- GetModelInfo's ``max_batch`` is the most texts one Embed call may carry
  (embedder_max_request_texts); the server splits them into model runs of embedder_max_batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from grpc import aio

from meshkit.core.errors import failed_precondition, invalid_argument, resource_exhausted
from meshkit.rpc.identity import EXTRACTOR, GATEWAY, INGESTION_WORKER, OPS, Callers, allow
from meshkit.rpc.server import ServiceSpec, text_request_bytes
from meshkit.settings import EmbedderSettings
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from services.embedder.batcher import EmbedBatcher
from services.embedder.model import EmbeddingModel, TextKind

log = logging.getLogger("ragmesh.embedder")

SERVICE_NAME = "embedder"

_KINDS: dict[int, TextKind] = {
    embedder_pb2.TEXT_KIND_UNSPECIFIED: TextKind.PASSAGE,
    embedder_pb2.TEXT_KIND_PASSAGE: TextKind.PASSAGE,
    embedder_pb2.TEXT_KIND_QUERY: TextKind.QUERY,
}


def validate_texts(texts: Sequence[str], settings: EmbedderSettings) -> None:
    if not texts:
        raise invalid_argument("texts must hold at least one text")
    if len(texts) > settings.embedder_max_request_texts:
        raise resource_exhausted(
            f"{len(texts)} texts in one call; the limit is {settings.embedder_max_request_texts}"
        )
    for i, text in enumerate(texts):
        if not text.strip():
            raise invalid_argument(f"texts[{i}] is empty")
        if len(text) > settings.embedder_max_text_chars:
            raise resource_exhausted(
                f"texts[{i}] has {len(text)} characters; the limit is {settings.embedder_max_text_chars}"
            )


def kind_of(value: int) -> TextKind:
    try:
        return _KINDS[value]
    except KeyError:
        raise invalid_argument(f"unknown kind {value}") from None


class EmbedderServicer(embedder_pb2_grpc.EmbedderServiceServicer):
    """Owns the model and the batcher; ``start`` loads the model (or adopts a preloaded one)."""

    def __init__(self, settings: EmbedderSettings, model: EmbeddingModel | None = None) -> None:
        self._settings = settings
        self._model = model
        self._batcher: EmbedBatcher | None = None

    async def start(self) -> None:
        if self._model is None:
            # Hashing and session creation take a second or more: keep the loop free meanwhile.
            self._model = await asyncio.to_thread(EmbeddingModel.load, self._settings)
        self._batcher = EmbedBatcher(
            self._model.embed_with_flags,
            max_batch=self._settings.embedder_max_batch,
            window_s=self._settings.embedder_batch_window_ms / 1000.0,
            max_queued_texts=self._settings.embedder_max_queued_texts,
        )
        await self._batcher.start()

    async def stop(self) -> None:
        if self._batcher is not None:
            await self._batcher.stop()

    @property
    def batcher(self) -> EmbedBatcher:
        if self._batcher is None:
            raise failed_precondition("embedder model is not loaded yet")
        return self._batcher

    @property
    def model(self) -> EmbeddingModel:
        if self._model is None:
            raise failed_precondition("embedder model is not loaded yet")
        return self._model

    async def Embed(
        self, request: embedder_pb2.EmbedRequest, context: aio.ServicerContext
    ) -> embedder_pb2.EmbedResponse:
        texts = list(request.texts)
        validate_texts(texts, self._settings)
        kind = kind_of(request.kind)
        vectors, truncated = await self.batcher.embed(texts, kind)
        return embedder_pb2.EmbedResponse(
            vectors=[common_pb2.Vector(values=row) for row in vectors.tolist()],
            model=self.model.info.name,
            truncated=truncated,
            model_sha256=self.model.info.sha256,
        )

    async def GetModelInfo(
        self, request: embedder_pb2.GetModelInfoRequest, context: aio.ServicerContext
    ) -> embedder_pb2.GetModelInfoResponse:
        info = self.model.info
        return embedder_pb2.GetModelInfoResponse(
            model=info.name,
            dimension=info.dimension,
            max_tokens=info.max_tokens,
            query_prefix=info.query_prefix,
            passage_prefix=info.passage_prefix,
            provider=info.provider,
            max_batch=self._settings.embedder_max_request_texts,
            model_sha256=info.sha256,
        )


# Who may call the embedder (RAGMESH_SERVICE_AUTH=mtls): the stages that embed queries and passages.
_EMBEDDING_CALLERS = allow(GATEWAY, EXTRACTOR, INGESTION_WORKER, OPS)
CALLERS: Callers = {"Embed": _EMBEDDING_CALLERS, "GetModelInfo": _EMBEDDING_CALLERS}


def max_request_bytes(settings: EmbedderSettings) -> int:
    """The largest legal Embed: the most texts, each of the longest length."""
    return text_request_bytes(settings.embedder_max_request_texts, settings.embedder_max_text_chars, 16)


def build_spec(
    settings: EmbedderSettings, model: EmbeddingModel | None = None
) -> tuple[ServiceSpec, EmbedderServicer]:
    """The service spec for run_service/start_service; ``model`` lets tests reuse a loaded one."""
    servicer = EmbedderServicer(settings, model)

    def register(server: aio.Server) -> None:
        embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(servicer, server)

    spec = ServiceSpec(
        name=SERVICE_NAME,
        grpc_services=[embedder_pb2.DESCRIPTOR.services_by_name["EmbedderService"].full_name],
        register=register,
        on_start=[servicer.start],
        on_stop=[servicer.stop],
        multiprocess_safe=True,
        callers=CALLERS,
        max_request_bytes=max_request_bytes(settings),
        # Calls wait in the micro-batcher (bounded by embedder_max_queued_texts), not in handlers.
        max_concurrent_rpcs=1024,
    )
    return spec, servicer
