"""The embedder service as an ``Embed`` function, through the mesh's guarded client."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from meshkit.rpc.client import ClientPolicy, Downstream, DownstreamError, remaining_budget
from meshkit.settings import ExtractorSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from services.extractor.extractive import EmbedError

TARGET = "embedder"
# Texts per Embed call: under the embedder's default request limit (256) with room to spare.
CHUNK_TEXTS = 128
CONCURRENT_CALLS = 4
# Embedder input is cut to the model's 256 tokens anyway; this keeps requests small.
MAX_TEXT_CHARS = 2000
# Deadline time kept back from the embedder so the lexical fallback can still answer.
FALLBACK_RESERVE_S = 0.05


class EmbedderClient:
    """Callable as ``Embed``: splits large inputs into concurrent calls, raises EmbedError.
    ``start`` must run on the serving event loop (the channel belongs to it)."""

    def __init__(self, settings: ExtractorSettings) -> None:
        self._settings = settings
        self._timeout_s = settings.client_timeout_s
        self._downstream: Downstream[embedder_pb2_grpc.EmbedderServiceStub] | None = None
        self._slots = asyncio.Semaphore(CONCURRENT_CALLS)

    async def start(self) -> None:
        settings = self._settings
        self._downstream = Downstream(
            TARGET,
            settings.embedder_address,
            embedder_pb2_grpc.EmbedderServiceStub,
            ClientPolicy.from_settings(settings),
            settings.max_message_bytes,
        )

    @property
    def downstream(self) -> Downstream[embedder_pb2_grpc.EmbedderServiceStub]:
        if self._downstream is None:
            raise EmbedError("the embedder client is not started")
        return self._downstream

    async def close(self) -> None:
        if self._downstream is not None:
            await self._downstream.close()

    async def __call__(self, texts: Sequence[str], kind: embedder_pb2.TextKind) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        chunks = [texts[i : i + CHUNK_TEXTS] for i in range(0, len(texts), CHUNK_TEXTS)]
        parts = await asyncio.gather(*(self._embed_chunk(chunk, kind) for chunk in chunks))
        return np.concatenate(parts, axis=0)

    async def _embed_chunk(self, texts: Sequence[str], kind: embedder_pb2.TextKind) -> np.ndarray:
        async with self._slots:
            left = remaining_budget(self._timeout_s) - FALLBACK_RESERVE_S
            if left <= 0:
                raise EmbedError("no time left for the embedder before the deadline")
            request = embedder_pb2.EmbedRequest(texts=[t[:MAX_TEXT_CHARS] for t in texts], kind=kind)
            stub = self.downstream.stub
            try:
                reply = await self.downstream.call(stub.Embed, request, timeout=left, idempotent=True)
            except DownstreamError as exc:
                raise EmbedError(str(exc)) from exc
        rows = [list(v.values) for v in reply.vectors]
        if len(rows) != len(texts) or len({len(r) for r in rows}) > 1 or not rows[0]:
            raise EmbedError(
                f"embedder answered {len(rows)} vectors of mixed or no size for {len(texts)} texts"
            )
        return np.asarray(rows, dtype=np.float32)
