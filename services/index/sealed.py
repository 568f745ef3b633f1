"""A sealed segment: immutable rows in files written once (segment_files), searched through its
own FAISS index (or exactly when small or flat), with a deleted bitmap beside it.

In RAM it keeps the FAISS index (IVF-Flat and HNSW hold the raw vectors: the vectors' one copy
in RAM), the compact per-row arrays (chunk id 16 bytes, local document 4, bucket 2, payload
offset 8, sorted FAISS id and row order 12, document rows 4, deleted bit) and per document its
name in a packed blob and its global number. ``vectors.npy`` is memory-mapped: exact rescoring,
filtered search and compaction read it through the page cache; payloads are read by offset.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from services.index.backends import Backend, BackendConfig, FlatBackend, faiss, restore_backend
from services.index.segment_files import FileRef, StoredRows, read_rows, verify
from services.index.segments import SEALED, Segment, fids_of

INDEX_FILE = "index.faiss"


class SealedSegment(Segment):
    def __init__(
        self,
        sid: int,
        stored: StoredRows,
        nums: np.ndarray,
        backend: Backend,
        files: dict[str, FileRef],
        dead: np.ndarray | None = None,
    ) -> None:
        super().__init__(sid, stored.vectors.shape[1])
        self.state = SEALED
        self.files = files
        self.rows = len(stored)
        self._vectors = stored.vectors
        self._backend = backend
        self.backend_kind = backend.kind
        self.chunks = stored.chunks
        self.docno = stored.docno
        self.buckets = stored.buckets
        self._payload_offsets = stored.payload_offsets
        # Kept open: a compaction may unlink the file while a search still reads it.
        self._payload_fd = os.open(stored.payload_path, os.O_RDONLY)
        names = [n.encode("utf-8") for n in stored.names]
        self._names_blob = b"".join(names)
        self._names_offsets = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum([len(n) for n in names], out=self._names_offsets[1:])
        self._nums = np.asarray(nums, dtype=np.int64)
        self._num_order = np.argsort(self._nums, kind="stable").astype(np.int32)
        self._num_sorted = self._nums[self._num_order]
        # Rows of each local document (CSR), and rows by FAISS id.
        self._doc_rows = np.argsort(self.docno, kind="stable").astype(np.int32)
        self._doc_start = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.docno, minlength=len(names)), out=self._doc_start[1:])
        fids = fids_of(self.chunks)
        self._fid_order = np.argsort(fids, kind="stable").astype(np.int32)
        self._fid_sorted = fids[self._fid_order]
        self.dead = dead.copy() if dead is not None else np.zeros(self.rows, dtype=bool)
        self.dead_count = int(self.dead.sum())

    def __del__(self) -> None:
        fd = getattr(self, "_payload_fd", None)
        if fd is not None:
            os.close(fd)

    @classmethod
    def open(
        cls,
        root: Path,
        sid: int,
        entry: dict[str, Any],
        config: BackendConfig,
        number_of: Any,
        dead: np.ndarray | None,
    ) -> SealedSegment:
        """A sealed segment from the files its manifest ``entry`` names; ``number_of(name)``
        gives each document's global number. An index file that does not load is rebuilt
        later (the vectors are authoritative): the segment is searched exactly until then."""
        files = {name: FileRef.from_json(raw) for name, raw in entry["files"].items()}
        stored = read_rows(root, files, config.dimension, mmap=True)
        kind = str(entry["kind"])
        index = None
        if kind != "flat":
            index = faiss.read_index(str(verify(root, files[INDEX_FILE])))
        try:
            backend = restore_backend(kind, config, index, dict(entry.get("params", {})), stored.vectors)
        except ValueError:
            backend = FlatBackend(config, stored.vectors)
        nums = np.array([number_of(name) for name in stored.names], dtype=np.int64)
        return cls(sid, stored, nums, backend, files, dead)

    # ----- reading -----

    def doc_name(self, local: int) -> str:
        start, end = self._names_offsets[local], self._names_offsets[local + 1]
        return self._names_blob[start:end].decode("utf-8")

    def doc_names(self) -> list[str]:
        return [self.doc_name(i) for i in range(len(self._nums))]

    def payload_bytes(self, row: int) -> bytes:
        start, end = int(self._payload_offsets[row]), int(self._payload_offsets[row + 1])
        return os.pread(self._payload_fd, end - start, start) if end > start else b""

    def payload_range(self, start: int, end: int) -> list[bytes]:
        """Payload bytes of rows [start, end) in one read (compaction)."""
        first, last = int(self._payload_offsets[start]), int(self._payload_offsets[end])
        data = os.pread(self._payload_fd, last - first, first) if last > first else b""
        bounds = (self._payload_offsets[start : end + 1] - first).tolist()
        return [data[bounds[i] : bounds[i + 1]] for i in range(end - start)]

    def vectors(self) -> np.ndarray:
        return self._vectors

    def locate(self, fids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lo = np.searchsorted(self._fid_sorted, fids, side="left")
        hi = np.searchsorted(self._fid_sorted, fids, side="right")
        index: list[int] = []
        rows: list[int] = []
        for i in np.nonzero(hi > lo)[0].tolist():
            for row in self._fid_order[lo[i] : hi[i]].tolist():
                if not self.dead[row]:
                    index.append(i)
                    rows.append(row)
        return np.array(index, dtype=np.int64), np.array(rows, dtype=np.int64)

    def rows_of(self, num: int) -> np.ndarray:
        lo = int(np.searchsorted(self._num_sorted, num, side="left"))
        hi = int(np.searchsorted(self._num_sorted, num, side="right"))
        found = [
            self._doc_rows[self._doc_start[local] : self._doc_start[local + 1]]
            for local in self._num_order[lo:hi].tolist()
        ]
        if not found:
            return np.zeros(0, np.int64)
        rows = np.sort(np.concatenate(found)).astype(np.int64)
        return rows[~self.dead[rows]]

    def doc_numbers(self) -> np.ndarray:
        return self._nums

    def backend(self) -> Backend:
        return self._backend
