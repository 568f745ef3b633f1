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
        "auto",
        description="ANN index of each sealed segment (the growing segment is always searched exactly). "
        "auto: HNSW below index_ann_threshold rows, IVF-Flat at and above; flat: exact everywhere; ivf: "
        "IVF-Flat (exact below 1,000 rows); hnsw: HNSW.",
    )
    index_ann_threshold: int = Field(
        50_000,
        ge=1,
        description="auto: sealed segments with fewer rows get HNSW (no training; good on few rows), larger "
        "ones IVF-Flat (trains well there and adds 8 bytes per row beyond the vector, HNSW about 300).",
    )
    index_segment_rows: int = Field(
        50_000,
        ge=1,
        description="Rows beyond which the growing segment (recent writes, searched exactly) is sealed: "
        "it becomes immutable, gets its own ANN index built in the background, and a new one starts. "
        "Exact search over it costs about 6 ms at 50,000 rows of 384 dimensions.",
    )
    index_segment_max_rows: int = Field(
        400_000, ge=1, description="Largest segment a compaction builds (bounds the time of one index build)."
    )
    index_compact_deleted_ratio: float = Field(
        0.2,
        gt=0,
        le=1,
        description="A sealed segment whose share of deleted rows reaches this is rewritten without them "
        "(merged with small segments); searches skip deleted rows until then.",
    )
    index_compact_max_segments: int = Field(
        16,
        ge=1,
        description="Past this many sealed segments, compaction merges the two smallest neighbours (one "
        "search scores every segment, so fewer, larger ones are cheaper).",
    )
    index_recall_target: float = Field(
        0.95,
        gt=0,
        le=1,
        description="recall@10 against exact search each ANN segment is tuned for when it is built: its "
        "search breadth (IVF nprobe, HNSW efSearch) is raised from the values below until a sample of its "
        "own rows, searched as queries, reaches the target (plus a margin).",
    )
    index_ivf_nprobe: int = Field(
        16, ge=1, description="Least IVF lists probed per search (see recall target)."
    )
    index_hnsw_m: int = Field(32, ge=4, description="HNSW graph degree.")
    index_hnsw_ef_search: int = Field(
        128, ge=1, description="Least HNSW search breadth (see index_recall_target)."
    )
    index_search_threads: int = Field(
        1, ge=1, description="OpenMP threads FAISS uses for one search (more only spin between searches)."
    )
    index_snapshot_every: int = Field(
        2000,
        description="WAL records that trigger a checkpoint (it writes only what changed since the last).",
    )
    index_snapshot_interval_s: float = Field(30.0, description="Max seconds between checkpoints when dirty.")
    index_upload_snapshots: bool = Field(
        True, description="Also keep checkpoints in the object store (each file uploaded once)."
    )
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
