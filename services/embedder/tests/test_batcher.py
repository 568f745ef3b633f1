"""The embedder's side of batching: kinds as keys, truncation counts and the embedder's counters.
The batching policy itself is tested in libs/tests/test_batching.py."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
from prometheus_client import REGISTRY

from services.embedder.batcher import EmbedBatcher
from services.embedder.model import EmbeddingModel, TextKind

DIM = 8


def fake_vector(text: str, kind: TextKind) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(f"{kind.value}:{text}".encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def fake_embed(texts: list[str], kind: TextKind) -> tuple[np.ndarray, np.ndarray]:
    """Texts containing "long" count as truncated."""
    vectors = np.vstack([fake_vector(t, kind) for t in texts])
    return vectors, np.array(["long" in t for t in texts], dtype=bool)


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_truncation_is_counted_per_call_across_split_runs() -> None:
    batcher = EmbedBatcher(fake_embed, max_batch=16, window_s=0.005, max_queued_texts=1000)
    await batcher.start()
    texts_before = counter("ragmesh_embedder_texts_total")
    truncated_before = counter("ragmesh_embedder_truncated_total")
    try:
        texts = [f"text {i}" + (" long" if i % 7 == 0 else "") for i in range(50)]
        queries = [f"query {i}" for i in range(3)]
        (vectors, truncated), (q_vectors, q_truncated) = await asyncio.gather(
            batcher.embed(texts, TextKind.PASSAGE), batcher.embed(queries, TextKind.QUERY)
        )
    finally:
        await batcher.stop()
    assert batcher.model_runs == 5  # 50 passages in runs of 16, the queries alone
    np.testing.assert_array_equal(vectors, np.vstack([fake_vector(t, TextKind.PASSAGE) for t in texts]))
    np.testing.assert_array_equal(q_vectors, np.vstack([fake_vector(t, TextKind.QUERY) for t in queries]))
    assert truncated == sum(1 for t in texts if "long" in t)
    assert q_truncated == 0
    assert counter("ragmesh_embedder_texts_total") - texts_before == 53
    assert counter("ragmesh_embedder_truncated_total") - truncated_before == truncated


async def test_real_model_through_batcher_matches_direct(model: EmbeddingModel) -> None:
    batcher = EmbedBatcher(model.embed_with_flags, max_batch=4, window_s=0.005, max_queued_texts=100)
    await batcher.start()
    texts = [
        "alpha beta",
        "a much longer sentence about embeddings and batching",
        "gamma",
        "word " * 400,
        "z",
    ]
    try:
        results = await asyncio.gather(*(batcher.embed([t], TextKind.PASSAGE) for t in texts))
    finally:
        await batcher.stop()
    direct, truncated = model.embed(texts, TextKind.PASSAGE)
    np.testing.assert_allclose(np.vstack([r[0] for r in results]), direct, atol=1e-4)
    assert [r[1] for r in results] == [0, 0, 0, 1, 0]
    assert truncated == 1
