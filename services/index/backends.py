"""How one segment's rows are scored: exactly (flat: the growing segment's RAM array, a small
sealed segment's memory-mapped vectors.npy) or through a FAISS ANN index (IVF-Flat, HNSW: both
hold the raw vectors themselves, so a sealed segment keeps its vectors once in RAM).

Every backend speaks in the segment's row numbers (0..rows-1). Deleted rows are skipped with a
``LiveRows`` view of the segment's deleted bitmap: a mask for exact scoring, a FAISS
``IDSelectorBitmap`` for ANN search (built once per version of the bitmap).
"""

from __future__ import annotations

import ctypes
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import faiss as _faiss
import numpy as np

# faiss's bundled stubs miss the SWIG keyword constructors (SearchParameters(sel=...)) and the
# numpy-accepting wrappers, so calls go through an untyped alias.
faiss: Any = _faiss

# Below this many training vectors per list FAISS warns that k-means is under-trained.
_MIN_POINTS_PER_LIST = 39
# Widest HNSW search a segment may be tuned to (efSearch).
MAX_EF_SEARCH = 4096


@dataclass(frozen=True)
class BackendConfig:
    dimension: int
    ivf_nprobe: int = 16
    hnsw_m: int = 32
    hnsw_ef_search: int = 128


@contextmanager
def omp_threads(n: int) -> Iterator[None]:
    """FAISS runs with ``n`` OpenMP threads on the calling thread inside the block.

    A search scores one query, which a single thread does fastest; with more, FAISS's idle
    OpenMP threads busy-wait after every search, burning cores the other stages need. OpenMP
    keeps this setting per thread, so the previous value comes back for whatever the pool
    worker runs next (an index build wants every core)."""
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def ivf_nlist(n: int) -> int:
    """~4*sqrt(n) lists, but never so many that k-means has under ~39 points per list."""
    return max(1, min(int(4 * math.sqrt(n)), n // _MIN_POINTS_PER_LIST))


def _ids(values: Any) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


def inner_products(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``vectors @ query`` on the calling thread, through FAISS's SIMD kernel: numpy would hand
    it to a BLAS thread pool that spins on the cores the other stages share."""
    rows = np.ascontiguousarray(vectors, dtype=np.float32)
    q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
    out = np.empty(len(rows), dtype=np.float32)
    if len(rows):
        faiss.fvec_inner_products_ny(
            faiss.swig_ptr(out), faiss.swig_ptr(q), faiss.swig_ptr(rows), len(q), len(rows)
        )
    return out


def top_k(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of ``scores`` (best first) and their ids; -inf scores (rows masked out)
    never come back."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
    top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    order = top[np.argsort(-scores[top], kind="stable")]
    order = order[np.isfinite(scores[order])]
    return scores[order], np.asarray(ids, dtype=np.int64)[order]


class LiveRows:
    """Which rows of a segment are live, for the searches of one version of its bitmap."""

    def __init__(self, dead: np.ndarray, dead_count: int) -> None:
        self.dead = dead
        self.dead_count = dead_count
        self._selector: tuple[Any, np.ndarray] | None = None

    def selector(self) -> Any:
        """A FAISS selector of the live rows, or None when every row is live."""
        if not self.dead_count:
            return None
        if self._selector is None:
            bits = np.packbits(~self.dead, bitorder="little")
            # The selector points into ``bits``: keep both alive together.
            self._selector = (faiss.IDSelectorBitmap(bits), bits)
        return self._selector[0]


class Backend(ABC):
    kind: str
    # True when every row is scored (a filtered search through it is exact).
    exact: bool

    @abstractmethod
    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None, live: LiveRows | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Scores and rows of the best ``k`` among ``allowed`` rows (all when None) that
        ``live`` does not mark deleted; a short result is shorter (no -1 padding)."""

    @abstractmethod
    def __len__(self) -> int: ...

    def search_many(self, queries: np.ndarray, k: int) -> np.ndarray:
        """Rows of the best ``k`` for every query (-1 pads), with the current parameters."""
        raise NotImplementedError

    def widen(self) -> bool:
        """Search more broadly (more recall, more time); False when it cannot."""
        return False

    @property
    def params(self) -> dict[str, int]:
        """The search parameters a manifest records, to bring the backend back as tuned."""
        return {}

    def index_bytes(self) -> np.ndarray | None:
        """The serialized FAISS index (faiss.serialize_index), None when there is none."""
        return None

    def reload(self, index_bytes: np.ndarray) -> None:
        """Replace the index by its serialized copy: one built by adds keeps the spare capacity
        its lists grew by (about 15% of the vectors for IVF); a loaded one has none."""
        return None


def _selector(allowed: np.ndarray | None, live: LiveRows | None, rows: int) -> tuple[Any, Any]:
    """The FAISS selector of a search (None: every row) and what it points into (to keep alive
    while it runs): the allowed rows as a bitmap (a membership test per candidate), else the
    live rows."""
    if allowed is None:
        return (live.selector() if live is not None else None), None
    mask = np.zeros(max(rows, 1), dtype=bool)
    mask[_ids(allowed)] = True
    bits = np.packbits(mask, bitorder="little")
    return faiss.IDSelectorBitmap(bits), bits


def _found(scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = rows >= 0
    return scores[keep], rows[keep].astype(np.int64)


class FlatBackend(Backend):
    """Exact inner-product scoring over the rows of an array (no FAISS index: the array is the
    growing segment's RAM buffer or a sealed segment's memory-mapped vectors.npy)."""

    kind = "flat"
    exact = True

    def __init__(self, config: BackendConfig, vectors: np.ndarray | None = None) -> None:
        self.vectors = vectors if vectors is not None else np.zeros((0, config.dimension), np.float32)

    def __len__(self) -> int:
        return len(self.vectors)

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None, live: LiveRows | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if allowed is not None:
            rows = _ids(allowed)
            return top_k(inner_products(self.vectors[rows], query), rows, k)
        scores = inner_products(self.vectors, query)
        if live is not None and live.dead_count:
            scores[live.dead[: len(scores)]] = -np.inf
        return top_k(scores, np.arange(len(scores)), k)


class FaissBackend(Backend):
    """A backend around one FAISS index (``self.index``), which it serializes and reloads."""

    index: Any

    def index_bytes(self) -> np.ndarray:
        return np.asarray(faiss.serialize_index(self.index))

    def reload(self, index_bytes: np.ndarray) -> None:
        self.index = faiss.deserialize_index(index_bytes)


class IVFBackend(FaissBackend):
    kind = "ivf"
    exact = False

    def __init__(self, config: BackendConfig, index: Any, nprobe: int | None = None) -> None:
        self.index = index
        self.nprobe = min(nprobe or config.ivf_nprobe, self.nlist)

    @classmethod
    def train(cls, config: BackendConfig, vectors: np.ndarray) -> IVFBackend:
        # k-means samples its training points with a fixed seed: replicas sealing the same rows
        # build the same index.
        index = faiss.index_factory(
            config.dimension, f"IVF{ivf_nlist(len(vectors))},Flat", faiss.METRIC_INNER_PRODUCT
        )
        index.train(vectors)
        return cls(config, index)

    @property
    def nlist(self) -> int:
        return int(faiss.extract_index_ivf(self.index).nlist)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None, live: LiveRows | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        selector, _bits = _selector(allowed, live, len(self))
        params = faiss.SearchParametersIVF(nprobe=self.nprobe, sel=selector)
        scores, rows = self.index.search(query.reshape(1, -1), k, params=params)
        return _found(scores[0], rows[0])

    def search_many(self, queries: np.ndarray, k: int) -> np.ndarray:
        params = faiss.SearchParametersIVF(nprobe=self.nprobe)
        return np.asarray(self.index.search(queries, k, params=params)[1])

    def widen(self) -> bool:
        if self.nprobe >= self.nlist:
            return False
        self.nprobe = min(self.nlist, self.nprobe * 2)
        return True

    @property
    def params(self) -> dict[str, int]:
        return {"nprobe": self.nprobe}


class HNSWBackend(FaissBackend):
    kind = "hnsw"
    exact = False

    def __init__(self, config: BackendConfig, index: Any | None = None, ef_search: int | None = None) -> None:
        if index is None:
            index = faiss.IndexHNSWFlat(config.dimension, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = max(40, 2 * config.hnsw_m)
        self.index = index
        self.ef_search = ef_search or config.hnsw_ef_search

    def add(self, vectors: np.ndarray) -> None:
        # One thread: insertion order decides the graph, and OpenMP would make it vary between
        # replicas sealing the same rows.
        with omp_threads(1):
            self.index.add(vectors)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None, live: LiveRows | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        selector, _bits = _selector(allowed, live, len(self))
        params = faiss.SearchParametersHNSW(efSearch=max(self.ef_search, k), sel=selector)
        scores, rows = self.index.search(query.reshape(1, -1), k, params=params)
        return _found(scores[0], rows[0])

    def search_many(self, queries: np.ndarray, k: int) -> np.ndarray:
        params = faiss.SearchParametersHNSW(efSearch=max(self.ef_search, k))
        return np.asarray(self.index.search(queries, k, params=params)[1])

    def widen(self) -> bool:
        if self.ef_search >= MAX_EF_SEARCH:
            return False
        self.ef_search = min(MAX_EF_SEARCH, self.ef_search * 2)
        return True

    @property
    def params(self) -> dict[str, int]:
        return {"ef_search": self.ef_search}


def release_memory() -> None:
    """Give the allocator's free memory back to the system (glibc keeps what many small frees,
    such as a sealed segment's payloads, leave scattered in its heap); a no-op elsewhere."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def build_backend(kind: str, config: BackendConfig, ids: np.ndarray, vectors: np.ndarray) -> Backend:
    """A backend of ``kind`` over the rows ``vectors`` (``ids`` must be 0..n-1: a backend speaks
    in its segment's row numbers). IVF is trained on them; a flat backend scores the array
    itself (no copy)."""
    if len(ids) != len(vectors) or (len(ids) and (ids[0] != 0 or ids[-1] != len(ids) - 1)):
        raise ValueError("a backend's ids are its rows 0..n-1")
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if kind == "ivf":
        ivf = IVFBackend.train(config, vectors)
        ivf.index.add(vectors)
        return ivf
    if kind == "hnsw":
        hnsw = HNSWBackend(config)
        hnsw.add(vectors)
        return hnsw
    if kind == "flat":
        return FlatBackend(config, vectors)
    raise ValueError(f"unknown index type {kind!r}")


def restore_backend(
    kind: str, config: BackendConfig, index: Any, params: dict[str, Any], vectors: np.ndarray
) -> Backend:
    """A sealed segment's backend from its FAISS index file (``index``; None for flat) and the
    parameters it was tuned to."""
    if kind == "flat":
        return FlatBackend(config, vectors)
    if index is None or int(index.ntotal) != len(vectors):
        raise ValueError(
            f"{kind} index holds {None if index is None else index.ntotal} rows, expected {len(vectors)}"
        )
    if kind == "ivf":
        return IVFBackend(config, index, int(params.get("nprobe", config.ivf_nprobe)))
    if kind == "hnsw":
        return HNSWBackend(config, index, int(params.get("ef_search", config.hnsw_ef_search)))
    raise ValueError(f"unknown index type {kind!r} in manifest")
