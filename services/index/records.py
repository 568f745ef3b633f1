"""The values a collection index takes and gives back: its policy (dimension, index type by
segment size, segment and compaction sizes, ANN parameters), search hits, stored chunks,
statistics and checkpoint outcomes, the on-disk identity file, and how a chunk id maps to its
60-bit FAISS id."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from meshkit.core.fsutil import fsync_dir, write_atomic
from services.index import mutations as mut
from services.index.backends import BackendConfig

IndexType = Literal["auto", "flat", "ivf", "hnsw"]
IDENTITY_FILE = "collection.json"
# Hex chars of a chunk id that make its FAISS id: 60 bits, so it is always a positive int64.
_FAISS_ID_HEX = 15
# Explicit 'ivf' keeps segments smaller than this exact: k-means on a handful of rows is noise.
MIN_IVF_ROWS = 1000


def faiss_id(chunk_id: str) -> int:
    return int(chunk_id[:_FAISS_ID_HEX], 16)


class CollectionMismatch(RuntimeError):
    """Data on disk belongs to another layout (dimension, shard count, collection)."""


def check_identity(directory: Path, identity: dict[str, object]) -> None:
    """Record the layout (collection, dimension, shard, shard count) a collection directory
    holds when it is new; refuse a directory that holds another one."""
    path = directory / IDENTITY_FILE
    if path.exists():
        stored = json.loads(path.read_text())
        if stored != identity and "placement" in identity and "placement" not in stored:
            raise CollectionMismatch(
                f"{directory} was written by a {stored.get('shard_count')}-shard layout that placed "
                "each chunk by its id; this one keeps a document on one shard (placement "
                f"{identity['placement']!r}): re-fill this shard's collection into a fresh data dir"
            )
        if stored != identity:
            raise CollectionMismatch(
                f"{directory} holds {stored}, this process is configured for {identity}: "
                "refusing to mix layouts (reshard or re-index into a fresh data dir)"
            )
        return
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(identity).encode())
    fsync_dir(directory.parent)


@dataclass(frozen=True)
class IndexPolicy:
    """How a collection lays out and searches its segments (meshkit.settings.IndexSettings
    documents each field as ``index_<field>``)."""

    dimension: int
    index_type: IndexType = "auto"
    ann_threshold: int = 50_000
    segment_rows: int = 50_000
    segment_max_rows: int = 400_000
    compact_deleted_ratio: float = 0.2
    compact_max_segments: int = 16
    recall_target: float = 0.95
    ivf_nprobe: int = 16
    hnsw_m: int = 32
    hnsw_ef_search: int = 128
    search_threads: int = 1

    def backend_config(self) -> BackendConfig:
        return BackendConfig(self.dimension, self.ivf_nprobe, self.hnsw_m, self.hnsw_ef_search)

    def kind_for(self, rows: int) -> str:
        """The index a sealed segment of ``rows`` rows gets: auto picks HNSW below
        ``ann_threshold`` (nothing to train, good recall on few rows) and IVF-Flat above (trains
        well there, 8 bytes per row beyond the vector); explicit 'ivf' stays exact on tiny
        segments, where k-means is noise."""
        if self.index_type == "auto":
            return "hnsw" if rows < self.ann_threshold else "ivf"
        if self.index_type == "ivf" and rows < MIN_IVF_ROWS:
            return "flat"
        return self.index_type


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    doc_id: str
    score: float


@dataclass(frozen=True)
class StoredChunk:
    chunk_id: str
    doc_id: str
    payload: mut.Payload
    source: mut.Source


@dataclass(frozen=True)
class CollectionStats:
    chunks: int
    documents: int
    index_type: str
    dimension: int
    sequence: int
    snapshot_sequence: int
    log_position: int = 0
    # Segments (growing included), rows of the sealed ones, and rows deleted but still stored.
    segments: int = 1
    sealed_rows: int = 0
    deleted_rows: int = 0

    @property
    def pending_wal_records(self) -> int:
        return self.sequence - self.snapshot_sequence


@dataclass(frozen=True)
class SnapshotOutcome:
    sequence: int
    directory: Path | None
    written: bool
