"""Prometheus metrics of the index service's own work (the RPC totals come from meshkit): vectors,
searches, the WAL, checkpoints and uploads, segments, seals and compactions."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

VECTORS = Gauge("ragmesh_index_vectors", "Vectors stored on this shard.", ["collection"])
PENDING_WAL = Gauge(
    "ragmesh_index_pending_wal_records", "WAL records not yet covered by a snapshot.", ["collection"]
)
SEARCH_LATENCY = Histogram(
    "ragmesh_index_search_seconds",
    "Time spent inside the index for one search.",
    ["index_type", "filtered"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
WAL_APPENDS = Counter("ragmesh_index_wal_appends_total", "Records appended to a WAL.", ["op"])
WAL_APPEND_LATENCY = Histogram(
    "ragmesh_index_wal_append_seconds",
    "Append + fsync of one WAL record.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
WAL_TORN_TAILS = Counter("ragmesh_index_wal_torn_tails_total", "Torn WAL tails truncated at startup.")
SNAPSHOTS = Counter("ragmesh_index_snapshots_total", "Local snapshots by result.", ["result"])
SNAPSHOT_SECONDS = Histogram(
    "ragmesh_index_snapshot_seconds",
    "Time to write one local snapshot.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
UPLOADS = Counter("ragmesh_index_snapshot_uploads_total", "Snapshot uploads by result.", ["result"])
REBUILDS = Counter("ragmesh_index_rebuilds_total", "Index rebuilds by target index type.", ["index_type"])
SEGMENTS = Gauge(
    "ragmesh_index_segments",
    "Segments of a collection by state (growing, frozen, sealed).",
    ["collection", "state"],
)
SEALED_ROWS = Gauge(
    "ragmesh_index_sealed_rows", "Rows in sealed segments (deleted ones included).", ["collection"]
)
DELETED_SHARE = Gauge(
    "ragmesh_index_deleted_share",
    "Share of stored rows that are deleted (until compaction drops them).",
    ["collection"],
)
SEALS = Counter("ragmesh_index_seals_total", "Growing segments sealed with their own index.", ["index_type"])
COMPACTIONS = Counter(
    "ragmesh_index_compactions_total", "Compactions of sealed segments by result.", ["result"]
)
INDEX_BUILD_SECONDS = Histogram(
    "ragmesh_index_segment_build_seconds",
    "Time to write a sealed segment's files and build its index, by job (seal, compaction).",
    ["job"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
CHECKPOINT_BYTES = Counter(
    "ragmesh_index_checkpoint_bytes_total",
    "Bytes written by checkpoints (what changed, not the whole shard).",
)
CHECKPOINT_SIZE = Histogram(
    "ragmesh_index_checkpoint_size_bytes",
    "Bytes one checkpoint wrote.",
    buckets=(1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9),
)
