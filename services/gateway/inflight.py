"""The calls in flight of one search's retrieval: each an asyncio task standing for a ``Job``,
timed by stage, settled as it finishes (so vectors go on to the shards while other calls still
run), and, when the deadline passes first, cancelled and reported as late. What a settled call
means for the search is the fan-out's business (fanout.py hands ``settle`` in); this module
knows only tasks, jobs and the clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.gateway.degradations import DEADLINE, Degradations
from services.gateway.metrics import ms


@dataclass(frozen=True)
class Job:
    """What one in-flight call stands for, to report it if it fails or runs out of time."""

    kind: str  # embed, shard, bm25, exact
    stage: str
    target: str
    legs: tuple[str, ...]
    # Embed and shard calls: the index of their first dense text, and how many they carry.
    first: int = 0
    count: int = 0


# What to do with a call once it is done (answered, failed or cancelled).
Settle = Callable[[Job, asyncio.Task[Any]], None]


class Calls:
    """The calls in flight, each with its Job; ``settle`` is called once per finished call."""

    def __init__(self, degradations: Degradations, settle: Settle) -> None:
        self.degradations = degradations
        self.settle = settle
        self.jobs: dict[asyncio.Task[Any], Job] = {}
        self.settled: set[asyncio.Task[Any]] = set()
        # Stage -> milliseconds; kept when the calls are dropped (the early calls' time was spent).
        self.timings: dict[str, float] = {}

    def spawn(self, job: Job, timing: str, started: float, work: Callable[[], Awaitable[Any]]) -> None:
        # ``work`` makes the call's coroutine inside the task: a task cancelled before it starts
        # (early calls redone) then leaves no coroutine that was never awaited.
        async def timed() -> Any:
            try:
                return await work()
            finally:
                # A stage's time runs from its start to its last call's end (shards run together).
                self.timings[timing] = max(self.timings.get(timing, 0.0), ms(time.perf_counter() - started))

        self.jobs[asyncio.create_task(timed())] = job

    def cancel(self) -> None:
        """Drop every call in flight (the search starts over, or is abandoned)."""
        for task in self.jobs:
            task.cancel()
        self.jobs.clear()
        self.settled.clear()

    def _pending(self) -> set[asyncio.Task[Any]]:
        return {t for t in self.jobs if t not in self.settled}

    def settle_done(self) -> None:
        # Listed before settling: settling one may start others (an embedding starts the shard
        # calls), which join the next wait.
        for task in [t for t in self.jobs if t.done() and t not in self.settled]:
            self.settled.add(task)
            self.settle(self.jobs[task], task)

    async def run_until(self, other: asyncio.Task[Any]) -> None:
        """Settle calls as they finish, so early vectors go on to the shards, until ``other``
        (the plan) is done."""
        while not other.done():
            await asyncio.wait({other, *self._pending()}, return_when=asyncio.FIRST_COMPLETED)
            self.settle_done()

    async def collect(self, deadline: float) -> None:
        """Settle every call until ``deadline``; those still out are cancelled and each
        reported as a ``deadline`` degradation of its stage."""
        self.settle_done()
        pending = self._pending()
        try:
            while pending:
                done, pending = await asyncio.wait(
                    pending,
                    timeout=max(0.0, deadline - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    break
                self.settle_done()
                pending = self._pending()
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for task in pending:
            job = self.jobs[task]
            self.degradations.add(
                job.stage, DEADLINE, job.target, f"{job.target}: no answer within the deadline", job.legs
            )
