"""The load driver of ``bench.peer_bench``: clients that search as fast as they can, threads for
the in-process peers and asyncio tasks for the gateway, over every query once or for a fixed time."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench.peers import SyncSearch
from bench.search_bench import Answer, LoadRun

AsyncSearch = Callable[[str], Awaitable[list[str]]]


@dataclass
class Cursor:
    """Hands out query indexes to the clients of one run: every query once (``deadline`` None) or
    round and round until the deadline."""

    count: int
    deadline: float | None
    _taken: Iterator[int] = dataclasses.field(default_factory=itertools.count)

    def take(self) -> int | None:
        i = next(self._taken)  # atomic: threads never get the same index
        if self.deadline is None:
            return i if i < self.count else None
        return i % self.count if time.perf_counter() < self.deadline else None


def run_threads(
    search: SyncSearch, queries: Sequence[str], concurrency: int, seconds: float | None
) -> LoadRun:
    """``concurrency`` threads searching; answers are kept for a pass of every query once."""
    latencies: list[float] = []
    answers: dict[int, Answer] = {}
    started = time.perf_counter()
    cursor = Cursor(len(queries), None if seconds is None else started + seconds)

    def client() -> None:
        while (i := cursor.take()) is not None:
            begun = time.perf_counter()
            docs = search(queries[i])
            latencies.append(time.perf_counter() - begun)
            if seconds is None:
                answers[i] = Answer(tuple(docs), False)

    with ThreadPoolExecutor(concurrency, thread_name_prefix="client") as pool:
        clients = [pool.submit(client) for _ in range(concurrency)]
        for done in clients:
            done.result()  # a failed search fails the run instead of leaving fewer clients
    wall = time.perf_counter() - started
    return LoadRun(latencies, wall, [answers[i] for i in sorted(answers)])


async def run_tasks(
    search: AsyncSearch, queries: Sequence[str], concurrency: int, seconds: float | None
) -> LoadRun:
    """The asyncio twin of ``run_threads``, for the gateway's client."""
    latencies: list[float] = []
    answers: dict[int, Answer] = {}
    started = time.perf_counter()
    cursor = Cursor(len(queries), None if seconds is None else started + seconds)

    async def client() -> None:
        while (i := cursor.take()) is not None:
            begun = time.perf_counter()
            docs = await search(queries[i])
            latencies.append(time.perf_counter() - begun)
            if seconds is None:
                answers[i] = Answer(tuple(docs), False)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return LoadRun(latencies, wall, [answers[i] for i in sorted(answers)])
