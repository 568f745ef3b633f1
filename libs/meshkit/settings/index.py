"""The vector index service (services/index)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from meshkit.settings.store import StoreSettings


class IndexSettings(StoreSettings):
    index_data_dir: Path | None = Field(None, description="Default: <state_dir>/index-<shard>.")
    index_shard: int = Field(0, description="This replica's shard number.")
    index_shard_count: int = Field(1, description="Number of shards of the index.")
    index_dimension: int = Field(384, description="Vector dimension.")
    index_type: Literal["auto", "flat", "ivf", "hnsw"] = Field(
        "auto", description="auto: exact below index_ann_threshold vectors, IVF above."
    )
    index_ann_threshold: int = Field(50_000, description="Vectors above which auto switches to IVF.")
    index_ivf_nprobe: int = Field(16, description="IVF lists probed per search.")
    index_hnsw_m: int = Field(32, description="HNSW graph degree.")
    index_hnsw_ef_search: int = Field(128, description="HNSW search breadth.")
    index_search_threads: int = Field(
        1, ge=1, description="OpenMP threads FAISS uses for one search (more only spin between searches)."
    )
    index_snapshot_every: int = Field(2000, description="WAL records that trigger a snapshot.")
    index_snapshot_interval_s: float = Field(30.0, description="Max seconds between snapshots when dirty.")
    index_upload_snapshots: bool = Field(True, description="Also keep snapshots in the object store.")
    index_max_top_k: int = Field(1000, description="Largest top_k accepted.")
    index_max_batch_chunks: int = Field(10_000, description="Largest number of chunks in one write.")
    index_max_chunk_chars: int = Field(
        1_000_000,
        description="Longest chunk payload (text + heading path) an index write may store with a vector "
        "(the same bound as sparse_max_chunk_chars: both stores hold the same text).",
    )
    index_log_stream: str = Field(
        "RAGMESH_LOG_INDEX",
        description="JetStream stream of the index shards' logs (subject ragmesh.log.index.<shard>).",
    )
