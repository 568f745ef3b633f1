"""One collection of 200,000 chunks (384 dimensions, ~1,000 characters of text, documents of 10
chunks with a source), filled with the index's default settings through its write path: recall
against exact search, memory per chunk, what a checkpoint after 1,000 changed chunks writes, and
a restart. Vectors: a mixture of Gaussian clusters on the sphere (bench.index_segments_bench,
which measures the same at any size)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bench.index_segments_bench import (
    BATCH_CHUNKS,
    BLOCK_CHUNKS,
    Clusters,
    chunk_id,
    documents,
    exact_top_k,
    rss,
    text_pool,
    warm_up,
)
from meshkit.settings import IndexSettings
from services.index.backends import release_memory
from services.index.records import IndexPolicy
from services.index.segments import SEALED
from services.index.shard import policy_of
from services.index.store import CollectionIndex

N = 200_000
DIM = 384
VECTOR_BYTES = 4 * DIM
# The target is 2 KB per chunk beyond the vector at 500,000 chunks per shard; here the growing
# segment (its rows cost more than sealed ones) is a larger share of the rows.
MAX_BYTES_PER_CHUNK = 2048


@dataclass
class Filled:
    index: CollectionIndex
    directory: Path
    policy: IndexPolicy
    clusters: Clusters
    bytes_per_chunk: float
    fill_s: float


def _fill(index: CollectionIndex, clusters: Clusters, pool: str) -> None:
    batches = 0
    for b in range(N // BLOCK_CHUNKS):
        vectors = clusters.block(b)
        for first in range(0, BLOCK_CHUNKS, BATCH_CHUNKS):
            rows = vectors[first : first + BATCH_CHUNKS]
            index.replace_documents(documents(clusters, pool, b * BLOCK_CHUNKS + first, rows))
            batches += 1
            if batches % 50 == 0:
                index.snapshot()
            if index.maintenance_due():
                index.rebuild()  # the shard runs it in the background
    index.snapshot()
    index.rebuild()
    index.snapshot()


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Filled]:
    directory = tmp_path_factory.mktemp("scale") / "bench"
    policy = policy_of(IndexSettings(index_dimension=DIM))  # the defaults
    clusters = Clusters(dim=DIM, topics=400)
    pool = text_pool(clusters.seed)
    warm_up(policy, clusters)
    index = CollectionIndex.open("bench", directory, policy)
    gc.collect()
    release_memory()
    before = rss()["RssAnon"]
    started = time.perf_counter()
    _fill(index, clusters, pool)
    fill_s = time.perf_counter() - started
    gc.collect()
    release_memory()
    grown = rss()["RssAnon"] - before
    yield Filled(index, directory, policy, clusters, grown / N - VECTOR_BYTES, fill_s)
    index.close()


def test_recall_at_10_with_the_default_parameters(filled: Filled) -> None:
    index = filled.index
    sealed = [s for s in index._s.segments if s.state == SEALED]
    assert sum(s.rows for s in sealed) >= 150_000 and {s.backend_kind for s in sealed} == {"ivf"}
    queries = filled.clusters.queries(200)
    truth = exact_top_k(filled.clusters, N, queries)
    found = [[h.chunk_id for h in index.search(q, 10)] for q in queries]
    recall = np.mean([len(set(f) & {chunk_id(r) for r in t}) / 10 for f, t in zip(found, truth, strict=True)])
    print(f"recall@10 {recall:.4f} over {len(sealed)} IVF segments and the growing one")
    assert recall >= 0.95


def test_memory_per_chunk_beyond_the_vector(filled: Filled) -> None:
    per_chunk, seconds = filled.bytes_per_chunk, filled.fill_s
    print(f"{per_chunk:.0f} bytes of RSS per chunk beyond its vector; filled in {seconds:.0f} s")
    assert filled.bytes_per_chunk <= MAX_BYTES_PER_CHUNK


def test_a_checkpoint_after_1000_changed_chunks_writes_under_5_percent(filled: Filled) -> None:
    index = filled.index
    pool = text_pool(filled.clusters.seed)
    changed = filled.clusters.block(3, version=1)[:1000]  # 100 documents, new text and chunk ids
    index.replace_documents(documents(filled.clusters, pool, 3 * BLOCK_CHUNKS, changed, version=1))
    assert index.snapshot().written
    shard = sum(p.stat().st_size for p in filled.directory.rglob("*") if p.is_file())
    share = index.last_checkpoint_bytes / shard
    print(f"checkpoint {index.last_checkpoint_bytes:,} bytes of {shard:,} ({share:.2%})")
    assert share < 0.05


def test_restart_loads_the_segments(filled: Filled) -> None:
    index = filled.index
    queries = filled.clusters.queries(20)
    expected = [[h.chunk_id for h in index.search(q, 10)] for q in queries]
    stats = index.stats()
    index.close()
    started = time.perf_counter()
    reopened = CollectionIndex.open("bench", filled.directory, filled.policy)
    print(f"reopened in {time.perf_counter() - started:.2f} s")
    filled.index = reopened
    assert reopened.stats() == stats and reopened.rebuild_target() is None
    assert [[h.chunk_id for h in reopened.search(q, 10)] for q in queries] == expected
