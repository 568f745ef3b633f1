"""FAISS index backends behind one small interface, plus the float32 side store of vectors.

Every backend speaks in 63-bit FAISS ids (derived from chunk ids by the store). The side
store keeps the raw vectors because FAISS cannot hand them back from every index type, and a
rebuild (IVF retraining, switching type, compacting HNSW tombstones) needs them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import faiss as _faiss
import numpy as np

# faiss's bundled stubs miss the SWIG keyword constructors (SearchParameters(sel=...)) and the
# numpy-accepting wrappers, so calls go through an untyped alias.
faiss: Any = _faiss

# Below this many training vectors per list FAISS warns that k-means is under-trained.
_MIN_POINTS_PER_LIST = 39


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
    worker runs next (a rebuild wants every core)."""
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


class VectorTable:
    """Live vectors by FAISS id in one growable matrix, reusing freed rows."""

    def __init__(self, dimension: int) -> None:
        self.dimension = dimension
        self._data = np.zeros((0, dimension), dtype=np.float32)
        self._slot_of: dict[int, int] = {}
        self._free: list[int] = []
        self._id_of_slot = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, fid: int) -> bool:
        return fid in self._slot_of

    def _reserve(self, new_rows: int) -> None:
        """Make sure ``new_rows`` free rows exist, growing geometrically."""
        if new_rows <= len(self._free):
            return
        capacity = self._data.shape[0]
        new_capacity = max(len(self._slot_of) + new_rows, capacity * 2, 1024)
        data = np.zeros((new_capacity, self.dimension), dtype=np.float32)
        data[:capacity] = self._data
        owners = np.full(new_capacity, -1, dtype=np.int64)
        owners[:capacity] = self._id_of_slot
        self._free.extend(range(new_capacity - 1, capacity - 1, -1))
        self._data, self._id_of_slot = data, owners

    def put(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        id_list = ids.tolist()
        self._reserve(len(set(id_list) - self._slot_of.keys()))
        for fid, vector in zip(id_list, vectors, strict=True):
            slot = self._slot_of.get(fid)
            if slot is None:
                slot = self._free.pop()
                self._slot_of[fid] = slot
                self._id_of_slot[slot] = fid
            self._data[slot] = vector

    def remove(self, ids: np.ndarray) -> None:
        for fid in ids.tolist():
            slot = self._slot_of.pop(fid, None)
            if slot is not None:
                self._id_of_slot[slot] = -1
                self._free.append(slot)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        slots = [self._slot_of[fid] for fid in ids.tolist()]
        return self._data[slots]

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of (ids, vectors) of every live row."""
        mask = self._id_of_slot >= 0
        return self._id_of_slot[mask].copy(), self._data[: len(mask)][mask].copy()


@dataclass
class BackendState:
    """What a snapshot needs to bring a backend back without rebuilding it."""

    index_bytes: np.ndarray  # faiss.serialize_index output (same format as write_index)
    extra: dict[str, Any]
    positions: np.ndarray | None = None


class Backend(ABC):
    index: Any
    kind: str
    # True when a filtered search through FAISS is exact (every allowed vector is scored).
    exact: bool

    @abstractmethod
    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None: ...

    @abstractmethod
    def remove(self, ids: np.ndarray) -> None: ...

    @abstractmethod
    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Scores and FAISS ids of the best ``k`` (id -1 pads a short result)."""

    @abstractmethod
    def state(self) -> BackendState: ...

    def __len__(self) -> int:
        """Live vectors in the index."""
        return int(self.index.ntotal)

    def garbage_ratio(self) -> float:
        """Share of the index taken by deleted entries still in it."""
        return 0.0


class FlatBackend(Backend):
    kind = "flat"
    exact = True

    def __init__(self, config: BackendConfig, index: Any | None = None) -> None:
        self.index = index if index is not None else faiss.IndexIDMap2(faiss.IndexFlatIP(config.dimension))

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids):
            self.index.add_with_ids(vectors, _ids(ids))

    def remove(self, ids: np.ndarray) -> None:
        if len(ids):
            self.index.remove_ids(_ids(ids))

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if allowed is None:
            scores, found = self.index.search(query, k)
        else:
            selector = faiss.IDSelectorBatch(_ids(allowed))
            scores, found = self.index.search(query, k, params=faiss.SearchParameters(sel=selector))
        return scores[0], found[0]

    def state(self) -> BackendState:
        return BackendState(faiss.serialize_index(self.index), {})


class IVFBackend(Backend):
    kind = "ivf"
    exact = False

    def __init__(self, config: BackendConfig, index: Any, trained_on: int) -> None:
        self.index = index
        self.nprobe = config.ivf_nprobe
        self.trained_on = trained_on

    @classmethod
    def train(cls, config: BackendConfig, vectors: np.ndarray) -> IVFBackend:
        nlist = ivf_nlist(len(vectors))
        index = faiss.index_factory(config.dimension, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        return cls(config, index, len(vectors))

    @property
    def nlist(self) -> int:
        return int(faiss.extract_index_ivf(self.index).nlist)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids):
            self.index.add_with_ids(vectors, _ids(ids))

    def remove(self, ids: np.ndarray) -> None:
        if len(ids):
            self.index.remove_ids(_ids(ids))

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        selector = faiss.IDSelectorBatch(_ids(allowed)) if allowed is not None else None
        params = faiss.SearchParametersIVF(nprobe=min(self.nprobe, self.nlist), sel=selector)
        scores, found = self.index.search(query, k, params=params)
        return scores[0], found[0]

    def state(self) -> BackendState:
        return BackendState(faiss.serialize_index(self.index), {"trained_on": self.trained_on})


class HNSWBackend(Backend):
    """IndexHNSWFlat cannot remove: deleted entries become tombstones skipped at search time
    and dropped by a rebuild once they are a large share of the graph."""

    kind = "hnsw"
    exact = False

    def __init__(
        self, config: BackendConfig, index: Any | None = None, positions: np.ndarray | None = None
    ) -> None:
        if index is None:
            index = faiss.IndexHNSWFlat(config.dimension, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = max(40, 2 * config.hnsw_m)
        self.index = index
        self.ef_search = config.hnsw_ef_search
        # Graph position -> FAISS id, -1 for a tombstone.
        self._ids_at: list[int] = positions.tolist() if positions is not None else []
        self._pos_of = {fid: pos for pos, fid in enumerate(self._ids_at) if fid >= 0}
        self._tombstones = {pos for pos, fid in enumerate(self._ids_at) if fid < 0}
        self._tombstone_selector: Any = None

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if not len(ids):
            return
        self.remove(ids)  # an overwrite leaves the old position behind as a tombstone
        first = len(self._ids_at)
        self.index.add(vectors)
        for offset, fid in enumerate(ids.tolist()):
            self._ids_at.append(fid)
            self._pos_of[fid] = first + offset

    def remove(self, ids: np.ndarray) -> None:
        for fid in ids.tolist():
            pos = self._pos_of.pop(fid, None)
            if pos is not None:
                self._ids_at[pos] = -1
                self._tombstones.add(pos)
                self._tombstone_selector = None

    def _selector(self, allowed: np.ndarray | None) -> Any:
        if allowed is not None:
            positions = [self._pos_of[fid] for fid in allowed.tolist() if fid in self._pos_of]
            return faiss.IDSelectorBatch(_ids(positions))
        if not self._tombstones:
            return None
        if self._tombstone_selector is None:
            batch = faiss.IDSelectorBatch(_ids(sorted(self._tombstones)))
            selector = faiss.IDSelectorNot(batch)
            # IDSelectorNot does not own what it wraps: keep the batch alive alongside it.
            self._tombstone_selector = (selector, batch)
            return selector
        return self._tombstone_selector[0]

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        params = faiss.SearchParametersHNSW(efSearch=max(self.ef_search, k), sel=self._selector(allowed))
        scores, positions = self.index.search(query, k, params=params)
        ids = np.array([self._ids_at[p] if p >= 0 else -1 for p in positions[0].tolist()], dtype=np.int64)
        return scores[0], ids

    def __len__(self) -> int:
        return len(self._pos_of)

    def garbage_ratio(self) -> float:
        return len(self._tombstones) / len(self._ids_at) if self._ids_at else 0.0

    def state(self) -> BackendState:
        return BackendState(faiss.serialize_index(self.index), {}, np.array(self._ids_at, dtype=np.int64))


def build_backend(kind: str, config: BackendConfig, ids: np.ndarray, vectors: np.ndarray) -> Backend:
    """A fresh backend of ``kind`` holding exactly ``ids``/``vectors`` (IVF is trained on them)."""
    backend: Backend
    if kind == "ivf":
        backend = IVFBackend.train(config, vectors)
    elif kind == "hnsw":
        backend = HNSWBackend(config)
    else:
        backend = FlatBackend(config)
    backend.add(ids, vectors)
    return backend


def restore_backend(
    kind: str, config: BackendConfig, index: Any, extra: dict[str, Any], positions: np.ndarray | None
) -> Backend:
    if kind == "ivf":
        return IVFBackend(config, index, int(extra.get("trained_on", index.ntotal)))
    if kind == "hnsw":
        if positions is None or len(positions) != index.ntotal:
            raise ValueError("HNSW snapshot has no position map matching its graph")
        return HNSWBackend(config, index, positions)
    if kind == "flat":
        return FlatBackend(config, index)
    raise ValueError(f"unknown index type {kind!r} in snapshot")
