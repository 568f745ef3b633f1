"""The sparse store (services/sparse): BM25 and exact match."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from meshkit.settings.store import StoreSettings


class SparseSettings(StoreSettings):
    sparse_data_dir: Path | None = Field(
        None, description="Default: <state_dir>/sparse (one shard) or <state_dir>/sparse-<shard>."
    )
    sparse_shard: int = Field(0, ge=0, description="This replica's shard number.")
    sparse_shard_count: int = Field(
        1,
        ge=1,
        description="Number of sparse shards; a document's chunks all live on shard "
        "meshkit.domain.ids.document_shard(doc_id, count).",
    )
    sparse_exact_mode: Literal["ripgrep", "phrase"] = Field(
        "phrase",
        description="Exact leg: tantivy phrase queries (default: ~1 ms, scales with the index) or ripgrep "
        "over stored chunk text (substring matches, ~60 ms per query on 5k chunks; see docs/BENCHMARKS.md).",
    )
    sparse_max_top_k: int = Field(1000, description="Largest top_k accepted.")
    sparse_max_keywords: int = Field(32, description="Most keywords in one exact search.")
    sparse_max_query_chars: int = Field(
        16_000, description="Longest BM25 query, in characters (>= the gateway's query limit)."
    )
    sparse_max_query_terms: int = Field(
        64,
        ge=1,
        description="Most distinct terms a BM25 query searches: a longer one keeps its rarest (fewest chunks "
        "hold them; longest, then first, on a tie), which carry most of the BM25 score.",
    )
    sparse_writer_heap_bytes: int = Field(64 * 1024 * 1024, description="tantivy writer memory.")
    sparse_title_boost: float = Field(
        0.3,
        description="BM25 weight of the title field. Chunk text already starts with the title, so a small "
        "weight avoids counting it twice (SciFact train nDCG@10: 1.5 gave 0.627, 0.3 gave 0.696).",
    )
    sparse_exact_timeout_s: float = Field(
        10.0, description="Longest ripgrep run of one exact search (the caller's deadline cuts it further)."
    )
    sparse_exact_max_candidates: int = Field(
        2000,
        ge=1,
        description="Most matching chunks one exact search reads and counts (at least top_k are): bounds "
        "the work of a keyword that matches everything, e.g. a stopword. Chunks with more distinct keywords "
        "always rank first; past the bound, the occurrence tiebreak among chunks tied at the cut (phrase "
        "mode) or the whole ranking (ripgrep mode, which stops after this many files in path order) covers "
        "the chunks read only.",
    )
    sparse_exact_tiebreak_chunks: int = Field(
        100,
        ge=1,
        description="Phrase mode: most chunks tied with the top_k-th on distinct keywords whose occurrences "
        "are counted to order them (the first in index order; at least enough to fill top_k). A common "
        "keyword ('dna') ties hundreds of chunks, and reading and counting each is the leg's whole cost; "
        "on SciFact 100 ranks as well as 2000 (docs/BENCHMARKS.md).",
    )
    sparse_max_batch_chunks: int = Field(10_000, description="Most chunks or ids in one write or fetch.")
    sparse_max_chunk_chars: int = Field(1_000_000, description="Longest chunk title + text accepted.")
    sparse_max_doc_filter: int = Field(10_000, description="Most doc_ids in one search filter.")
    sparse_log_stream: str = Field(
        "RAGMESH_LOG_SPARSE",
        description="JetStream stream of the sparse shards' logs (subject ragmesh.log.sparse.<shard>).",
    )
    sparse_snapshot_interval_s: float = Field(
        60.0,
        gt=0,
        description="Seconds between snapshots of a changed collection to the object store (what a replica "
        "with an empty disk restores before replaying the log).",
    )
    sparse_upload_snapshots: bool = Field(True, description="Keep snapshots in the object store.")
