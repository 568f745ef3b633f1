"""MicroBatcher against a scriptable fake model running in the batcher's real worker thread."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from meshkit.core.errors import ServiceError
from meshkit.inference.batching import MicroBatcher

DIM = 4
NAME = "testbatch"


def fake_vector(item: str, key: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(f"{key}:{item}".encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


class FakeModel:
    """Records every run; ``delay_s`` simulates inference, ``fail_next`` makes one run raise.

    Returns two arrays of different dtypes and ranks: a vector per item and a per-item length."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.runs: list[tuple[str, list[str]]] = []
        self.fail_next = False
        self.started = threading.Event()

    def __call__(self, items: list[str], key: str) -> tuple[np.ndarray, ...]:
        self.runs.append((key, list(items)))
        self.started.set()
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        return np.vstack([fake_vector(i, key) for i in items]), np.array([len(i) for i in items])


def expected(items: list[str], key: str) -> np.ndarray:
    return np.vstack([fake_vector(i, key) for i in items])


async def make_batcher(
    fake: FakeModel, max_batch: int = 64, window_s: float = 0.01, max_queued: int = 10_000
) -> MicroBatcher[str, str]:
    batcher: MicroBatcher[str, str] = MicroBatcher(
        NAME, fake, max_batch=max_batch, window_s=window_s, max_queued=max_queued, unit="things"
    )
    await batcher.start()
    return batcher


@pytest.fixture
async def fake() -> AsyncIterator[FakeModel]:
    yield FakeModel(delay_s=0.02)


def metric(suffix: str) -> float:
    return REGISTRY.get_sample_value(f"ragmesh_{NAME}_{suffix}") or 0.0


async def test_concurrent_single_item_calls_share_model_runs(fake: FakeModel) -> None:
    runs_before = metric("batch_size_count")
    batcher = await make_batcher(fake)
    try:
        items = [f"item {i}" for i in range(20)]
        results = await asyncio.gather(*(batcher.submit([i], "a") for i in items))
    finally:
        await batcher.stop()
    assert batcher.model_runs <= 2
    assert metric("batch_size_count") - runs_before == batcher.model_runs
    assert sum(len(run) for _, run in fake.runs) == 20
    for item, (vectors, lengths) in zip(items, results, strict=True):
        np.testing.assert_array_equal(vectors, expected([item], "a"))
        assert lengths.tolist() == [len(item)]


async def test_large_request_is_split_and_order_kept(fake: FakeModel) -> None:
    batcher = await make_batcher(fake, max_batch=16)
    try:
        items = [f"item {i}" + "x" * (i % 3) for i in range(50)]
        vectors, lengths = await batcher.submit(items, "a")
    finally:
        await batcher.stop()
    assert [len(run) for _, run in fake.runs] == [16, 16, 16, 2]
    np.testing.assert_array_equal(vectors, expected(items, "a"))
    # Outputs take the dtype and trailing shape of the run's arrays.
    assert vectors.dtype == np.float32 and vectors.shape == (50, DIM)
    assert lengths.dtype == np.array([1]).dtype and lengths.tolist() == [len(i) for i in items]


async def test_requests_fill_partial_batches(fake: FakeModel) -> None:
    batcher = await make_batcher(fake, max_batch=8)
    try:
        a = [f"a{i}" for i in range(5)]
        b = [f"b{i}" for i in range(6)]
        ra, rb = await asyncio.gather(batcher.submit(a, "k"), batcher.submit(b, "k"))
    finally:
        await batcher.stop()
    assert [len(run) for _, run in fake.runs] == [8, 3]
    np.testing.assert_array_equal(ra[0], expected(a, "k"))
    np.testing.assert_array_equal(rb[0], expected(b, "k"))


async def test_keys_never_share_a_run(fake: FakeModel) -> None:
    batcher = await make_batcher(fake)
    try:
        calls = [batcher.submit([f"t{i}"], "odd" if i % 2 else "even") for i in range(10)]
        results = await asyncio.gather(*calls)
    finally:
        await batcher.stop()
    assert len(fake.runs) == 2
    for key, items in fake.runs:
        assert all((int(t[1:]) % 2 == 1) == (key == "odd") for t in items)
    for i, (vectors, _) in enumerate(results):
        np.testing.assert_array_equal(vectors, expected([f"t{i}"], "odd" if i % 2 else "even"))


@pytest.mark.parametrize("runs_before", [0, 1], ids=["idle model", "after a lone caller's run"])
async def test_a_lone_caller_does_not_wait_the_window(runs_before: int) -> None:
    fake = FakeModel()
    batcher = await make_batcher(fake, window_s=0.5)
    try:
        for i in range(runs_before):
            await asyncio.wait_for(batcher.submit([f"earlier {i}"], "k"), 5)
        started = time.perf_counter()
        await asyncio.wait_for(batcher.submit(["alone"], "k"), 5)
        waited = time.perf_counter() - started
    finally:
        await batcher.stop()
    assert waited < 0.25, f"a caller at concurrency 1 waited {waited:.3f} s"


async def test_callers_right_after_a_shared_run_wait_the_window_to_share_one() -> None:
    fake = FakeModel()
    batcher = await make_batcher(fake, window_s=0.3)
    try:
        await asyncio.gather(batcher.submit(["first"], "k"), batcher.submit(["also first"], "k"))
        # The last run was shared and has just ended, so the next caller waits for company; one
        # arrives within the window.
        second = asyncio.create_task(batcher.submit(["second"], "k"))
        await asyncio.sleep(0.05)
        third = asyncio.create_task(batcher.submit(["third"], "k"))
        await asyncio.wait_for(asyncio.gather(second, third), 5)
    finally:
        await batcher.stop()
    assert [run for _, run in fake.runs] == [["first", "also first"], ["second", "third"]]


async def test_key_whose_oldest_item_waited_longest_runs_next() -> None:
    fake = FakeModel(delay_s=0.1)
    batcher = await make_batcher(fake, max_batch=4, window_s=0.0)
    try:
        busy = asyncio.create_task(batcher.submit(["r"], "a"))
        await asyncio.to_thread(fake.started.wait, 5)
        # While "a" occupies the model: b1 arrives first, then a1, then b2.
        b1 = asyncio.create_task(batcher.submit(["b1"], "b"))
        await asyncio.sleep(0.005)
        a1 = asyncio.create_task(batcher.submit(["a1"], "a"))
        await asyncio.sleep(0.005)
        b2 = asyncio.create_task(batcher.submit(["b2"], "b"))
        await asyncio.wait_for(asyncio.gather(busy, b1, a1, b2), 5)
    finally:
        await batcher.stop()
    assert fake.runs == [("a", ["r"]), ("b", ["b1", "b2"]), ("a", ["a1"])]


async def test_cancelled_caller_does_not_break_others() -> None:
    fake = FakeModel(delay_s=0.2)
    batcher = await make_batcher(fake, max_batch=4, window_s=0.0)
    try:
        # `running` occupies the model; `doomed` is queued behind it and cancelled before its run.
        running = asyncio.create_task(batcher.submit(["r1", "r2"], "k"))
        await asyncio.to_thread(fake.started.wait, 5)
        doomed = asyncio.create_task(batcher.submit(["d1", "d2", "d3"], "k"))
        survivor = asyncio.create_task(batcher.submit(["s1"], "k"))
        await asyncio.sleep(0.01)
        doomed.cancel()
        # `running` itself is cancelled mid-run too: the run finishes and is simply not delivered.
        running.cancel()
        vectors, _ = await asyncio.wait_for(survivor, 5)
        np.testing.assert_array_equal(vectors, expected(["s1"], "k"))
        with pytest.raises(asyncio.CancelledError):
            await doomed
        with pytest.raises(asyncio.CancelledError):
            await running
        after, _ = await asyncio.wait_for(batcher.submit(["later"], "k"), 5)
        np.testing.assert_array_equal(after, expected(["later"], "k"))
    finally:
        await batcher.stop()
    seen = [t for _, run in fake.runs for t in run]
    assert not {"d1", "d2", "d3"} & set(seen)


async def test_model_error_fails_only_that_run(fake: FakeModel) -> None:
    errors_before = metric("model_errors_total")
    batcher = await make_batcher(fake)
    try:
        fake.fail_next = True
        with pytest.raises(RuntimeError, match="boom"):
            await batcher.submit(["x"], "k")
        vectors, _ = await batcher.submit(["y"], "k")
        np.testing.assert_array_equal(vectors, expected(["y"], "k"))
    finally:
        await batcher.stop()
    assert metric("model_errors_total") - errors_before == 1


async def test_malformed_model_output_fails_the_run() -> None:
    def short(items: list[str], key: str) -> tuple[np.ndarray, ...]:
        return (np.zeros((len(items) - 1, DIM)),)

    batcher: MicroBatcher[str, str] = MicroBatcher(
        NAME, short, max_batch=8, window_s=0.0, max_queued=100, unit="things"
    )
    await batcher.start()
    try:
        with pytest.raises(RuntimeError, match="malformed"):
            await batcher.submit(["a", "b"], "k")
    finally:
        await batcher.stop()


async def test_empty_submit_is_a_caller_error(fake: FakeModel) -> None:
    batcher = await make_batcher(fake)
    try:
        with pytest.raises(ValueError):
            await batcher.submit([], "k")
    finally:
        await batcher.stop()
    assert fake.runs == []


async def test_overload_and_stopped_answer_unavailable() -> None:
    fake = FakeModel(delay_s=0.2)
    batcher = await make_batcher(fake, max_batch=4, max_queued=6)
    pending = asyncio.create_task(batcher.submit([f"p{i}" for i in range(5)], "k"))
    await asyncio.sleep(0)
    assert metric("queued_things") == 5
    with pytest.raises(ServiceError, match=f"{NAME} overloaded: 5 things") as err:
        await batcher.submit(["a", "b"], "k")
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    await batcher.stop()
    assert metric("queued_things") == 0
    with pytest.raises(ServiceError) as stopped:
        await pending
    assert stopped.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ServiceError, match="not running"):
        await batcher.submit(["c"], "k")


def test_invalid_configuration_is_rejected(fake: FakeModel) -> None:
    with pytest.raises(ValueError, match="metric name"):
        MicroBatcher("bad-name", fake, max_batch=4, window_s=0.0, max_queued=10)
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(NAME, fake, max_batch=0, window_s=0.0, max_queued=10, unit="things")
    # Same name, other unit: the metrics already registered under that name would be wrong.
    MicroBatcher(NAME, fake, max_batch=4, window_s=0.0, max_queued=10, unit="things")
    with pytest.raises(ValueError, match="already counts"):
        MicroBatcher(NAME, fake, max_batch=4, window_s=0.0, max_queued=10, unit="items")
