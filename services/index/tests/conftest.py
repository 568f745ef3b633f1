from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshkit.domain.ids import chunk_id_for
from services.index.mutations import ChunkBatch, Replacement
from services.index.records import IndexPolicy
from services.index.store import CollectionIndex

COLLECTION = "docs"
DIM = 16


def unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def random_vectors(n: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    return unit(np.random.default_rng(seed).standard_normal((n, dim)))


def clustered_vectors(n: int, clusters: int = 40, seed: int = 0, dim: int = DIM) -> np.ndarray:
    """Realistic-ish data: points around centres, where IVF is meant to shine."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim))
    return unit(centres[rng.integers(0, clusters, n)] + 0.35 * rng.standard_normal((n, dim)))


def cid(doc_id: str, i: int) -> str:
    """A content-addressed chunk id."""
    return chunk_id_for(COLLECTION, doc_id, f"text {i} 0")


def batch(doc_ids: list[str], chunk_ids: list[str], vectors: np.ndarray) -> ChunkBatch:
    return ChunkBatch(list(chunk_ids), list(doc_ids), np.ascontiguousarray(vectors, dtype=np.float32))


def doc_batch(doc_id: str, chunk_ids: list[str], vectors: np.ndarray) -> ChunkBatch:
    return batch([doc_id] * len(chunk_ids), chunk_ids, vectors)


def replacement(
    doc_id: str, chunk_ids: list[str], vectors: np.ndarray, keep: tuple[str, ...] = ()
) -> Replacement:
    return Replacement(doc_id, doc_batch(doc_id, chunk_ids, vectors), list(keep))


def policy(**overrides: object) -> IndexPolicy:
    return IndexPolicy(dimension=DIM, **overrides)  # type: ignore[arg-type]


def open_index(root: Path, **overrides: object) -> CollectionIndex:
    return CollectionIndex.open(COLLECTION, root / COLLECTION, policy(**overrides))


def brute_force(vectors: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    scores = vectors @ query
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


@pytest.fixture
def index(tmp_path: Path) -> CollectionIndex:
    return open_index(tmp_path, index_type="flat")
