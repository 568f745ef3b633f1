"""What other code may use of the sparse service (it imports this module only, never the
servicer or its internals): a tantivy collection built like the service's (its analyzers, its
title boost and writer heap from the sparse settings), in a directory of the caller's, and the
records it takes and gives back. For tools that need BM25 over a corpus without the service (the
reranker build's hard-negative mining)."""

from __future__ import annotations

from pathlib import Path

from meshkit.settings import SparseSettings
from services.sparse.collection import Collection
from services.sparse.records import ChunkRecord, DocumentUpdate, Hit

__all__ = ["ChunkRecord", "Collection", "DocumentUpdate", "Hit", "open_collection"]


def open_collection(root: Path, name: str, settings: SparseSettings | None = None) -> Collection:
    """The collection ``name`` under ``root`` (created when missing), with the writer heap and
    title boost of ``settings`` (default: the RAGMESH_SPARSE_* environment, as the service reads
    it). Close it when done."""
    sparse = settings if settings is not None else SparseSettings()
    return Collection.open(root, name, sparse.sparse_writer_heap_bytes, sparse.sparse_title_boost)
