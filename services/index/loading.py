"""Bringing a collection's state back from its current checkpoint: the document records, then
each segment of the manifest (sealed ones from their files, their vectors memory-mapped; the
growing and frozen ones from their checkpoint parts, into RAM), the deleted bitmaps, each
document's live rows counted. A format 1 snapshot (before segments) is re-added row by row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from services.index import mutations as mut
from services.index.docs import DocTable, read_run
from services.index.legacy import LegacySnapshot
from services.index.records import IndexPolicy
from services.index.sealed import SealedSegment
from services.index.segment_files import FileRef, read_bitmap, read_rows
from services.index.segments import FROZEN, GROWING, SEALED, GrowingSegment, Part, Segment
from services.index.snapshots import verify_manifest
from services.index.state import IndexState

# Legacy snapshots are re-added in batches of this many rows.
_LEGACY_BATCH = 1024


def _growing(root: Path, entry: dict[str, Any], policy: IndexPolicy, docs: DocTable) -> GrowingSegment:
    rows = int(entry["rows"])
    segment = GrowingSegment(int(entry["id"]), policy.dimension, max(policy.segment_rows, rows))
    parts = [Part.from_json(p) for p in entry.get("parts", [])]
    for part in parts:
        stored = read_rows(root, part.files, policy.dimension, mmap=False)
        names = [stored.names[i] for i in stored.docno.tolist()]
        segment.append(
            stored.chunks,
            [docs.ensure(n).num for n in names],
            names,
            stored.vectors,
            stored.buckets,
            (stored.payload_path, stored.payload_offsets),
        )
    if segment.rows != rows:
        raise ValueError(f"segment {segment.sid}: its parts hold {segment.rows} rows, the manifest {rows}")
    segment.parts = parts
    segment.persisted_rows = rows
    if entry["state"] == FROZEN:
        segment.freeze()
    return segment


def _count_live(segment: Segment, docs: DocTable) -> None:
    live = ~segment.dead[: segment.rows]
    counts = np.bincount(segment.docno[: segment.rows][live], minlength=len(segment.doc_numbers()))
    for local in np.nonzero(counts)[0].tolist():
        docs.ensure(segment.doc_name(local)).live += int(counts[local])


def load_state(root: Path, manifest: dict[str, Any], policy: IndexPolicy) -> IndexState:
    """The state a (format 2) manifest describes, every file it names checked first."""
    verify_manifest(root, manifest)
    state = IndexState(policy)
    docs = state.docs
    state.doc_runs = [FileRef.from_json(r) for r in manifest.get("doc_runs", [])]
    for ref in state.doc_runs:
        for doc_id, fence, source in read_run(root, ref):
            docs.apply_record(doc_id, fence, source)
    segments: list[Segment] = []
    config = policy.backend_config()
    for entry in manifest["segments"]:
        bitmap = FileRef.from_json(entry["deleted"]) if entry.get("deleted") else None
        dead = read_bitmap(root, bitmap, int(entry["rows"]))
        segment: Segment
        if entry["state"] == SEALED:
            segment = SealedSegment.open(
                root, int(entry["id"]), entry, config, lambda n: docs.ensure(n).num, dead
            )
        elif entry["state"] in (GROWING, FROZEN):
            segment = _growing(root, entry, policy, docs)
            segment.mark_dead(np.nonzero(dead)[0])
        else:
            raise ValueError(f"segment {entry['id']} in unknown state {entry['state']!r}")
        segment.bitmap_ref = bitmap
        segment.persisted_dead_version = segment.dead_version
        _count_live(segment, docs)
        segments.append(segment)
    state.segments = segments
    state.next_sid = int(manifest["next_segment"])
    if not segments or segments[-1].state != GROWING:
        state.new_growing()
    docs.settle()
    return state


def legacy_state(snap: LegacySnapshot, policy: IndexPolicy) -> IndexState:
    """The state a format 1 snapshot holds, re-added in its order (replicas restoring the same
    snapshot freeze at the same rows)."""
    meta = snap.meta
    state = IndexState(policy)
    chunk_ids, doc_ids = list(meta["chunk_ids"]), list(meta["doc_ids"])
    raw_payloads = snap.payloads.get("chunks", {})
    for start in range(0, len(chunk_ids), _LEGACY_BATCH):
        ids = chunk_ids[start : start + _LEGACY_BATCH]
        payloads = [
            mut.Payload.from_json(raw_payloads[c]) if c in raw_payloads else mut.Payload() for c in ids
        ]
        state.add(
            mut.ChunkBatch(
                ids,
                doc_ids[start : start + _LEGACY_BATCH],
                snap.vectors[start : start + len(ids)],
                payloads if raw_payloads else [],
            )
        )
        state.maybe_freeze()
    state.apply_fences({str(d): int(f) for d, f in meta.get("fences", {}).items() if int(f)})
    for doc_id, raw in snap.payloads.get("sources", {}).items():
        live = state.docs.get(doc_id)
        if live is not None and live.live:
            state.docs.set_source(doc_id, mut.Source.from_json(raw))
    return state
