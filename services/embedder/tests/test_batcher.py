from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from meshkit.errors import ServiceError
from services.embedder.batcher import MicroBatcher
from services.embedder.model import EmbeddingModel, TextKind

DIM = 8


def fake_vector(text: str, kind: TextKind) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(f"{kind.value}:{text}".encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


class FakeModel:
    """Records every run; optional delay simulates inference, `fail_next` makes one run raise."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.runs: list[tuple[TextKind, list[str]]] = []
        self.fail_next = False
        self.started = threading.Event()

    def __call__(self, texts: list[str], kind: TextKind) -> tuple[np.ndarray, np.ndarray]:
        self.runs.append((kind, list(texts)))
        self.started.set()
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        vectors = np.vstack([fake_vector(t, kind) for t in texts])
        return vectors, np.array(["long" in t for t in texts], dtype=bool)


async def make_batcher(
    fake: FakeModel, max_batch: int = 64, window_s: float = 0.01, max_queued: int = 10_000
) -> MicroBatcher:
    batcher = MicroBatcher(fake, DIM, max_batch=max_batch, window_s=window_s, max_queued_texts=max_queued)
    await batcher.start()
    return batcher


@pytest.fixture
async def fake() -> AsyncIterator[FakeModel]:
    yield FakeModel(delay_s=0.02)


def expected(texts: list[str], kind: TextKind) -> np.ndarray:
    return np.vstack([fake_vector(t, kind) for t in texts])


async def test_concurrent_single_text_calls_share_model_runs(fake: FakeModel) -> None:
    batcher = await make_batcher(fake)
    try:
        texts = [f"text {i}" for i in range(20)]
        results = await asyncio.gather(*(batcher.embed([t], TextKind.PASSAGE) for t in texts))
    finally:
        await batcher.stop()
    assert batcher.model_runs <= 2
    assert sum(len(run) for _, run in fake.runs) == 20
    for text, (vectors, truncated) in zip(texts, results, strict=True):
        np.testing.assert_array_equal(vectors, expected([text], TextKind.PASSAGE))
        assert truncated == 0


async def test_large_request_is_split_and_order_kept(fake: FakeModel) -> None:
    batcher = await make_batcher(fake, max_batch=16)
    try:
        texts = [f"text {i}" + (" long" if i % 7 == 0 else "") for i in range(50)]
        vectors, truncated = await batcher.embed(texts, TextKind.PASSAGE)
    finally:
        await batcher.stop()
    assert [len(run) for _, run in fake.runs] == [16, 16, 16, 2]
    np.testing.assert_array_equal(vectors, expected(texts, TextKind.PASSAGE))
    assert truncated == sum(1 for t in texts if "long" in t)


async def test_requests_fill_partial_batches(fake: FakeModel) -> None:
    batcher = await make_batcher(fake, max_batch=8)
    try:
        a = [f"a{i}" for i in range(5)]
        b = [f"b{i}" for i in range(6)]
        ra, rb = await asyncio.gather(batcher.embed(a, TextKind.QUERY), batcher.embed(b, TextKind.QUERY))
    finally:
        await batcher.stop()
    assert [len(run) for _, run in fake.runs] == [8, 3]
    np.testing.assert_array_equal(ra[0], expected(a, TextKind.QUERY))
    np.testing.assert_array_equal(rb[0], expected(b, TextKind.QUERY))


async def test_kinds_never_share_a_run(fake: FakeModel) -> None:
    batcher = await make_batcher(fake)
    try:
        calls = [batcher.embed([f"t{i}"], TextKind.QUERY if i % 2 else TextKind.PASSAGE) for i in range(10)]
        results = await asyncio.gather(*calls)
    finally:
        await batcher.stop()
    assert len(fake.runs) == 2
    for kind, texts in fake.runs:
        assert all((int(t[1:]) % 2 == 1) == (kind is TextKind.QUERY) for t in texts)
    for i, (vectors, _) in enumerate(results):
        np.testing.assert_array_equal(
            vectors, expected([f"t{i}"], TextKind.QUERY if i % 2 else TextKind.PASSAGE)
        )


async def test_cancelled_caller_does_not_break_others() -> None:
    fake = FakeModel(delay_s=0.2)
    batcher = await make_batcher(fake, max_batch=4, window_s=0.0)
    try:
        # `running` occupies the model; `doomed` is queued behind it and cancelled before its run.
        running = asyncio.create_task(batcher.embed(["r1", "r2"], TextKind.PASSAGE))
        await asyncio.to_thread(fake.started.wait, 5)
        doomed = asyncio.create_task(batcher.embed(["d1", "d2", "d3"], TextKind.PASSAGE))
        survivor = asyncio.create_task(batcher.embed(["s1"], TextKind.PASSAGE))
        await asyncio.sleep(0.01)
        doomed.cancel()
        # `running` itself is cancelled mid-run too: the run finishes and is simply not delivered.
        running.cancel()
        vectors, _ = await asyncio.wait_for(survivor, 5)
        np.testing.assert_array_equal(vectors, expected(["s1"], TextKind.PASSAGE))
        with pytest.raises(asyncio.CancelledError):
            await doomed
        with pytest.raises(asyncio.CancelledError):
            await running
        after, _ = await asyncio.wait_for(batcher.embed(["later"], TextKind.PASSAGE), 5)
        np.testing.assert_array_equal(after, expected(["later"], TextKind.PASSAGE))
    finally:
        await batcher.stop()
    seen = [t for _, run in fake.runs for t in run]
    assert not {"d1", "d2", "d3"} & set(seen)


async def test_model_error_fails_only_that_run(fake: FakeModel) -> None:
    batcher = await make_batcher(fake)
    try:
        fake.fail_next = True
        with pytest.raises(RuntimeError, match="boom"):
            await batcher.embed(["x"], TextKind.PASSAGE)
        vectors, _ = await batcher.embed(["y"], TextKind.PASSAGE)
        np.testing.assert_array_equal(vectors, expected(["y"], TextKind.PASSAGE))
    finally:
        await batcher.stop()


async def test_overload_and_stopped_answer_unavailable() -> None:
    fake = FakeModel(delay_s=0.2)
    batcher = await make_batcher(fake, max_batch=4, max_queued=6)
    pending = asyncio.create_task(batcher.embed([f"p{i}" for i in range(5)], TextKind.PASSAGE))
    await asyncio.sleep(0)
    with pytest.raises(ServiceError) as err:
        await batcher.embed(["a", "b"], TextKind.PASSAGE)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    await batcher.stop()
    with pytest.raises(ServiceError) as stopped:
        await pending
    assert stopped.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ServiceError, match="not running"):
        await batcher.embed(["c"], TextKind.PASSAGE)


async def test_real_model_through_batcher_matches_direct(model: EmbeddingModel) -> None:
    batcher = MicroBatcher(
        model.embed_with_flags, model.dimension, max_batch=4, window_s=0.005, max_queued_texts=100
    )
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
