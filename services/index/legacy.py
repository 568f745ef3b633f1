"""Snapshots written before segments (format 1: one snapshot of the whole collection: index,
vectors, ids, fences, payloads), so a replica upgraded in place, or restoring an old snapshot
from the object store, loads what it has. Loading one re-adds its chunks in order (the growing
segment freezes at its size as it fills, exactly as a replay would) and the next checkpoint
writes the segment format."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshkit.core.fsutil import fsync_dir, write_atomic
from meshkit.domain.ids import sha256_file
from services.index.snapshots import CURRENT, META, SNAPSHOTS, TMP_PREFIX, SnapshotError

LEGACY_FORMAT = 1
_INDEX, _VECTORS, _POSITIONS, _PAYLOADS = "index.faiss", "vectors.npy", "positions.npy", "payloads.json"
_FILES = {_INDEX, _VECTORS, _POSITIONS, _PAYLOADS}


@dataclass
class LegacySnapshot:
    meta: dict[str, Any]
    vectors: np.ndarray
    payloads: dict[str, Any] = field(default_factory=dict)


def _verify(snapshot_dir: Path, meta: dict[str, Any]) -> None:
    for name, digest in meta["files"].items():
        if name not in _FILES:
            raise SnapshotError(f"{snapshot_dir}: unexpected file {name!r} in meta")
        if sha256_file(snapshot_dir / name) != digest:
            raise SnapshotError(f"{snapshot_dir}/{name}: checksum mismatch")


def read_legacy(snapshot_dir: Path, meta: dict[str, Any]) -> LegacySnapshot:
    """A format 1 snapshot, its files checked (its FAISS index is not needed: the vectors are
    authoritative)."""
    _verify(snapshot_dir, meta)
    vectors = np.load(snapshot_dir / _VECTORS, allow_pickle=False)
    if vectors.shape != (len(meta["chunk_ids"]), meta["dimension"]) or len(meta["doc_ids"]) != len(
        meta["chunk_ids"]
    ):
        raise SnapshotError(f"{snapshot_dir}: vectors and ids do not line up")
    payloads: dict[str, Any] = {}
    if _PAYLOADS in meta["files"]:
        payloads = json.loads((snapshot_dir / _PAYLOADS).read_bytes())
    return LegacySnapshot(meta, vectors.astype(np.float32, copy=False), payloads)


def _copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    source = tar.extractfile(member)
    assert source is not None
    with source, dest.open("wb") as f:
        shutil.copyfileobj(source, f, 1 << 20)
        f.flush()
        os.fsync(f.fileno())


def install_legacy_tar(collection_dir: Path, archive: Path) -> Path:
    """Unpack a format 1 snapshot tar (from the object store), verify it and make it CURRENT."""
    root = collection_dir / SNAPSHOTS
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        with tarfile.open(archive, "r") as tar:
            for member in tar.getmembers():
                if not member.isfile() or member.name not in (_FILES | {META}):
                    raise SnapshotError(f"unexpected member {member.name!r} in snapshot archive")
                _copy_member(tar, member, tmp / member.name)
        meta = json.loads((tmp / META).read_text())
        if meta.get("format") != LEGACY_FORMAT:
            raise SnapshotError(f"snapshot archive of format {meta.get('format')!r}")
        _verify(tmp, meta)
        fsync_dir(tmp)
        final = root / f"{int(meta['sequence']):020d}-{uuid.uuid4().hex[:8]}"
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(collection_dir / CURRENT, f"{SNAPSHOTS}/{final.name}\n".encode())
    return final
