"""A collection's rows live in segments: one growing segment takes the writes, sealed ones are
immutable (sealed.py). A row is one chunk: its vector, chunk id, document, bucket and payload;
deleting it only sets its bit in the segment's deleted bitmap (an overwrite deletes the old row
and appends a new one), so a segment's rows never move and searches skip the dead ones.

The growing segment keeps its vectors in one preallocated array (untouched pages cost nothing),
its payloads as encoded bytes and its lookups (chunk -> row, document -> rows) in small dicts:
it is bounded by the segment size. When it reaches it, it is frozen (no more appends) at that
same log entry on every replica, and sealed in the background (store.py).

Documents are known here by a *global number* (docs.DocTable): lookups and filters work on
numpy arrays of those numbers, never on per-row Python objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.index import mutations as mut
from services.index.backends import Backend, BackendConfig, FlatBackend, LiveRows
from services.index.payloads import GrowingPayloads
from services.index.segment_files import CHUNK_BYTES, PAYLOADS, FileRef, RowData, decode_payload

GROWING, FROZEN, SEALED = "growing", "frozen", "sealed"


def chunk_bytes(chunk_ids: list[str]) -> np.ndarray:
    """Chunk ids (32 hex chars) as rows of 16 bytes."""
    raw = b"".join(bytes.fromhex(c) for c in chunk_ids)
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, CHUNK_BYTES)


def fids_of(chunks: np.ndarray) -> np.ndarray:
    """The 60-bit FAISS ids (records.faiss_id) of 16-byte chunk ids: their first 15 hex digits."""
    if not len(chunks):
        return np.zeros(0, dtype=np.int64)
    head = np.ascontiguousarray(chunks[:, :8]).view(">u8").reshape(-1)
    return (head >> np.uint64(4)).astype(np.int64)


@dataclass(frozen=True)
class Part:
    """Rows [start, end) of an unsealed segment, in files a checkpoint (or a merge) wrote."""

    start: int
    end: int
    files: dict[str, FileRef]

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "files": {k: v.to_json() for k, v in self.files.items()},
        }

    @staticmethod
    def from_json(raw: dict[str, Any]) -> Part:
        files = {str(k): FileRef.from_json(v) for k, v in raw["files"].items()}
        return Part(int(raw["start"]), int(raw["end"]), files)


class Segment(ABC):
    """What searches and writes need from a segment, growing or sealed."""

    state: str
    backend_kind: str

    def __init__(self, sid: int, dimension: int) -> None:
        self.sid = sid
        self.dimension = dimension
        self.rows = 0
        self.dead = np.zeros(0, dtype=bool)
        self.dead_count = 0
        # Bumped by every delete: a checkpoint writes the bitmap of a segment whose version
        # moved since the one its committed bitmap file holds.
        self.dead_version = 0
        self.persisted_dead_version = 0
        self.bitmap_ref: FileRef | None = None
        self._live: LiveRows | None = None

    # ----- the deleted bitmap -----

    @property
    def live_count(self) -> int:
        return self.rows - self.dead_count

    def live(self) -> LiveRows:
        """The live rows now (its FAISS selector is built once per version of the bitmap)."""
        live = self._live
        if live is None or live.dead_count != self.dead_count or len(live.dead) != self.rows:
            live = self._live = LiveRows(self.dead[: self.rows], self.dead_count)
        return live

    def mark_dead(self, rows: np.ndarray) -> None:
        """Delete live ``rows`` (the caller found them live)."""
        if not len(rows):
            return
        self.dead[rows] = True
        self.dead_count += len(rows)
        self.dead_version += 1
        self._live = None

    @property
    def bitmap_dirty(self) -> bool:
        return self.dead_version != self.persisted_dead_version

    # ----- rows -----

    chunks: np.ndarray
    docno: np.ndarray
    buckets: np.ndarray

    def chunk_id(self, row: int) -> str:
        return bytes(self.chunks[row]).hex()

    @abstractmethod
    def doc_name(self, local: int) -> str: ...

    def doc_id(self, row: int) -> str:
        return self.doc_name(int(self.docno[row]))

    @abstractmethod
    def payload_bytes(self, row: int) -> bytes: ...

    def payload(self, row: int) -> mut.Payload:
        return decode_payload(self.payload_bytes(row))

    @abstractmethod
    def vectors(self) -> np.ndarray:
        """The (rows, dimension) vectors: a view, never a copy."""

    # ----- lookups -----

    @abstractmethod
    def locate(self, fids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(indices into ``fids``, rows): the live rows holding those FAISS ids."""

    @abstractmethod
    def rows_of(self, num: int) -> np.ndarray:
        """Live rows of the document numbered ``num``."""

    @abstractmethod
    def doc_numbers(self) -> np.ndarray:
        """Global number of each local document (int64)."""

    def rows_of_docs(self, nums: np.ndarray) -> np.ndarray:
        """Live rows of any of the documents ``nums`` (sorted)."""
        if len(nums) <= 8:
            found = [self.rows_of(int(n)) for n in nums.tolist()]
            return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)
        locals_wanted = np.isin(self.doc_numbers(), nums)
        mask = locals_wanted[self.docno[: self.rows]] & ~self.dead[: self.rows]
        return np.nonzero(mask)[0].astype(np.int64)

    # ----- scoring -----

    @abstractmethod
    def backend(self) -> Backend: ...

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The best ``k`` live rows for ``query``."""
        if not self.live_count:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        return self.backend().search(query, k, None, self.live())

    def exact(self, query: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact scores of ``rows`` (live rows of a filter), the best ``k``."""
        return FlatBackend(BackendConfig(self.dimension), self.vectors()).search(query, k, rows)


class GrowingSegment(Segment):
    """Recent writes, in RAM, searched exactly; append-only until frozen."""

    backend_kind = "flat"

    def __init__(self, sid: int, dimension: int, capacity: int) -> None:
        super().__init__(sid, dimension)
        self.state = GROWING
        # np.zeros maps untouched pages lazily: capacity costs what rows fill.
        self._vectors = np.zeros((max(capacity, 16), dimension), dtype=np.float32)
        self.chunks = np.zeros((len(self._vectors), CHUNK_BYTES), dtype=np.uint8)
        self.docno = np.zeros(len(self._vectors), dtype=np.int32)
        self.buckets = np.zeros(len(self._vectors), dtype=np.uint16)
        self.dead = np.zeros(len(self._vectors), dtype=bool)
        self._payloads = GrowingPayloads()
        self._names: list[str] = []
        self._nums: list[int] = []
        self._local_of: dict[int, int] = {}
        self._doc_rows: list[list[int]] = []
        self._fid_row: dict[int, int] = {}
        # Rows [0, persisted_rows) are in ``parts`` (files of committed checkpoints).
        self.parts: list[Part] = []
        self.persisted_rows = 0

    def freeze(self) -> None:
        self.state = FROZEN

    # ----- appending -----

    def _reserve(self, extra: int) -> None:
        need = self.rows + extra
        if need <= len(self._vectors):
            return
        capacity = max(need, len(self._vectors) * 2)
        for name in ("_vectors", "chunks", "docno", "buckets", "dead"):
            old = getattr(self, name)
            new = np.zeros((capacity, *old.shape[1:]), dtype=old.dtype)
            new[: self.rows] = old[: self.rows]
            setattr(self, name, new)
        self._live = None

    def _local(self, num: int, doc_id: str) -> int:
        local = self._local_of.get(num)
        if local is None:
            local = self._local_of[num] = len(self._names)
            self._names.append(doc_id)
            self._nums.append(num)
            self._doc_rows.append([])
        return local

    def append(
        self,
        chunks: np.ndarray,
        nums: list[int],
        doc_ids: list[str],
        vectors: np.ndarray,
        buckets: np.ndarray,
        payloads: list[bytes] | tuple[Path, np.ndarray],
    ) -> None:
        """Append rows (their chunk ids hold no live row anywhere: the caller deleted those);
        ``payloads``: their bytes, or the file and offsets that already hold them."""
        n = len(chunks)
        if self.state != GROWING:
            raise RuntimeError(f"segment {self.sid} is {self.state}: no appends")
        self._reserve(n)
        start = self.rows
        self._vectors[start : start + n] = vectors
        self.chunks[start : start + n] = chunks
        self.buckets[start : start + n] = buckets
        for offset, (num, doc_id, fid) in enumerate(
            zip(nums, doc_ids, fids_of(chunks).tolist(), strict=True)
        ):
            local = self._local(num, doc_id)
            self.docno[start + offset] = local
            self._doc_rows[local].append(start + offset)
            self._fid_row[fid] = start + offset
        if isinstance(payloads, tuple):
            self._payloads.extend_stored(*payloads)
        else:
            self._payloads.extend(payloads)
        self.rows += n

    def mark_dead(self, rows: np.ndarray) -> None:
        super().mark_dead(rows)
        for fid, row in zip(fids_of(self.chunks[rows]).tolist(), rows.tolist(), strict=True):
            if self._fid_row.get(fid) == row:
                del self._fid_row[fid]

    # ----- reading -----

    def doc_name(self, local: int) -> str:
        return self._names[local]

    def payload_bytes(self, row: int) -> bytes:
        return self._payloads.get(row)

    def spill_payloads(self, part: Part, root: Path) -> None:
        """A committed part holds rows [part.start, part.end): read their payloads from it."""
        self._payloads.spill(part.start, part.end, root / part.files[PAYLOADS].path)

    def vectors(self) -> np.ndarray:
        return self._vectors[: self.rows]

    def locate(self, fids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        found = [
            (i, row) for i, fid in enumerate(fids.tolist()) if (row := self._fid_row.get(fid)) is not None
        ]
        if not found:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        index, rows = zip(*found, strict=True)
        return np.array(index, dtype=np.int64), np.array(rows, dtype=np.int64)

    def rows_of(self, num: int) -> np.ndarray:
        local = self._local_of.get(num)
        if local is None:
            return np.zeros(0, np.int64)
        return np.array([r for r in self._doc_rows[local] if not self.dead[r]], dtype=np.int64)

    def doc_numbers(self) -> np.ndarray:
        return np.array(self._nums, dtype=np.int64)

    def backend(self) -> Backend:
        return FlatBackend(BackendConfig(self.dimension), self.vectors())

    def row_data(self, start: int, end: int, *, copy: bool = True) -> RowData:
        """Rows [start, end), for a checkpoint part or the sealed segment's files: copies, or
        views of the vectors when the rows can no longer change (a frozen segment)."""
        local = self.docno[start:end]
        used = np.unique(local)
        renumber = np.zeros(len(self._names), dtype=np.int32)
        renumber[used] = np.arange(len(used), dtype=np.int32)
        vectors = self._vectors[start:end]
        return RowData(
            vectors.copy() if copy else vectors,
            self.chunks[start:end].copy(),
            renumber[local],
            [self._names[i] for i in used.tolist()],
            self.buckets[start:end].copy(),
            self._payloads.range(start, end),
        )

    def local_numbers(self, start: int, end: int) -> list[int]:
        """Global numbers of the documents of rows [start, end), in ``row_data``'s order."""
        used = np.unique(self.docno[start:end]).tolist()
        return [self._nums[i] for i in used]
