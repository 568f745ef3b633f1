"""Dynamic micro-batching: concurrent requests share model runs.

Callers submit their items under a key and await a future. One loop takes the key whose oldest item
has waited longest, lets the batch fill for up to ``window_s`` (or until ``max_batch`` items), runs
the model once in a dedicated thread and hands each caller its rows. Items under different keys
never share a run (the embedder keys by query/passage, whose prefixes differ). Only one model run
happens at a time: ONNX Runtime already spreads a run over every core, so overlapping runs would
only contend. While a run is in progress new callers queue up, so under load batches fill without
waiting for the window.

The window is only waited when callers are concurrent: when the last run served several
callers and ended within the last window. Otherwise a caller runs at once with whatever is
queued, since waiting would only add the window to a lone caller's latency (4 ms of an embedder
call that takes 5 ms of model time at concurrency 1). Under load, callers that queue during a
run make the next run a shared one, and from then on the window applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from meshkit.core.errors import unavailable

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

# (items, key) -> arrays whose first dimension is len(items), row i belonging to items[i].
# Runs in the batcher's single worker thread.
RunFn = Callable[[list[T], K], tuple[np.ndarray, ...]]

_METRIC_PART = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class _Metrics:
    unit: str
    batch_size: Histogram
    model_run_seconds: Histogram
    queue_wait_seconds: Histogram
    queued: Gauge
    model_errors: Counter


# Prometheus refuses to register a name twice, and several batchers with one name can live in a
# process (tests, benchmarks): they share one set of metrics.
_METRICS: dict[str, _Metrics] = {}


def _metrics_for(name: str, unit: str) -> _Metrics:
    metrics = _METRICS.get(name)
    if metrics is None:
        metrics = _METRICS[name] = _new_metrics(name, unit)
    elif metrics.unit != unit:
        raise ValueError(f"batcher {name!r} already counts {metrics.unit!r}, not {unit!r}")
    return metrics


def _new_metrics(name: str, unit: str) -> _Metrics:
    prefix = f"ragmesh_{name}"
    return _Metrics(
        unit=unit,
        batch_size=Histogram(
            f"{prefix}_batch_size",
            f"{unit.capitalize()} per batched model run.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        ),
        model_run_seconds=Histogram(
            f"{prefix}_model_run_seconds",
            "Wall time of one model run.",
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        ),
        queue_wait_seconds=Histogram(
            f"{prefix}_queue_wait_seconds",
            "Time from enqueue to the start of the model run that takes the request's rows.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        ),
        queued=Gauge(f"{prefix}_queued_{unit}", f"{unit.capitalize()} waiting for a model run."),
        model_errors=Counter(f"{prefix}_model_errors_total", "Model runs that raised."),
    )


@dataclass(eq=False)
class _Job(Generic[T]):
    """One caller's request; its rows are filled in as the model runs that cover them finish."""

    items: Sequence[T]
    future: asyncio.Future[tuple[np.ndarray, ...]]
    remaining: int
    # Allocated on first delivery: only the model knows the arrays' dtypes and trailing shapes.
    outputs: tuple[np.ndarray, ...] | None = None

    def deliver(self, start: int, rows: tuple[np.ndarray, ...]) -> None:
        if self.future.done():  # cancelled or failed by an earlier run
            return
        if self.outputs is None:
            self.outputs = tuple(np.empty((len(self.items), *a.shape[1:]), dtype=a.dtype) for a in rows)
        elif not _same_layout(self.outputs, rows):
            # Two runs of one request disagreed: the model is broken, not just this run.
            self.fail(RuntimeError("model runs returned arrays of different shapes or types"))
            return
        count = len(rows[0])
        for out, part in zip(self.outputs, rows, strict=True):
            out[start : start + count] = part
        self.remaining -= count
        if self.remaining == 0:
            self.future.set_result(self.outputs)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


def _same_layout(outputs: tuple[np.ndarray, ...], rows: tuple[np.ndarray, ...]) -> bool:
    return len(outputs) == len(rows) and all(
        o.dtype == r.dtype and o.shape[1:] == r.shape[1:] for o, r in zip(outputs, rows, strict=True)
    )


@dataclass(eq=False)
class _Slice(Generic[T]):
    """Rows [start, end) of a job, waiting in a queue."""

    job: _Job[T]
    start: int
    end: int
    enqueued: float

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class _Queue(Generic[T]):
    slices: deque[_Slice[T]] = field(default_factory=deque)
    items: int = 0


class MicroBatcher(Generic[K, T]):
    """Batches ``submit`` calls into runs of ``run_fn``; ``name`` and ``unit`` name the metrics
    (ragmesh_<name>_batch_size, ..._queued_<unit>) and appear in error messages."""

    def __init__(
        self,
        name: str,
        run_fn: RunFn[T, K],
        *,
        max_batch: int,
        window_s: float,
        max_queued: int,
        unit: str = "items",
    ) -> None:
        if not _METRIC_PART.fullmatch(name) or not _METRIC_PART.fullmatch(unit):
            raise ValueError("name and unit must be lowercase metric name parts ([a-z][a-z0-9_]*)")
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._name = name
        self._unit = unit
        self._run_fn = run_fn
        self._max_batch = max_batch
        self._window_s = max(window_s, 0.0)
        self._max_queued = max_queued
        self._metrics = _metrics_for(name, unit)
        self._log = logging.getLogger(f"ragmesh.{name}.batcher")
        # Created on first use and dropped when drained, so any number of distinct keys is fine.
        self._queues: dict[K, _Queue[T]] = {}
        self._queued = 0
        self._arrived = asyncio.Event()
        self._in_flight: list[_Slice[T]] = []
        # What the last run showed of concurrency: when it ended and how many callers it served.
        self._last_run_end = -float("inf")
        self._last_run_callers = 0
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        # Plain counter next to the Prometheus ones so tests and benchmarks can read it directly.
        self.model_runs = 0

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("batcher already started")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self._name}-model")
        self._task = asyncio.create_task(self._loop(), name=f"{self._name}-batcher")
        self._task.add_done_callback(self._log_unexpected_exit)

    async def stop(self) -> None:
        """Stop batching; callers still waiting get UNAVAILABLE so they can retry elsewhere."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        error = unavailable(f"{self._name} is shutting down")
        for queued in self._queues.values():
            for piece in queued.slices:
                piece.job.fail(error)
        self._queues.clear()
        for piece in self._in_flight:
            piece.job.fail(error)
        self._queued = 0
        self._metrics.queued.set(0)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, items: Sequence[T], key: K) -> tuple[np.ndarray, ...]:
        """``run_fn``'s arrays for ``items``, rows in input order. Cancellation-safe.

        Empty ``items`` raise ValueError: without a run there are no shapes to build empty arrays
        from, so callers answer empty requests themselves.
        """
        if not items:
            raise ValueError("submit needs at least one item")
        if self._task is None or self._task.done():
            raise unavailable(f"{self._name} batcher is not running")
        if self._queued + len(items) > self._max_queued:
            raise unavailable(
                f"{self._name} overloaded: {self._queued} {self._unit} already queued, retry later"
            )
        loop = asyncio.get_running_loop()
        job = _Job(items=items, future=loop.create_future(), remaining=len(items))
        self._enqueue(job, key, loop.time())
        # If this caller is cancelled (deadline, disconnect) the future is cancelled with it and
        # the loop skips its rows; nobody else is affected.
        return await job.future

    def _enqueue(self, job: _Job[T], key: K, now: float) -> None:
        queue = self._queues.setdefault(key, _Queue())
        for start in range(0, len(job.items), self._max_batch):
            end = min(start + self._max_batch, len(job.items))
            queue.slices.append(_Slice(job, start, end, now))
        queue.items += len(job.items)
        self._queued += len(job.items)
        self._metrics.queued.set(self._queued)
        self._arrived.set()

    async def _loop(self) -> None:
        while True:
            key = await self._next_key()
            await self._fill_window(self._queues[key])
            batch = self._take(key)
            if batch:
                await self._run(key, batch)

    async def _next_key(self) -> K:
        """The key whose oldest item has waited longest (FIFO across keys)."""
        while True:
            if self._queues:
                return min(self._queues, key=lambda key: self._queues[key].slices[0].enqueued)
            self._arrived.clear()
            await self._arrived.wait()

    async def _fill_window(self, queue: _Queue[T]) -> None:
        loop = asyncio.get_running_loop()
        if not self._callers_are_concurrent(queue.slices[0].enqueued):
            return
        deadline = queue.slices[0].enqueued + self._window_s
        while queue.items < self._max_batch:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    def _callers_are_concurrent(self, enqueued: float) -> bool:
        """Whether waiting for more callers is likely to pay: the last run was shared and had
        not been over for a whole window when this item arrived."""
        return self._last_run_callers > 1 and enqueued - self._last_run_end <= self._window_s

    def _take(self, key: K) -> list[_Slice[T]]:
        """Up to max_batch items from the head of the queue, splitting a slice that does not fit."""
        queue = self._queues[key]
        batch: list[_Slice[T]] = []
        room = self._max_batch
        while queue.slices and room > 0:
            piece = queue.slices.popleft()
            if piece.job.future.done():  # cancelled or already failed
                self._dequeued(queue, piece.size)
                continue
            if piece.size > room:
                queue.slices.appendleft(_Slice(piece.job, piece.start + room, piece.end, piece.enqueued))
                piece = _Slice(piece.job, piece.start, piece.start + room, piece.enqueued)
            self._dequeued(queue, piece.size)
            batch.append(piece)
            room -= piece.size
        if not queue.slices:
            # _next_key relies on every queue it sees holding at least one slice.
            del self._queues[key]
        self._metrics.queued.set(self._queued)
        return batch

    def _dequeued(self, queue: _Queue[T], count: int) -> None:
        queue.items -= count
        self._queued -= count

    async def _run(self, key: K, batch: list[_Slice[T]]) -> None:
        loop = asyncio.get_running_loop()
        items = [item for piece in batch for item in piece.job.items[piece.start : piece.end]]
        now = loop.time()
        for piece in batch:
            self._metrics.queue_wait_seconds.observe(now - piece.enqueued)
        self._in_flight = batch
        self._last_run_callers = len({id(piece.job) for piece in batch})
        started = time.perf_counter()
        # Not cleared on cancellation: stop() fails the callers of the run it interrupted.
        try:
            arrays = await loop.run_in_executor(self._executor, self._run_fn, items, key)
            _check_output(arrays, len(items))
        except Exception as exc:
            self._in_flight = []
            self._last_run_end = loop.time()
            self._metrics.model_errors.inc()
            self._log.exception("model run failed", extra={"items": len(items), "key": str(key)})
            for piece in batch:
                piece.job.fail(exc)
            return
        self._in_flight = []
        self._last_run_end = loop.time()
        self.model_runs += 1
        self._metrics.model_run_seconds.observe(time.perf_counter() - started)
        self._metrics.batch_size.observe(len(items))
        offset = 0
        for piece in batch:
            piece.job.deliver(piece.start, tuple(a[offset : offset + piece.size] for a in arrays))
            offset += piece.size

    def _log_unexpected_exit(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._log.error("batch loop died", exc_info=task.exception())


def _check_output(arrays: object, count: int) -> None:
    """A run must return a non-empty tuple of arrays with one row per item, or nobody can be served."""
    if (
        not isinstance(arrays, tuple)
        or not arrays
        or not all(isinstance(a, np.ndarray) and a.ndim >= 1 and len(a) == count for a in arrays)
    ):
        raise RuntimeError(f"model run for {count} items returned a malformed result")
