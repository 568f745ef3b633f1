"""Dynamic micro-batching: concurrent Embed calls share model runs.

Callers enqueue their texts and await a future. One loop takes the oldest waiting kind, lets the
batch fill for up to ``window`` (or until ``max_batch`` texts), runs the model once in a dedicated
thread and hands each caller its rows. Only one model run happens at a time: ONNX Runtime already
spreads a run over every core, so overlapping runs would only contend. While a run is in progress
new callers queue up, so under load batches fill without waiting for the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from meshkit.errors import unavailable
from services.embedder.model import TextKind

log = logging.getLogger("ragmesh.embedder.batcher")

# (texts, kind) -> (L2-normalised vectors [n, dim], per-text truncation flags [n]).
EmbedFn = Callable[[list[str], TextKind], tuple[np.ndarray, np.ndarray]]

TEXTS_EMBEDDED = Counter("ragmesh_embedder_texts_total", "Texts run through the embedding model.")
TEXTS_TRUNCATED = Counter(
    "ragmesh_embedder_truncated_total", "Texts cut to the model's token limit before embedding."
)
BATCH_SIZE = Histogram(
    "ragmesh_embedder_batch_size",
    "Texts per batched model call (split further into ONNX runs by token budget).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
MODEL_RUN_SECONDS = Histogram(
    "ragmesh_embedder_model_run_seconds",
    "Wall time of one model run (tokenize, infer, pool).",
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUEUE_WAIT_SECONDS = Histogram(
    "ragmesh_embedder_queue_wait_seconds",
    "Time from enqueue to the start of the model run that takes the text.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
QUEUED_TEXTS = Gauge("ragmesh_embedder_queued_texts", "Texts waiting for a model run.")
MODEL_ERRORS = Counter("ragmesh_embedder_model_errors_total", "Model runs that raised.")


@dataclass(eq=False)
class _Job:
    """One caller's request; its rows are filled in as the model runs that cover them finish."""

    texts: Sequence[str]
    future: asyncio.Future[tuple[np.ndarray, int]]
    vectors: np.ndarray
    truncated: np.ndarray
    remaining: int

    def deliver(self, start: int, vectors: np.ndarray, flags: np.ndarray) -> None:
        end = start + len(vectors)
        self.vectors[start:end] = vectors
        self.truncated[start:end] = flags
        self.remaining -= len(vectors)
        if self.remaining == 0 and not self.future.done():
            self.future.set_result((self.vectors, int(self.truncated.sum())))

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


@dataclass(eq=False)
class _Slice:
    """Rows [start, end) of a job, waiting in a queue."""

    job: _Job
    start: int
    end: int
    enqueued: float

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class _Queue:
    slices: deque[_Slice] = field(default_factory=deque)
    texts: int = 0


class MicroBatcher:
    def __init__(
        self,
        embed_fn: EmbedFn,
        dimension: int,
        max_batch: int,
        window_s: float,
        max_queued_texts: int,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._embed_fn = embed_fn
        self._dimension = dimension
        self._max_batch = max_batch
        self._window_s = max(window_s, 0.0)
        self._max_queued = max_queued_texts
        self._queues: dict[TextKind, _Queue] = {kind: _Queue() for kind in TextKind}
        self._queued = 0
        self._arrived = asyncio.Event()
        self._in_flight: list[_Slice] = []
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        # Plain counter next to the Prometheus one so tests and benchmarks can read it directly.
        self.model_runs = 0

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("batcher already started")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder-model")
        self._task = asyncio.create_task(self._loop(), name="embedder-batcher")
        self._task.add_done_callback(_log_unexpected_exit)

    async def stop(self) -> None:
        """Stop batching; callers still waiting get UNAVAILABLE so they can retry elsewhere."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        error = unavailable("embedder is shutting down")
        for queued in self._queues.values():
            for piece in queued.slices:
                piece.job.fail(error)
            queued.slices.clear()
            queued.texts = 0
        for piece in self._in_flight:
            piece.job.fail(error)
        self._queued = 0
        QUEUED_TEXTS.set(0)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def embed(self, texts: Sequence[str], kind: TextKind) -> tuple[np.ndarray, int]:
        """Vectors for ``texts`` in order, and how many were truncated. Cancellation-safe."""
        if self._task is None or self._task.done():
            raise unavailable("embedder batcher is not running")
        if self._queued + len(texts) > self._max_queued:
            raise unavailable(f"embedder overloaded: {self._queued} texts already queued, retry later")
        if not texts:
            return np.empty((0, self._dimension), dtype=np.float32), 0
        loop = asyncio.get_running_loop()
        job = _Job(
            texts=texts,
            future=loop.create_future(),
            vectors=np.empty((len(texts), self._dimension), dtype=np.float32),
            truncated=np.zeros(len(texts), dtype=bool),
            remaining=len(texts),
        )
        self._enqueue(job, kind, loop.time())
        # If this caller is cancelled (deadline, disconnect) the future is cancelled with it and
        # the loop skips its rows; nobody else is affected.
        return await job.future

    def _enqueue(self, job: _Job, kind: TextKind, now: float) -> None:
        queue = self._queues[kind]
        for start in range(0, len(job.texts), self._max_batch):
            end = min(start + self._max_batch, len(job.texts))
            queue.slices.append(_Slice(job, start, end, now))
        queue.texts += len(job.texts)
        self._queued += len(job.texts)
        QUEUED_TEXTS.set(self._queued)
        self._arrived.set()

    async def _loop(self) -> None:
        while True:
            kind = await self._next_kind()
            await self._fill_window(kind)
            batch = self._take(kind)
            if batch:
                await self._run(kind, batch)

    async def _next_kind(self) -> TextKind:
        """The kind whose oldest text has waited longest (FIFO across kinds)."""
        while True:
            waiting = [kind for kind, queue in self._queues.items() if queue.slices]
            if waiting:
                return min(waiting, key=lambda kind: self._queues[kind].slices[0].enqueued)
            self._arrived.clear()
            await self._arrived.wait()

    async def _fill_window(self, kind: TextKind) -> None:
        loop = asyncio.get_running_loop()
        queue = self._queues[kind]
        deadline = queue.slices[0].enqueued + self._window_s
        while queue.texts < self._max_batch:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    def _take(self, kind: TextKind) -> list[_Slice]:
        """Up to max_batch texts from the head of the queue, splitting a slice that does not fit."""
        queue = self._queues[kind]
        batch: list[_Slice] = []
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
        QUEUED_TEXTS.set(self._queued)
        return batch

    def _dequeued(self, queue: _Queue, count: int) -> None:
        queue.texts -= count
        self._queued -= count

    async def _run(self, kind: TextKind, batch: list[_Slice]) -> None:
        loop = asyncio.get_running_loop()
        texts = [text for piece in batch for text in piece.job.texts[piece.start : piece.end]]
        now = loop.time()
        for piece in batch:
            QUEUE_WAIT_SECONDS.observe(now - piece.enqueued)
        self._in_flight = batch
        started = time.perf_counter()
        # Not cleared on cancellation: stop() fails the callers of the run it interrupted.
        try:
            vectors, flags = await loop.run_in_executor(self._executor, self._embed_fn, texts, kind)
        except Exception as exc:
            self._in_flight = []
            MODEL_ERRORS.inc()
            log.exception("model run failed", extra={"texts": len(texts), "kind": kind.value})
            for piece in batch:
                piece.job.fail(exc)
            return
        self._in_flight = []
        self.model_runs += 1
        MODEL_RUN_SECONDS.observe(time.perf_counter() - started)
        BATCH_SIZE.observe(len(texts))
        TEXTS_EMBEDDED.inc(len(texts))
        TEXTS_TRUNCATED.inc(int(flags.sum()))
        offset = 0
        for piece in batch:
            piece.job.deliver(
                piece.start, vectors[offset : offset + piece.size], flags[offset : offset + piece.size]
            )
            offset += piece.size


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("embedder batch loop died", exc_info=task.exception())
