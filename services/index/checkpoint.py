"""What a checkpoint takes from the state and gives back to it.

``capture`` (under the collection's write lock and state read lock) copies only what changed
since the last committed checkpoint: the rows the growing (and any frozen) segment gained, the
bitmaps of segments that had deletes, the records of documents that changed; the rest of the
manifest are refs to files already written. ``commit`` (write lock), once the checkpoint is
current, records those new files as persisted, so the next checkpoint writes only what changes
after. ``state_refs`` is every file the live state needs (pruning keeps them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.index.sealed import SealedSegment
from services.index.segment_files import FileRef
from services.index.segments import GrowingSegment, Segment
from services.index.snapshots import NewPart, SnapshotData, Written
from services.index.state import IndexState


@dataclass
class Capture:
    """The state a checkpoint copied, to mark persisted once it is committed."""

    segments: list[tuple[Segment, int]] = field(default_factory=list)  # (segment, dead_version)
    doc_counters: dict[str, int] = field(default_factory=dict)


def _entry(segment: Segment) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": segment.sid,
        "state": segment.state,
        "rows": segment.rows,
        "dead": segment.dead_count,
        "deleted": segment.bitmap_ref.to_json() if segment.bitmap_ref is not None else None,
    }
    if isinstance(segment, SealedSegment):
        entry["kind"] = segment.backend_kind
        entry["params"] = segment.backend().params
        entry["files"] = {name: ref.to_json() for name, ref in segment.files.items()}
    elif isinstance(segment, GrowingSegment):
        entry["parts"] = [p.to_json() for p in segment.parts]
    return entry


def capture(state: IndexState, header: dict[str, Any]) -> tuple[SnapshotData, Capture]:
    taken = Capture()
    entries = []
    frozen: list[NewPart] = []
    bitmaps = {}
    growing = state.growing
    for segment in state.segments:
        entries.append(_entry(segment))
        taken.segments.append((segment, segment.dead_version))
        if segment.bitmap_dirty:
            bitmaps[segment.sid] = segment.dead[: segment.rows].copy()
        if (
            isinstance(segment, GrowingSegment)
            and segment is not growing
            and segment.rows > segment.persisted_rows
        ):
            frozen.append(
                NewPart(
                    segment.sid,
                    segment.persisted_rows,
                    segment.row_data(segment.persisted_rows, segment.rows),
                )
            )
    new_rows = NewPart(
        growing.sid, growing.persisted_rows, growing.row_data(growing.persisted_rows, growing.rows)
    )
    records, taken.doc_counters = state.docs.changed_records()
    data = SnapshotData(
        header={**header, "next_segment": state.next_sid},
        segments=entries,
        growing=new_rows,
        frozen=frozen,
        bitmaps=bitmaps,
        doc_records=records,
        doc_runs=list(state.doc_runs),
    )
    return data, taken


def commit(state: IndexState, taken: Capture, written: Written, root: Path) -> None:
    """(Write lock and state write lock: the growing segment's payloads move to disk.)"""
    live = {id(s) for s in state.segments}
    for segment, version in taken.segments:
        if id(segment) not in live:
            continue  # sealed or compacted since: its successor is persisted on its own
        part = written.parts.get(segment.sid)
        if part is not None and isinstance(segment, GrowingSegment) and segment.persisted_rows == part.start:
            segment.parts.append(part)
            segment.persisted_rows = part.end
            segment.spill_payloads(part, root)
        bitmap = written.bitmaps.get(segment.sid)
        if bitmap is not None:
            segment.bitmap_ref = bitmap
            segment.persisted_dead_version = version
    if written.doc_run is not None:
        state.doc_runs.append(written.doc_run)
    state.docs.written(taken.doc_counters)


def state_refs(state: IndexState) -> list[FileRef]:
    """Every file the state in memory stands on (what the next checkpoint will name)."""
    refs = list(state.doc_runs)
    for segment in state.segments:
        if segment.bitmap_ref is not None:
            refs.append(segment.bitmap_ref)
        if isinstance(segment, SealedSegment):
            refs += segment.files.values()
        elif isinstance(segment, GrowingSegment):
            refs += [ref for part in segment.parts for ref in part.files.values()]
    return refs
