"""Prometheus metrics of the sparse service's own work (RPC counts come from meshkit)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

SEARCH_SECONDS = Histogram(
    "ragmesh_sparse_search_seconds",
    "Time spent in one search, by kind (bm25, exact_ripgrep, exact_phrase).",
    ["kind"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
SEARCH_HITS = Histogram(
    "ragmesh_sparse_search_hits",
    "Hits returned by one search, by kind.",
    ["kind"],
    buckets=(0, 1, 5, 10, 25, 50, 100, 250, 1000),
)
COMMIT_SECONDS = Histogram(
    "ragmesh_sparse_write_seconds",
    "Time of one write RPC (lookups, chunk files, tantivy commit, reload), by operation.",
    ["op"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CHUNKS_WRITTEN = Counter("ragmesh_sparse_chunks_total", "Chunks upserted or removed, by operation.", ["op"])
MISSING_KEEPS = Counter(
    "ragmesh_sparse_missing_keep_chunks_total", "keep_chunk_ids that were not in the index."
)
RIPGREP_TIMEOUTS = Counter("ragmesh_sparse_ripgrep_timeouts_total", "Exact searches that ran out of time.")
SNAPSHOT_UPLOADS = Counter(
    "ragmesh_sparse_snapshot_uploads_total",
    "Collection snapshots uploaded to the object store, by result.",
    ["result"],
)
