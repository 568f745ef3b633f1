"""The growing segment's payloads (text, heading path, location of each row): those written since
the last checkpoint in RAM, the others read back by offset from the checkpoint part that holds
them (``payloads.bin``), so the process holds the text of a few seconds of writes, not of the
whole growing segment; the page cache holds the rest."""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Extent:
    """Rows [start, end) whose payloads are in the file open as ``fd`` at ``offsets``."""

    start: int
    end: int
    fd: int
    offsets: np.ndarray  # end - start + 1

    def read(self, row: int) -> bytes:
        i = row - self.start
        first, last = int(self.offsets[i]), int(self.offsets[i + 1])
        return os.pread(self.fd, last - first, first) if last > first else b""

    def read_range(self, start: int, end: int) -> list[bytes]:
        lo, hi = start - self.start, end - self.start
        first, last = int(self.offsets[lo]), int(self.offsets[hi])
        data = os.pread(self.fd, last - first, first) if last > first else b""
        bounds = (self.offsets[lo : hi + 1] - first).tolist()
        return [data[bounds[i] : bounds[i + 1]] for i in range(hi - lo)]


def _offsets(lengths: list[int]) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


class GrowingPayloads:
    def __init__(self) -> None:
        # None: the row's payload is on disk, in the extent covering it.
        self._ram: list[bytes | None] = []
        self._extents: list[Extent] = []

    def __len__(self) -> int:
        return len(self._ram)

    def __del__(self) -> None:
        for extent in getattr(self, "_extents", []):
            os.close(extent.fd)

    def extend(self, blobs: list[bytes]) -> None:
        self._ram.extend(blobs)

    def extend_stored(self, path: Path, offsets: np.ndarray) -> None:
        """Append rows whose payloads are already in ``path`` (a part read back at load)."""
        start = len(self._ram)
        end = start + len(offsets) - 1
        self._ram.extend([None] * (end - start))
        self._extents.append(Extent(start, end, os.open(path, os.O_RDONLY), np.asarray(offsets, np.int64)))

    def _extent(self, row: int) -> Extent:
        i = bisect.bisect_right([e.start for e in self._extents], row) - 1
        return self._extents[i]

    def get(self, row: int) -> bytes:
        blob = self._ram[row]
        return blob if blob is not None else self._extent(row).read(row)

    def range(self, start: int, end: int) -> list[bytes]:
        """Payload bytes of rows [start, end)."""
        out: list[bytes] = []
        row = start
        while row < end:
            blob = self._ram[row]
            if blob is not None:
                out.append(blob)
                row += 1
                continue
            extent = self._extent(row)
            stop = min(end, extent.end)
            out += extent.read_range(row, stop)
            row = stop
        return out

    def spill(self, start: int, end: int, path: Path) -> None:
        """Rows [start, end) are now also in ``path`` (a committed checkpoint part, same order):
        read them from there and let their RAM copies go."""
        blobs = self.range(start, end)
        offsets = _offsets([len(b) for b in blobs])
        self._drop(start, end)
        bisect.insort(
            self._extents, Extent(start, end, os.open(path, os.O_RDONLY), offsets), key=lambda e: e.start
        )
        for row in range(start, end):
            self._ram[row] = None

    def _drop(self, start: int, end: int) -> None:
        kept = []
        for extent in self._extents:
            if start <= extent.start and extent.end <= end:
                os.close(extent.fd)
            else:
                kept.append(extent)
        self._extents = kept
