"""Prometheus metrics of the index service's own work (the RPC totals come from meshkit)."""

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
