"""The files rows are stored in, written once and never changed: a sealed segment's, a
checkpoint's part of the growing segment, a merge of such parts.

A set of rows is three files::

    vectors.npy    float32 (rows, dimension): memory-mapped by a sealed segment
    rows.npz       per row: chunk id (16 bytes), local document number (int32), bucket (uint16),
                   payload offsets (int64, rows + 1); the local document names (one UTF-8 blob
                   and its offsets)
    payloads.bin   each row's payload (text, heading path, location) as compact JSON, read by
                   offset with pread: the page cache holds it, not the process

Why a packed file read by offset rather than SQLite: the rows of a set never change and the row
number is the key, so a B-tree buys nothing; one sequential write when the set is written, one
pread per chunk shown, and no second engine (journal, cache, locks) inside the process.
Every file is fsynced and named in a manifest by path, sha256 and size (``FileRef``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshkit.domain.ids import sha256_file
from services.index import mutations as mut

VECTORS, ROWS, PAYLOADS = "vectors.npy", "rows.npz", "payloads.bin"
ROW_FILES = (VECTORS, ROWS, PAYLOADS)
CHUNK_BYTES = 16


class SegmentFileError(RuntimeError):
    """A file a manifest names is missing, of another size or checksum, or does not decode."""


@dataclass(frozen=True)
class FileRef:
    """A file by its path relative to the collection directory, checksum and size."""

    path: str
    sha256: str
    size: int

    def to_json(self) -> list[Any]:
        return [self.path, self.sha256, self.size]

    @staticmethod
    def from_json(raw: list[Any]) -> FileRef:
        path, digest, size = raw
        return FileRef(str(path), str(digest), int(size))


def write_file(path: Path, data: bytes | memoryview) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def ref_of(path: Path, rel: str) -> FileRef:
    """The ref of the file at ``path``, named ``rel`` (its path from the collection directory
    once its directory has its final name)."""
    return FileRef(rel, sha256_file(path), path.stat().st_size)


def verify(root: Path, ref: FileRef) -> Path:
    """The path of ``ref`` once its size and checksum match."""
    path = root / ref.path
    if not path.is_file() or path.stat().st_size != ref.size:
        raise SegmentFileError(f"{ref.path}: missing or of the wrong size")
    if sha256_file(path) != ref.sha256:
        raise SegmentFileError(f"{ref.path}: checksum mismatch")
    return path


# ----- payloads -----


def encode_payload(payload: mut.Payload | None) -> bytes:
    """A row's payload as stored; b"" for a chunk written without one."""
    if payload is None:
        return b""
    return json.dumps(payload.to_json(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_payload(raw: bytes) -> mut.Payload:
    return mut.Payload.from_json(json.loads(raw)) if raw else mut.Payload()


# ----- row sets -----


@dataclass
class RowData:
    """Rows to write, lined up: row i is chunk ``chunks[i]`` of local document ``docno[i]``
    (named ``names[docno[i]]``)."""

    vectors: np.ndarray
    chunks: np.ndarray
    docno: np.ndarray
    names: list[str]
    buckets: np.ndarray
    payloads: list[bytes]

    def __len__(self) -> int:
        return len(self.vectors)


def _offsets(blobs: list[bytes]) -> np.ndarray:
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    return offsets


def write_rows(directory: Path, data: RowData, rel: str, prefix: str = "") -> dict[str, FileRef]:
    """Write the three files of ``data`` into ``directory`` (named ``rel`` from the collection
    directory once in place), file names prefixed by ``prefix``, fsynced; returns their refs."""
    names = [n.encode("utf-8") for n in data.names]
    arrays: dict[str, np.ndarray] = {
        "chunks": np.ascontiguousarray(data.chunks, dtype=np.uint8).reshape(-1, CHUNK_BYTES),
        "docno": np.ascontiguousarray(data.docno, dtype=np.int32),
        "buckets": np.ascontiguousarray(data.buckets, dtype=np.uint16),
        "payload_offsets": _offsets(data.payloads),
        "names_blob": np.frombuffer(b"".join(names), dtype=np.uint8),
        "names_offsets": _offsets(names),
    }
    paths = {name: directory / f"{prefix}{name}" for name in ROW_FILES}
    with paths[VECTORS].open("wb") as f:
        np.save(f, np.ascontiguousarray(data.vectors, dtype=np.float32), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    with paths[ROWS].open("wb") as f:
        savez: Any = np.savez  # its stub reads **arrays as its allow_pickle flag
        savez(f, allow_pickle=False, **arrays)
        f.flush()
        os.fsync(f.fileno())
    write_file(paths[PAYLOADS], b"".join(data.payloads))
    return {name: ref_of(path, f"{rel}/{path.name}") for name, path in paths.items()}


@dataclass
class StoredRows:
    """A row set read back: small arrays in RAM, vectors memory-mapped (or loaded), payloads
    on disk behind their offsets."""

    vectors: np.ndarray
    chunks: np.ndarray
    docno: np.ndarray
    names: list[str]
    buckets: np.ndarray
    payload_offsets: np.ndarray
    payload_path: Path

    def __len__(self) -> int:
        return len(self.chunks)

    def payload_blobs(self) -> list[bytes]:
        """Every row's stored payload bytes (parts loaded into the growing segment)."""
        data = self.payload_path.read_bytes()
        offsets = self.payload_offsets.tolist()
        return [data[offsets[i] : offsets[i + 1]] for i in range(len(self))]


def _names(blob: np.ndarray, offsets: np.ndarray) -> list[str]:
    raw = blob.tobytes()
    bounds = offsets.tolist()
    return [raw[bounds[i] : bounds[i + 1]].decode("utf-8") for i in range(len(bounds) - 1)]


def read_rows(root: Path, refs: dict[str, FileRef], dimension: int, *, mmap: bool) -> StoredRows:
    """The row set ``refs`` names, its files checked; vectors memory-mapped when ``mmap``."""
    for name in ROW_FILES:
        if name not in refs:
            raise SegmentFileError(f"a row set without {name}")
        verify(root, refs[name])
    vectors = np.load(root / refs[VECTORS].path, mmap_mode="r" if mmap else None, allow_pickle=False)
    with np.load(root / refs[ROWS].path, allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    try:
        chunks = arrays["chunks"].reshape(-1, CHUNK_BYTES)
        rows = StoredRows(
            vectors,
            chunks,
            arrays["docno"].astype(np.int32, copy=False),
            _names(arrays["names_blob"], arrays["names_offsets"]),
            arrays["buckets"].astype(np.uint16, copy=False),
            arrays["payload_offsets"].astype(np.int64, copy=False),
            root / refs[PAYLOADS].path,
        )
    except KeyError as exc:
        raise SegmentFileError(f"{refs[ROWS].path}: no array {exc}") from None
    n = len(chunks)
    if vectors.shape != (n, dimension) or len(rows.docno) != n or len(rows.buckets) != n:
        raise SegmentFileError(f"{refs[VECTORS].path}: vectors and rows do not line up")
    if len(rows.payload_offsets) != n + 1 or (n and int(rows.docno.max()) >= len(rows.names)):
        raise SegmentFileError(f"{refs[ROWS].path}: payload offsets or documents do not line up")
    return rows


# ----- deleted bitmaps -----


def write_bitmap(path: Path, dead: np.ndarray, rel: str) -> FileRef:
    write_file(path, np.packbits(dead, bitorder="little").tobytes())
    return ref_of(path, rel)


def read_bitmap(root: Path, ref: FileRef | None, rows: int) -> np.ndarray:
    """The deleted mask of ``rows`` rows. A bitmap written before the last rows were appended
    is shorter: those rows are live (a delete among them would have rewritten it)."""
    dead = np.zeros(rows, dtype=bool)
    if ref is None:
        return dead
    packed = np.frombuffer(verify(root, ref).read_bytes(), dtype=np.uint8)
    stored = np.unpackbits(packed, bitorder="little").astype(bool)
    if stored[rows:].any():
        raise SegmentFileError(f"{ref.path}: bitmap deletes rows beyond the segment's {rows}")
    dead[: min(rows, len(stored))] = stored[:rows]
    return dead
