"""Background work on a collection's segments, each job in three steps so that searches and
writes go on meanwhile:

1. ``prepare`` (state read lock): pick the work (compaction.py) and take what it reads. Rows of a
   frozen or sealed segment never change, only their deleted bits: a job copies the bitmap and
   reads the rows afterwards, without any lock;
2. ``build`` (no lock): write the new files into a temporary directory (fsynced) and build the
   new segment's FAISS index, tuned to the recall target (ann.py);
3. ``install`` (write lock, brief): rename the directory into place and swap the new segment in
   if its inputs are still there; rows deleted meanwhile are deleted in the new segment too.

- **seal**: a frozen segment (all its rows, deleted ones included, so row numbers and the
  bitmap carry over) becomes a sealed segment with its own index;
- **compact**: sealed segments merge into one without their deleted rows (or one is rebuilt as
  the index type the policy now asks for);
- **merge parts / runs**: checkpoint files of the growing segment, or document-record runs,
  folded into one file (size-tiered).

The next checkpoint names the new files; until then the previous manifest still names the old
ones (never removed while named), so a crash anywhere loses nothing.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshkit.core.fsutil import fsync_dir
from services.index.ann import calibrate
from services.index.backends import Backend, BackendConfig, FlatBackend
from services.index.compaction import SegmentInfo, compaction_plan, merge_plan
from services.index.docs import merge_runs, write_run
from services.index.sealed import INDEX_FILE, SealedSegment
from services.index.segment_files import (
    FileRef,
    RowData,
    StoredRows,
    read_rows,
    ref_of,
    write_file,
    write_rows,
)
from services.index.segments import FROZEN, SEALED, GrowingSegment, Part, Segment
from services.index.snapshots import MERGED, SEGMENTS, TMP_PREFIX
from services.index.state import IndexState

BuildFn = Callable[[str, BackendConfig, np.ndarray, np.ndarray], Backend]


@dataclass
class Built:
    """A new directory, written and fsynced under its temporary name."""

    tmp: Path
    final: Path
    rel: str

    def place(self) -> None:
        os.rename(self.tmp, self.final)
        fsync_dir(self.final.parent)

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def _new_dir(root: Path, data_dir: str, name: str) -> Built:
    parent = root / data_dir
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f"{TMP_PREFIX}{name}"
    tmp.mkdir()
    return Built(tmp, parent / name, f"{data_dir}/{name}")


# ----- sealed segments (seal and compaction) -----


@dataclass
class SegmentJob:
    """Rows to turn into one sealed segment: ``sources`` are (input segment, its rows taken, in
    output order), ``replaces`` the segments it takes the place of, ``kind`` its index."""

    kind: str
    sources: list[tuple[Segment, np.ndarray]]
    replaces: list[Segment]
    # A seal keeps its segment's id; a compaction's segment gets one when installed.
    sid: int | None = None
    built: Built | None = None
    data: RowData | None = None
    nums: np.ndarray | None = None
    files: dict[str, FileRef] | None = None
    backend: Backend | None = None
    recall: float = 1.0
    seconds: float = 0.0


def infos(state: IndexState) -> list[SegmentInfo]:
    return [
        SegmentInfo(s.sid, s.rows, s.live_count, s.backend_kind) for s in state.segments if s.state == SEALED
    ]


def prepare_seal(state: IndexState) -> SegmentJob | None:
    frozen = next((s for s in state.segments if s.state == FROZEN), None)
    if frozen is None:
        return None
    rows = np.arange(frozen.rows, dtype=np.int64)
    return SegmentJob(state.policy.kind_for(frozen.rows), [(frozen, rows)], [frozen], sid=frozen.sid)


def prepare_compaction(state: IndexState) -> SegmentJob | None:
    plan = compaction_plan(infos(state), state.policy)
    if plan is None:
        return None
    inputs = [s for s in state.segments if s.sid in plan]
    sources = [(s, np.nonzero(~s.dead[: s.rows])[0].astype(np.int64)) for s in inputs]
    live = sum(len(rows) for _s, rows in sources)
    return SegmentJob(state.policy.kind_for(live), sources, inputs)


def gather(sources: list[tuple[Segment, np.ndarray]], dimension: int) -> tuple[RowData, np.ndarray]:
    """The rows ``sources`` name as one row set, and the global number of each of its local
    documents (documents of several inputs become one local document)."""
    first = sources[0][0] if sources else None
    if len(sources) == 1 and isinstance(first, GrowingSegment):
        nums = np.array(first.local_numbers(0, first.rows), dtype=np.int64)
        return first.row_data(0, first.rows, copy=False), nums
    vectors, chunks, buckets, docno, payloads = [], [], [], [], []
    local_of: dict[int, int] = {}
    names: list[str] = []
    for segment, rows in sources:
        numbers = segment.doc_numbers()
        mapping = np.zeros(len(numbers), dtype=np.int32)
        for local in np.unique(segment.docno[rows]).tolist():
            num = int(numbers[local])
            if num not in local_of:
                local_of[num] = len(names)
                names.append(segment.doc_name(local))
            mapping[local] = local_of[num]
        vectors.append(np.asarray(segment.vectors()[rows], dtype=np.float32))
        chunks.append(segment.chunks[rows])
        buckets.append(segment.buckets[rows])
        docno.append(mapping[segment.docno[rows]])
        payloads += [segment.payload_bytes(r) for r in rows.tolist()]
    data = RowData(
        np.concatenate(vectors) if vectors else np.zeros((0, dimension), np.float32),
        np.concatenate(chunks) if chunks else np.zeros((0, 16), np.uint8),
        np.concatenate(docno) if docno else np.zeros(0, np.int32),
        names,
        np.concatenate(buckets) if buckets else np.zeros(0, np.uint16),
        payloads,
    )
    return data, np.array(list(local_of), dtype=np.int64)


def build_segment(root: Path, job: SegmentJob, config: BackendConfig, target: float, build: BuildFn) -> None:
    """Write the job's segment files and build its index (no lock held)."""
    started = time.perf_counter()
    data, job.nums = gather(job.sources, config.dimension)
    first = job.sid if job.sid is not None else job.replaces[0].sid
    built = _new_dir(
        root, SEGMENTS, f"{first:08d}-{'s' if job.sid is not None else 'c'}{uuid.uuid4().hex[:8]}"
    )
    try:
        files = write_rows(built.tmp, data, built.rel)
        if len(data):
            backend = build(job.kind, config, np.arange(len(data), dtype=np.int64), data.vectors)
            job.recall = calibrate(backend, data.vectors, target)
            index_bytes = backend.index_bytes()
            if index_bytes is not None:
                write_file(built.tmp / INDEX_FILE, index_bytes.tobytes())
                files[INDEX_FILE] = ref_of(built.tmp / INDEX_FILE, f"{built.rel}/{INDEX_FILE}")
                backend.reload(index_bytes)
            job.backend = backend
        fsync_dir(built.tmp)
    except BaseException:
        built.discard()
        raise
    job.built, job.data, job.files = built, data, files
    job.seconds = time.perf_counter() - started


def install_segment(state: IndexState, job: SegmentJob, config: BackendConfig) -> SealedSegment | None:
    """Swap the built segment in (write lock). Returns it; None when nothing was installed (its
    inputs changed meanwhile, or every row it would hold is deleted: the inputs just go)."""
    assert job.built is not None and job.data is not None and job.files is not None
    replaced = {id(s) for s in job.replaces}
    if sum(1 for s in state.segments if id(s) in replaced) != len(job.replaces):
        job.built.discard()
        return None
    # Rows of the inputs deleted while the job ran are deleted in the new segment too.
    dead = np.concatenate([s.dead[rows] for s, rows in job.sources])
    before = 0
    for s in state.segments:
        if id(s) in replaced:
            break
        before += 1
    rest = [s for s in state.segments if id(s) not in replaced]
    sealed = None
    if len(job.data) and job.backend is not None:
        job.built.place()
        sealed = _sealed(state, job, config, dead)
        rest.insert(before, sealed)
    else:
        job.built.discard()
    state.segments[:] = rest
    return sealed


def _sealed(state: IndexState, job: SegmentJob, config: BackendConfig, dead: np.ndarray) -> SealedSegment:
    assert (
        job.built is not None and job.data is not None and job.files is not None and job.backend is not None
    )
    data = job.data
    vectors = np.load(job.built.final / "vectors.npy", mmap_mode="r", allow_pickle=False)
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in data.payloads], out=offsets[1:])
    payloads = job.built.final / "payloads.bin"
    stored = StoredRows(vectors, data.chunks, data.docno, data.names, data.buckets, offsets, payloads)
    if job.sid is None:
        job.sid = state.next_sid
        state.next_sid += 1
    # An exact segment scores the memory-mapped file, not the RAM copy it was written from.
    backend = FlatBackend(config, vectors) if job.backend.exact else job.backend
    assert job.nums is not None
    sealed = SealedSegment(job.sid, stored, job.nums, backend, job.files, dead)
    # Its bitmap is written by the next checkpoint (its inputs' bitmaps do not fit it).
    sealed.persisted_dead_version = -1 if sealed.dead_count else 0
    return sealed


# ----- merging checkpoint files -----


@dataclass
class PartsJob:
    segment: GrowingSegment
    start: int
    end: int
    parts: list[Part]
    merged: Part | None = None
    built: Built | None = None


def prepare_parts_merge(state: IndexState) -> PartsJob | None:
    segment = state.growing
    plan = merge_plan([p.end - p.start for p in segment.parts])
    if plan is None:
        return None
    return PartsJob(segment, plan[0], plan[1], segment.parts[plan[0] : plan[1]])


def build_parts_merge(root: Path, job: PartsJob, dimension: int) -> None:
    stored = [read_rows(root, p.files, dimension, mmap=True) for p in job.parts]
    names: list[str] = []
    docno = []
    for rows in stored:
        docno.append(rows.docno + len(names))
        names += rows.names
    data = RowData(
        np.concatenate([np.asarray(r.vectors) for r in stored]),
        np.concatenate([r.chunks for r in stored]),
        np.concatenate(docno).astype(np.int32),
        names,
        np.concatenate([r.buckets for r in stored]),
        [blob for r in stored for blob in r.payload_blobs()],
    )
    start, end = job.parts[0].start, job.parts[-1].end
    built = _new_dir(root, MERGED, f"rows-{job.segment.sid}-{start}-{end}-{uuid.uuid4().hex[:8]}")
    try:
        job.merged = Part(start, end, write_rows(built.tmp, data, built.rel))
        fsync_dir(built.tmp)
    except BaseException:
        built.discard()
        raise
    job.built = built


def install_parts_merge(state: IndexState, job: PartsJob, root: Path) -> bool:
    assert job.built is not None and job.merged is not None
    segment = job.segment
    if not any(s is segment for s in state.segments) or segment.parts[job.start : job.end] != job.parts:
        job.built.discard()
        return False
    job.built.place()
    segment.parts[job.start : job.end] = [job.merged]
    segment.spill_payloads(job.merged, root)
    return True


@dataclass
class RunsJob:
    start: int
    end: int
    runs: list[FileRef]
    merged: FileRef | None = None
    built: Built | None = None


def prepare_runs_merge(state: IndexState) -> RunsJob | None:
    plan = merge_plan([max(1, r.size) for r in state.doc_runs])
    if plan is None:
        return None
    return RunsJob(plan[0], plan[1], state.doc_runs[plan[0] : plan[1]])


def build_runs_merge(root: Path, job: RunsJob) -> None:
    records = merge_runs(root, job.runs, drop_forgotten=job.start == 0)
    built = _new_dir(root, MERGED, f"docs-{uuid.uuid4().hex[:8]}")
    try:
        write_run(built.tmp / "docs.jsonl", records)
        job.merged = ref_of(built.tmp / "docs.jsonl", f"{built.rel}/docs.jsonl")
        fsync_dir(built.tmp)
    except BaseException:
        built.discard()
        raise
    job.built = built


def install_runs_merge(state: IndexState, job: RunsJob) -> bool:
    assert job.built is not None and job.merged is not None
    if state.doc_runs[job.start : job.end] != job.runs:
        job.built.discard()
        return False
    job.built.place()
    state.doc_runs[job.start : job.end] = [job.merged]
    return True
