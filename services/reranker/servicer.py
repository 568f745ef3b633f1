"""gRPC face of the reranker: request validation, the shared micro-batcher, the selection rules.

Validation rules (what callers can rely on):
- ``query``: a non-whitespace character (INVALID_ARGUMENT), at most reranker_max_query_chars
  characters (RESOURCE_EXHAUSTED).
- ``passages``: 1..reranker_max_passages (none: INVALID_ARGUMENT, more: RESOURCE_EXHAUSTED); ids
  non-empty and unique, texts non-empty (INVALID_ARGUMENT), at most reranker_max_passage_chars
  characters (RESOURCE_EXHAUSTED). Pairs over the model's token limit are cut, not rejected.
- ``min_score`` must be finite; ``fallback_count`` at most reranker_max_passages.
- Overload (more than reranker_max_queued_pairs waiting) or shutdown: UNAVAILABLE, safe to retry.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from grpc import aio
from prometheus_client import Counter

from meshkit.core.errors import failed_precondition, invalid_argument, resource_exhausted
from meshkit.domain.ids import check_item_list
from meshkit.inference.batching import MicroBatcher
from meshkit.rpc.identity import GATEWAY, OPS, Callers, allow
from meshkit.rpc.server import ITEM_OVERHEAD_BYTES, ServiceSpec, text_request_bytes
from meshkit.settings import RerankerSettings
from meshkit.storage.objectstore import ObjectStore
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc
from services.reranker.cache import ScoreCache, Scored, pair_key
from services.reranker.fetch import fetch_model_dir
from services.reranker.model import TWO_CLASS, CrossEncoderModel
from services.reranker.selection import select

log = logging.getLogger("ragmesh.reranker")

SERVICE_NAME = "reranker"
# Every pair shares one queue: there is no per-kind input prefix as in the embedder.
_KEY = "pairs"

PAIRS_SCORED = Counter("ragmesh_reranker_pairs_total", "Pairs run through the cross-encoder.")
PAIRS_TRUNCATED = Counter("ragmesh_reranker_truncated_total", "Pairs cut to the model's token limit.")
CACHE_HITS = Counter("ragmesh_reranker_cache_hits_total", "Pairs answered from the score cache.")
FALLBACKS = Counter("ragmesh_reranker_fallback_total", "Rerank calls where no passage passed the threshold.")


def validate(request: reranker_pb2.RerankRequest, settings: RerankerSettings) -> None:
    if not request.query.strip():
        raise invalid_argument("query is empty")
    if len(request.query) > settings.reranker_max_query_chars:
        raise resource_exhausted(
            f"query has {len(request.query)} characters; the limit is {settings.reranker_max_query_chars}"
        )
    validate_passages(request.passages, settings)
    if request.HasField("min_score") and not math.isfinite(request.min_score):
        raise invalid_argument("min_score must be a finite number")
    if request.HasField("fallback_count") and request.fallback_count > settings.reranker_max_passages:
        limit = settings.reranker_max_passages
        raise invalid_argument(f"fallback_count {request.fallback_count} exceeds the passage limit {limit}")


def validate_passages(passages: Sequence[reranker_pb2.Passage], settings: RerankerSettings) -> None:
    if not passages:
        raise invalid_argument("passages must hold at least one passage")
    check_item_list([p.id for p in passages], "passages", settings.reranker_max_passages)
    for i, passage in enumerate(passages):
        if not passage.text.strip():
            raise invalid_argument(f"passages[{i}].text is empty")
        if len(passage.text) > settings.reranker_max_passage_chars:
            raise resource_exhausted(
                f"passages[{i}].text has {len(passage.text)} characters; "
                f"the limit is {settings.reranker_max_passage_chars}"
            )


async def resolve_model_dir(settings: RerankerSettings) -> Path:
    """The local model directory: fetched from the models bucket when a uri is configured."""
    if not settings.reranker_model_uri:
        return settings.reranker_model_dir
    cache = settings.reranker_cache_dir or settings.state_dir / "models"
    return await fetch_model_dir(ObjectStore.from_settings(settings), settings.reranker_model_uri, cache)


class RerankerServicer(reranker_pb2_grpc.RerankerServiceServicer):
    """Owns the model and the batcher; ``start`` loads the model (or adopts a preloaded one)."""

    def __init__(self, settings: RerankerSettings, model: CrossEncoderModel | None = None) -> None:
        self._settings = settings
        self._model = model
        self._batcher: MicroBatcher[str, tuple[str, str]] | None = None
        self.cache = ScoreCache(settings.reranker_score_cache_pairs)

    async def start(self) -> None:
        if self._model is None:
            model_dir = await resolve_model_dir(self._settings)
            self._model = await asyncio.to_thread(
                CrossEncoderModel.load,
                model_dir,
                provider=self._settings.reranker_provider,
                max_tokens=self._settings.reranker_max_tokens,
                max_batch=self._settings.reranker_max_batch,
                threads=self._settings.reranker_threads,
                spinning=self._settings.reranker_allow_spinning,
                window=self._settings.reranker_passage_window,
                window_head_tokens=self._settings.reranker_window_head_tokens,
            )
        model = self._model

        def run(pairs: list[tuple[str, str]], _key: str) -> tuple[np.ndarray, np.ndarray]:
            return model.score_pairs_with_flags([q for q, _ in pairs], [p for _, p in pairs])

        self._batcher = MicroBatcher(
            SERVICE_NAME,
            run,
            max_batch=self._settings.reranker_max_batch,
            window_s=self._settings.reranker_batch_window_ms / 1000.0,
            max_queued=self._settings.reranker_max_queued_pairs,
            unit="pairs",
        )
        await self._batcher.start()

    async def stop(self) -> None:
        if self._batcher is not None:
            await self._batcher.stop()

    @property
    def model(self) -> CrossEncoderModel:
        if self._model is None or self._batcher is None:
            raise failed_precondition("reranker model is not loaded yet")
        return self._model

    @property
    def batcher(self) -> MicroBatcher[str, tuple[str, str]]:
        if self._batcher is None:
            raise failed_precondition("reranker model is not loaded yet")
        return self._batcher

    async def Rerank(
        self, request: reranker_pb2.RerankRequest, context: aio.ServicerContext
    ) -> reranker_pb2.RerankResponse:
        validate(request, self._settings)
        settings = self._settings
        pairs = [(request.query, p.text) for p in request.passages]
        scores, truncated = await self._scores(pairs, cached=not request.uncached)
        chosen = select(
            scores.tolist(),
            request.min_score if request.HasField("min_score") else settings.reranker_min_score,
            request.fallback_count
            if request.HasField("fallback_count")
            else settings.reranker_fallback_count,
            request.top_n,
        )
        if chosen.fallback:
            FALLBACKS.inc()
        return reranker_pb2.RerankResponse(
            results=[
                reranker_pb2.RerankedPassage(
                    id=request.passages[i].id,
                    score=float(scores[i]),
                    input_index=i,
                    truncated=bool(truncated[i]),
                )
                for i in chosen.order
            ],
            fallback=chosen.fallback,
            scored=len(pairs),
            model=self.model.manifest.name,
        )

    async def _scores(self, pairs: list[tuple[str, str]], cached: bool) -> tuple[np.ndarray, np.ndarray]:
        """Scores and truncation flags of ``pairs``: from the cache (unless not ``cached``), the
        others run through the model (and kept)."""
        keys = [pair_key(query, text) for query, text in pairs]
        found: list[Scored | None] = [self.cache.get(key) if cached else None for key in keys]
        missing = [i for i, hit in enumerate(found) if hit is None]
        CACHE_HITS.inc(len(pairs) - len(missing))
        if missing:
            scores, truncated = await self.batcher.submit([pairs[i] for i in missing], _KEY)
            PAIRS_SCORED.inc(len(missing))
            PAIRS_TRUNCATED.inc(int(truncated.sum()))
            for i, score, cut in zip(missing, scores.tolist(), truncated.tolist(), strict=True):
                found[i] = (float(score), bool(cut))
                self.cache.put(keys[i], (float(score), bool(cut)))
        known = [hit for hit in found if hit is not None]
        return np.array([s for s, _ in known], dtype=np.float32), np.array([c for _, c in known], dtype=bool)

    async def GetModelInfo(
        self, request: reranker_pb2.GetModelInfoRequest, context: aio.ServicerContext
    ) -> reranker_pb2.GetModelInfoResponse:
        model, settings = self.model, self._settings
        return reranker_pb2.GetModelInfoResponse(
            model=model.manifest.name,
            head=reranker_pb2.HEAD_TWO_CLASS if model.head == TWO_CLASS else reranker_pb2.HEAD_SINGLE_LOGIT,
            max_tokens=model.max_tokens,
            max_batch=model.max_batch,
            provider=model.provider,
            model_sha256=model.model_sha256,
            default_min_score=settings.reranker_min_score,
            default_fallback_count=settings.reranker_fallback_count,
            max_passages=settings.reranker_max_passages,
        )


# Who may call the reranker (RAGMESH_SERVICE_AUTH=mtls).
CALLERS: Callers = {"Rerank": allow(GATEWAY, OPS), "GetModelInfo": allow(GATEWAY, OPS)}


def max_request_bytes(settings: RerankerSettings) -> int:
    """The largest legal Rerank: the most passages, each of the longest length, and a query."""
    return text_request_bytes(
        settings.reranker_max_passages,
        settings.reranker_max_passage_chars,
        ITEM_OVERHEAD_BYTES,
        settings.reranker_max_query_chars,
    )


def build_spec(
    settings: RerankerSettings, model: CrossEncoderModel | None = None
) -> tuple[ServiceSpec, RerankerServicer]:
    """The service spec for run_service/start_service; ``model`` lets tests reuse a loaded one."""
    servicer = RerankerServicer(settings, model)

    def register(server: aio.Server) -> None:
        reranker_pb2_grpc.add_RerankerServiceServicer_to_server(servicer, server)

    spec = ServiceSpec(
        name=SERVICE_NAME,
        grpc_services=[reranker_pb2.DESCRIPTOR.services_by_name["RerankerService"].full_name],
        register=register,
        on_start=[servicer.start],
        on_stop=[servicer.stop],
        multiprocess_safe=True,
        callers=CALLERS,
        max_request_bytes=max_request_bytes(settings),
    )
    return spec, servicer
