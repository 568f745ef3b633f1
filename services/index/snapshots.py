"""Local snapshots of one collection, and their single-file (tar) form for the object store.

Layout of a collection directory::

    CURRENT                     name of the live snapshot directory (switched with os.replace)
    snapshots/<seq>-<tag>/      index.faiss, vectors.npy, [positions.npy], [payloads.json],
                                meta.json (written last)
    wal/                        write-ahead log segments

A snapshot is written into a temporary directory, fsynced, renamed into place, and only then
named by CURRENT; a crash at any point leaves the previous snapshot current and intact.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from meshkit.core.fsutil import fsync_dir, write_atomic
from meshkit.domain.ids import sha256_file
from services.index.backends import BackendState

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CURRENT = "CURRENT"
SNAPSHOTS = "snapshots"
_META = "meta.json"
_INDEX = "index.faiss"
_VECTORS = "vectors.npy"
_POSITIONS = "positions.npy"
# Chunk payloads and document sources (absent in snapshots written before they existed).
_CHUNK_PAYLOADS = "payloads.json"
_PAYLOAD_FILES = {_INDEX, _VECTORS, _POSITIONS, _CHUNK_PAYLOADS}
_TMP_PREFIX = ".tmp-"


class SnapshotError(RuntimeError):
    pass


@dataclass
class SnapshotData:
    """A consistent copy of a collection at ``sequence`` (rows of ``vectors`` match the ids)."""

    collection: str
    sequence: int
    dimension: int
    shard: int
    shard_count: int
    index_type: str
    backend: BackendState
    chunk_ids: list[str]
    doc_ids: list[str]
    vectors: np.ndarray
    # doc id -> fence (tombstones included), and how far in the replicated log it reaches.
    fences: dict[str, int] = field(default_factory=dict)
    log_pos: int = 0
    log_id: str = ""
    # {"chunks": {chunk id: payload}, "sources": {doc id: source}} (mutations.Payload/Source JSON).
    payloads: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadedSnapshot:
    meta: dict[str, Any]
    index: faiss.Index
    vectors: np.ndarray
    positions: np.ndarray | None
    payloads: dict[str, Any] = field(default_factory=dict)

    @property
    def sequence(self) -> int:
        return int(self.meta["sequence"])


def _write_file(path: Path, write: Any) -> str:
    with path.open("wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return sha256_file(path)


def write_snapshot(collection_dir: Path, data: SnapshotData) -> Path:
    """Write, fsync and commit a snapshot; returns its directory (now named by CURRENT)."""
    root = collection_dir / SNAPSHOTS
    root.mkdir(parents=True, exist_ok=True)
    name = f"{data.sequence:020d}-{uuid.uuid4().hex[:8]}"
    tmp = root / f"{_TMP_PREFIX}{name}"
    tmp.mkdir()
    try:
        files = {
            _INDEX: _write_file(tmp / _INDEX, lambda f: f.write(data.backend.index_bytes.tobytes())),
            _VECTORS: _write_file(tmp / _VECTORS, lambda f: np.save(f, data.vectors, allow_pickle=False)),
        }
        if data.backend.positions is not None:
            positions = data.backend.positions
            files[_POSITIONS] = _write_file(
                tmp / _POSITIONS, lambda f: np.save(f, positions, allow_pickle=False)
            )
        if data.payloads:
            encoded = json.dumps(data.payloads, separators=(",", ":")).encode("utf-8")
            files[_CHUNK_PAYLOADS] = _write_file(tmp / _CHUNK_PAYLOADS, lambda f: f.write(encoded))
        meta = {
            "format": FORMAT_VERSION,
            "collection": data.collection,
            "sequence": data.sequence,
            "dimension": data.dimension,
            "shard": data.shard,
            "shard_count": data.shard_count,
            "index_type": data.index_type,
            "backend": data.backend.extra,
            "chunk_ids": data.chunk_ids,
            "doc_ids": data.doc_ids,
            "fences": data.fences,
            "log_pos": data.log_pos,
            "log": data.log_id,
            "files": files,
        }
        _write_file(tmp / _META, lambda f: f.write(json.dumps(meta).encode("utf-8")))
        fsync_dir(tmp)
        final = root / name
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(collection_dir / CURRENT, f"{SNAPSHOTS}/{name}\n".encode())
    return final


def current_snapshot_dir(collection_dir: Path) -> Path | None:
    pointer = collection_dir / CURRENT
    if not pointer.exists():
        return None
    relative = pointer.read_text().strip()
    path = collection_dir / relative
    if not relative.startswith(f"{SNAPSHOTS}/") or not (path / _META).is_file():
        raise SnapshotError(f"{pointer} names {relative!r}, which is not a complete snapshot")
    return path


def read_meta(snapshot_dir: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((snapshot_dir / _META).read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise SnapshotError(f"{snapshot_dir}: unsupported snapshot format {meta.get('format')!r}")
    return meta


def verify_files(snapshot_dir: Path, meta: dict[str, Any]) -> None:
    for name, digest in meta["files"].items():
        if name not in _PAYLOAD_FILES:
            raise SnapshotError(f"{snapshot_dir}: unexpected file {name!r} in meta")
        if sha256_file(snapshot_dir / name) != digest:
            raise SnapshotError(f"{snapshot_dir}/{name}: checksum mismatch")


def read_snapshot(snapshot_dir: Path) -> LoadedSnapshot:
    meta = read_meta(snapshot_dir)
    verify_files(snapshot_dir, meta)
    index = faiss.read_index(str(snapshot_dir / _INDEX))
    vectors = np.load(snapshot_dir / _VECTORS, allow_pickle=False)
    positions_path = snapshot_dir / _POSITIONS
    positions = np.load(positions_path, allow_pickle=False) if _POSITIONS in meta["files"] else None
    if vectors.shape != (len(meta["chunk_ids"]), meta["dimension"]) or len(meta["doc_ids"]) != len(
        meta["chunk_ids"]
    ):
        raise SnapshotError(f"{snapshot_dir}: vectors and ids do not line up")
    payloads: dict[str, Any] = {}
    if _CHUNK_PAYLOADS in meta["files"]:
        payloads = json.loads((snapshot_dir / _CHUNK_PAYLOADS).read_bytes())
    return LoadedSnapshot(meta, index, vectors.astype(np.float32, copy=False), positions, payloads)


def prune(collection_dir: Path, keep: Path | None) -> None:
    """Remove every snapshot directory but ``keep``: leftovers of interrupted writes, and
    complete ones CURRENT never named (the WAL still holds everything they contain)."""
    root = collection_dir / SNAPSHOTS
    if not root.is_dir():
        return
    for child in root.iterdir():
        if child != keep:
            shutil.rmtree(child, ignore_errors=True)


def pack(snapshot_dir: Path, dest: Path) -> str:
    """One uncompressed tar of the snapshot (vectors do not compress); returns its sha256."""
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for child in sorted(snapshot_dir.iterdir()):
            tar.add(child, arcname=child.name, recursive=False)
    return sha256_file(dest)


def install_packed(collection_dir: Path, archive: Path) -> Path:
    """Unpack a downloaded snapshot tar, verify it and make it CURRENT."""
    root = collection_dir / SNAPSHOTS
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{_TMP_PREFIX}{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        with tarfile.open(archive, "r") as tar:
            for member in tar.getmembers():
                if not member.isfile() or member.name not in (_PAYLOAD_FILES | {_META}):
                    raise SnapshotError(f"unexpected member {member.name!r} in snapshot archive")
                source = tar.extractfile(member)
                assert source is not None
                with source:
                    _write_file(tmp / member.name, lambda f, s=source: shutil.copyfileobj(s, f, 1 << 20))
        meta = read_meta(tmp)
        verify_files(tmp, meta)
        fsync_dir(tmp)
        final = root / f"{int(meta['sequence']):020d}-{uuid.uuid4().hex[:8]}"
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(collection_dir / CURRENT, f"{SNAPSHOTS}/{final.name}\n".encode())
    return final
