"""The exact leg is bounded in work and in time, on a real sparse server.

A keyword that matches everything (a stopword) must not make one search read and count every
chunk of the collection (sparse_exact_max_candidates bounds it), and a search must stop at its
caller's deadline: the work runs in a thread, which cannot be cancelled, so it checks the
deadline itself. Occurrence counting is linear in the chunk's tokens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from hypothesis import given, settings
from hypothesis import strategies as st

from meshkit.domain.ids import chunk_id_for
from meshkit.rpc.server import start_service
from meshkit.settings import SparseSettings
from ragmesh.sparse.v1 import sparse_pb2 as pb
from ragmesh.sparse.v1 import sparse_pb2_grpc
from services.sparse import collection as collection_module
from services.sparse import exact
from services.sparse.exact import Keyword, count_phrases
from services.sparse.records import ChunkRecord
from services.sparse.servicer import build_spec

COLLECTION = "bounds"
CHUNKS = 3000
RARE = 5  # chunks that hold the rare keyword too, written last
BOUND = 100


def body(i: int) -> str:
    rare = " with the zyxwvut marker" if i >= CHUNKS - RARE else ""
    return f"Chunk {i} says the same thing as the others{rare}, the end."


async def serve(root: Path, mode: str, **overrides: Any) -> AsyncIterator[sparse_pb2_grpc.SparseServiceStub]:
    # The in-process log: one replica, no NATS (the exact leg is what is under test).
    settings_ = SparseSettings(
        port=0,
        log_format="text",
        sparse_data_dir=root,
        sparse_exact_mode=mode,
        store_log="local",
        sparse_upload_snapshots=False,
        **overrides,
    )
    running = await start_service(build_spec(settings_), settings_)
    async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield sparse_pb2_grpc.SparseServiceStub(channel)
    await running.stop(1.0)


@pytest.fixture(scope="module")
async def seeded_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collection of CHUNKS one-chunk documents, all holding the stopword "the"."""
    root = tmp_path_factory.mktemp("sparse-bounds")
    async for stub in serve(root, "phrase"):
        for first in range(0, CHUNKS, 1000):
            documents = [
                pb.DocumentReplacement(
                    doc_id=f"doc-{i}",
                    upserts=[
                        pb.ChunkText(
                            chunk_id=chunk_id_for(COLLECTION, f"doc-{i}", body(i)),
                            doc_id=f"doc-{i}",
                            title=f"Doc {i}",
                            text=body(i),
                        )
                    ],
                )
                for i in range(first, min(CHUNKS, first + 1000))
            ]
            request = pb.ReplaceDocumentsRequest(collection=COLLECTION, documents=documents)
            await stub.ReplaceDocuments(request)
    return root


def counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, delay_s: float = 0.0) -> list[float]:
    """Wrap ``module.name`` so each call is recorded (its time.monotonic) and optionally slowed."""
    calls: list[float] = []
    real: Callable[..., Any] = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        if delay_s:
            time.sleep(delay_s)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def search(keywords: list[str], top_k: int = 10) -> pb.SearchExactRequest:
    return pb.SearchExactRequest(collection=COLLECTION, keywords=keywords, top_k=top_k)


async def test_a_stopword_reads_a_bounded_number_of_chunks(
    seeded_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = counting(monkeypatch, collection_module, "to_record")
    async for stub in serve(seeded_root, "phrase", sparse_exact_max_candidates=BOUND):
        reply = await stub.SearchExact(search(["the", "zyxwvut"]), timeout=30)
    assert len(loaded) <= BOUND
    # The chunks holding both keywords outrank the rest, although they were written last.
    rare = {chunk_id_for(COLLECTION, f"doc-{i}", body(i)) for i in range(CHUNKS - RARE, CHUNKS)}
    assert {h.chunk_id for h in reply.hits[:RARE]} == rare
    assert len(reply.hits) == 10
    assert all(h.matched_keywords == ["the"] for h in reply.hits[RARE:])


async def test_only_a_bounded_number_of_chunks_tied_at_the_cut_are_counted(
    seeded_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default candidate bound reads them all; the tiebreak bound counts the few chunks with
    # both keywords and then only TIED of the thousands holding the stopword alone.
    tied = 20
    loaded = counting(monkeypatch, collection_module, "to_record")
    async for stub in serve(seeded_root, "phrase", sparse_exact_tiebreak_chunks=tied):
        reply = await stub.SearchExact(search(["the", "zyxwvut"]), timeout=30)
        assert len(loaded) == RARE + tied
        loaded.clear()
        wide = await stub.SearchExact(search(["the"], top_k=50), timeout=30)
    # Never fewer than fill the page.
    assert len(loaded) == 50 and len(wide.hits) == 50
    rare = {chunk_id_for(COLLECTION, f"doc-{i}", body(i)) for i in range(CHUNKS - RARE, CHUNKS)}
    assert {h.chunk_id for h in reply.hits[:RARE]} == rare
    assert len(reply.hits) == 10


async def test_ripgrep_mode_reads_a_bounded_number_of_chunks_and_cuts_the_same_way(
    seeded_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = counting(monkeypatch, exact, "count_in_lines")
    async for stub in serve(seeded_root, "ripgrep", sparse_exact_max_candidates=BOUND):
        first = await stub.SearchExact(search(["the"]), timeout=30)
        assert len(counted) <= BOUND
        again = await stub.SearchExact(search(["the"]), timeout=30)
    assert [h.chunk_id for h in first.hits] == [h.chunk_id for h in again.hits]
    assert len(first.hits) == 10


# What each mode does per chunk after finding the matches: slowed to ~1 ms a chunk here, so a
# stopword search over the collection takes seconds.
PER_CHUNK_WORK = {"phrase": "exact_tokens", "ripgrep": "count_in_lines"}


@pytest.mark.parametrize("mode", ["phrase", "ripgrep"])
async def test_the_exact_leg_stops_at_the_callers_deadline(
    seeded_root: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    worked = counting(monkeypatch, exact, PER_CHUNK_WORK[mode], delay_s=0.001)
    deadline_s = 0.5
    async for stub in serve(seeded_root, mode):
        started = time.monotonic()
        with pytest.raises(aio.AioRpcError) as caught:
            await stub.SearchExact(search(["the"], top_k=1000), timeout=deadline_s)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # Give a search that ignores the deadline time to show it: it would still be counting.
        await asyncio.sleep(1.5)
    deadline = started + deadline_s
    assert worked, "the search never started counting"
    assert max(worked) < deadline + 0.3, f"worked {max(worked) - deadline:.2f}s past the deadline"


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=40),
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=5),
)
def test_occurrences_count_every_overlapping_match(tokens: list[str], needle: list[str]) -> None:
    naive = sum(1 for i in range(len(tokens) - len(needle) + 1) if tokens[i : i + len(needle)] == needle)
    assert exact.occurrences(tokens, needle) == naive


def test_counting_a_long_phrase_in_the_longest_chunk_is_linear() -> None:
    # A window compare at every token costs tokens x needle: here 500k x 100 (the limits,
    # sparse_max_chunk_chars and 200-char keywords, kept that under a few seconds before).
    text = "a " * 500_000
    keyword = Keyword("k", "a " * 99 + "b")
    started = time.perf_counter()
    assert count_phrases(ChunkRecord("0" * 32, "d", "", text), [keyword]) == [0]
    assert time.perf_counter() - started < 2.0
