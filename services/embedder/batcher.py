"""The embedder's use of meshkit's micro-batcher: Embed calls keyed by text kind, plus the
embedder's own counters and the per-call truncation count."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from prometheus_client import Counter

from meshkit.inference.batching import MicroBatcher
from services.embedder.model import TextKind

# (texts, kind) -> (L2-normalised vectors [n, dim], per-text truncation flags [n]).
EmbedFn = Callable[[list[str], TextKind], tuple[np.ndarray, np.ndarray]]

TEXTS_EMBEDDED = Counter("ragmesh_embedder_texts_total", "Texts run through the embedding model.")
TEXTS_TRUNCATED = Counter(
    "ragmesh_embedder_truncated_total", "Texts cut to the model's token limit before embedding."
)


class EmbedBatcher:
    """Concurrent embed calls share model runs (see meshkit.inference.batching for the policy)."""

    def __init__(self, embed_fn: EmbedFn, *, max_batch: int, window_s: float, max_queued_texts: int) -> None:
        self._batcher: MicroBatcher[TextKind, str] = MicroBatcher(
            "embedder",
            embed_fn,
            max_batch=max_batch,
            window_s=window_s,
            max_queued=max_queued_texts,
            unit="texts",
        )

    @property
    def model_runs(self) -> int:
        return self._batcher.model_runs

    async def start(self) -> None:
        await self._batcher.start()

    async def stop(self) -> None:
        await self._batcher.stop()

    async def embed(self, texts: Sequence[str], kind: TextKind) -> tuple[np.ndarray, int]:
        """Vectors for ``texts`` (at least one) in order, and how many were truncated."""
        vectors, flags = await self._batcher.submit(texts, kind)
        truncated = int(flags.sum())
        TEXTS_EMBEDDED.inc(len(texts))
        TEXTS_TRUNCATED.inc(truncated)
        return vectors, truncated
