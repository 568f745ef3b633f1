"""Checkpoints of one collection: a manifest naming the live segments and the log position, and
only the files that changed since the previous checkpoint.

Layout of a collection directory::

    collection.json          identity (collection, dimension, shard, shard count)
    CURRENT                  names the live checkpoint directory (switched with os.replace)
    snapshots/<seq>-<tag>/   one checkpoint: meta.json (the manifest, written last) and what it added:
                             vectors.npy, rows.npz, payloads.bin: the growing segment's rows since the
                             previous checkpoint (possibly none); frozen-<id>/ the same for a frozen
                             segment not sealed yet; deleted-<id>.bin: the bitmaps that changed;
                             docs.jsonl: the document records (fence, source) that changed
    segments/<id>-<tag>/     a sealed segment: vectors.npy, rows.npz, payloads.bin, index.faiss (written
                             once, when it is sealed or compacted)
    merged/<name>/           a background merge of checkpoint files (growing rows, document records)
    wal/                     write-ahead log segments

The manifest names every file it needs by path, sha256 and size, wherever it lies: a file
written once stays until no manifest names it. A checkpoint is written into a temporary
directory, fsynced, renamed into place, and only then named by CURRENT; a crash at any point
leaves the previous manifest current and intact (its files are never changed or removed while
it is current), and the WAL replay repairs the rest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshkit.core.fsutil import fsync_dir, write_atomic
from services.index.docs import DocRecord, write_run
from services.index.segment_files import (
    FileRef,
    RowData,
    ref_of,
    verify,
    write_bitmap,
    write_file,
    write_rows,
)
from services.index.segments import Part

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
CURRENT = "CURRENT"
SNAPSHOTS = "snapshots"
SEGMENTS = "segments"
MERGED = "merged"
META = "meta.json"
DOCS_RUN = "docs.jsonl"
TMP_PREFIX = ".tmp-"
# Directories whose children a manifest may name.
DATA_DIRS = (SNAPSHOTS, SEGMENTS, MERGED)


class SnapshotError(RuntimeError):
    pass


@dataclass
class NewPart:
    """Rows of an unsealed segment a checkpoint writes."""

    sid: int
    start: int
    data: RowData

    @property
    def end(self) -> int:
        return self.start + len(self.data)


@dataclass
class SnapshotData:
    """What a checkpoint writes, copied under the collection's locks: the manifest fields, the
    segments' entries as committed so far, and the new rows, bitmaps and records."""

    header: dict[str, Any]
    # Manifest entries of every segment, in order; parts and bitmaps as committed so far.
    segments: list[dict[str, Any]]
    # The growing segment's new rows (at the top of the directory, always written), and frozen
    # segments' rows not in any committed part yet.
    growing: NewPart
    frozen: list[NewPart] = field(default_factory=list)
    bitmaps: dict[int, np.ndarray] = field(default_factory=dict)
    doc_records: list[DocRecord] = field(default_factory=list)
    doc_runs: list[FileRef] = field(default_factory=list)

    @property
    def sequence(self) -> int:
        return int(self.header["sequence"])


@dataclass
class Written:
    """A committed checkpoint: its directory and the refs of what it added."""

    directory: Path
    parts: dict[int, Part]
    bitmaps: dict[int, FileRef]
    doc_run: FileRef | None
    bytes_written: int


def _part_files(directory: Path, rel: str, part: NewPart, prefix: str = "") -> Part:
    return Part(part.start, part.end, write_rows(directory, part.data, rel, prefix))


def write_snapshot(collection_dir: Path, data: SnapshotData) -> Written:
    """Write, fsync and commit a checkpoint; CURRENT names it once this returns."""
    root = collection_dir / SNAPSHOTS
    root.mkdir(parents=True, exist_ok=True)
    name = f"{data.sequence:020d}-{uuid.uuid4().hex[:8]}"
    rel = f"{SNAPSHOTS}/{name}"
    tmp = root / f"{TMP_PREFIX}{name}"
    tmp.mkdir()
    try:
        growing = _part_files(tmp, rel, data.growing)
        parts = {data.growing.sid: growing} if len(data.growing.data) else {}
        for frozen in data.frozen:
            sub = tmp / f"frozen-{frozen.sid}"
            sub.mkdir()
            parts[frozen.sid] = _part_files(sub, f"{rel}/{sub.name}", frozen)
            fsync_dir(sub)
        bitmaps = {
            sid: write_bitmap(tmp / f"deleted-{sid}.bin", dead, f"{rel}/deleted-{sid}.bin")
            for sid, dead in data.bitmaps.items()
        }
        doc_run = None
        if data.doc_records:
            write_run(tmp / DOCS_RUN, data.doc_records)
            doc_run = ref_of(tmp / DOCS_RUN, f"{rel}/{DOCS_RUN}")
        manifest = _manifest(data, parts, bitmaps, doc_run, growing.files)
        write_file(tmp / META, json.dumps(manifest, separators=(",", ":")).encode("utf-8"))
        fsync_dir(tmp)
        written = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
        final = root / name
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(collection_dir / CURRENT, f"{rel}\n".encode())
    return Written(final, parts, bitmaps, doc_run, written)


def _manifest(
    data: SnapshotData,
    parts: dict[int, Part],
    bitmaps: dict[int, FileRef],
    doc_run: FileRef | None,
    own: dict[str, FileRef],
) -> dict[str, Any]:
    segments = []
    for entry in data.segments:
        entry = dict(entry)
        sid = int(entry["id"])
        if sid in parts:
            entry["parts"] = [*entry["parts"], parts[sid].to_json()]
        if sid in bitmaps:
            entry["deleted"] = bitmaps[sid].to_json()
        segments.append(entry)
    runs = [*data.doc_runs, *([doc_run] if doc_run else [])]
    return {
        "format": FORMAT_VERSION,
        **data.header,
        "segments": segments,
        "doc_runs": [r.to_json() for r in runs],
        # Its own row files even when they hold no row: a damaged one is found at load.
        "files": {name: ref.to_json() for name, ref in own.items()},
    }


# ----- reading -----


def current_snapshot_dir(collection_dir: Path) -> Path | None:
    pointer = collection_dir / CURRENT
    if not pointer.exists():
        return None
    relative = pointer.read_text().strip()
    path = collection_dir / relative
    if not relative.startswith(f"{SNAPSHOTS}/") or not (path / META).is_file():
        raise SnapshotError(f"{pointer} names {relative!r}, which is not a complete snapshot")
    return path


def read_meta(snapshot_dir: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((snapshot_dir / META).read_text())
    if meta.get("format") not in (1, FORMAT_VERSION):
        raise SnapshotError(f"{snapshot_dir}: unsupported snapshot format {meta.get('format')!r}")
    return meta


def manifest_refs(manifest: dict[str, Any]) -> list[FileRef]:
    """Every file a (format 2) manifest names."""
    refs = [FileRef.from_json(r) for r in manifest.get("files", {}).values()]
    refs += [FileRef.from_json(r) for r in manifest.get("doc_runs", [])]
    for entry in manifest.get("segments", []):
        refs += [FileRef.from_json(r) for r in entry.get("files", {}).values()]
        for part in entry.get("parts", []):
            refs += Part.from_json(part).files.values()
        if entry.get("deleted"):
            refs.append(FileRef.from_json(entry["deleted"]))
    return refs


def check_paths(refs: list[FileRef]) -> None:
    """A manifest (perhaps downloaded) only names files under the collection's data dirs."""
    for ref in refs:
        parts = ref.path.split("/")
        if len(parts) < 3 or parts[0] not in DATA_DIRS or any(p in ("", ".", "..") for p in parts):
            raise SnapshotError(f"manifest names {ref.path!r}, outside the collection's data")


def verify_manifest(collection_dir: Path, manifest: dict[str, Any]) -> None:
    refs = manifest_refs(manifest)
    check_paths(refs)
    for ref in refs:
        try:
            verify(collection_dir, ref)
        except RuntimeError as exc:
            raise SnapshotError(str(exc)) from None


# ----- pruning -----


def top_dir(path: str) -> str:
    """The directory under snapshots/, segments/ or merged/ a referenced path lies in."""
    return "/".join(path.split("/")[:2])


def prune_victims(collection_dir: Path, keep: set[str], *, include_tmp: bool) -> list[Path]:
    """Directories of the data dirs no manifest or live state names (``keep``: their
    ``top_dir``s); temporary ones only when ``include_tmp`` (nothing is being written)."""
    victims = []
    for data_dir in DATA_DIRS:
        root = collection_dir / data_dir
        if not root.is_dir():
            continue
        for child in root.iterdir():
            if child.name.startswith(TMP_PREFIX) and not include_tmp:
                continue
            if f"{data_dir}/{child.name}" not in keep:
                victims.append(child)
    return victims


def remove_dirs(victims: list[Path]) -> None:
    for victim in victims:
        if victim.is_dir():
            shutil.rmtree(victim, ignore_errors=True)
        else:
            victim.unlink(missing_ok=True)
