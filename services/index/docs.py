"""What a collection knows per document, beside its rows: its fence (kept after its chunks are
gone: a tombstone), its source (title, URI, metadata: only while it has chunks), how many live
rows it has, and a global number the segments' numpy lookups use.

Persistence: a checkpoint writes the records of the documents that changed since the previous
one as JSON lines (``[doc_id, fence, source or null]``) in a *run*; loading replays the runs in
order (a later record wins; ``[doc_id, 0, null]`` forgets a document). Background merges fold
runs together (compaction.py), so their number stays small.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshkit.domain.metadata import MetadataIndex
from services.index import mutations as mut
from services.index.segment_files import FileRef, verify, write_file


@dataclass(slots=True)
class DocState:
    num: int
    fence: int = 0
    source: mut.Source | None = None
    live: int = 0


DocRecord = tuple[str, int, "mut.Source | None"]


class DocTable:
    """doc id -> DocState, the metadata index of the sources, and which records changed."""

    def __init__(self) -> None:
        self.docs: dict[str, DocState] = {}
        # Keyed by document number: a filter's documents go to numpy without a lookup each.
        self.metadata: MetadataIndex[int] = MetadataIndex()
        self.with_chunks = 0
        self._next_num = 0
        # doc id -> change counter: records a checkpoint must write.
        self.changed: dict[str, int] = {}
        self._changes = 0

    def __len__(self) -> int:
        return len(self.docs)

    def get(self, doc_id: str) -> DocState | None:
        return self.docs.get(doc_id)

    def ensure(self, doc_id: str) -> DocState:
        state = self.docs.get(doc_id)
        if state is None:
            state = self.docs[doc_id] = DocState(self._next_num)
            self._next_num += 1
        return state

    def fence(self, doc_id: str) -> int:
        state = self.docs.get(doc_id)
        return state.fence if state is not None else 0

    def source(self, doc_id: str) -> mut.Source | None:
        state = self.docs.get(doc_id)
        return state.source if state is not None else None

    def _touch(self, doc_id: str) -> None:
        self._changes += 1
        self.changed[doc_id] = self._changes

    # ----- changes (under the collection's state write lock) -----

    def add_live(self, doc_id: str, n: int) -> DocState:
        state = self.ensure(doc_id)
        if not state.live and n:
            self.with_chunks += 1
        state.live += n
        return state

    def remove_live(self, doc_id: str, n: int) -> None:
        """``n`` rows of the document were deleted; one without rows has no source either, and
        is forgotten unless it has a fence."""
        state = self.docs[doc_id]
        state.live -= n
        if state.live:
            return
        self.with_chunks -= 1
        if state.source is not None:
            state.source = None
            self.metadata.remove(state.num)
            self._touch(doc_id)
        if not state.fence:
            del self.docs[doc_id]

    def set_source(self, doc_id: str, source: mut.Source) -> None:
        state = self.ensure(doc_id)
        if state.source != source:
            state.source = source
            self.metadata.put(state.num, dict(source.metadata))
            self._touch(doc_id)

    def set_fence(self, doc_id: str, fence: int) -> None:
        self.ensure(doc_id).fence = fence
        self._touch(doc_id)

    # ----- records -----

    def record(self, doc_id: str) -> DocRecord:
        state = self.docs.get(doc_id)
        if state is None:
            return (doc_id, 0, None)
        return (doc_id, state.fence, state.source)

    def changed_records(self) -> tuple[list[DocRecord], dict[str, int]]:
        """The records to write now, and the counters they were taken at."""
        return [self.record(d) for d in sorted(self.changed)], dict(self.changed)

    def written(self, counters: dict[str, int]) -> None:
        """A checkpoint holding the records taken at ``counters`` is committed."""
        for doc_id, counter in counters.items():
            if self.changed.get(doc_id) == counter:
                del self.changed[doc_id]

    def all_records(self) -> list[DocRecord]:
        """Every document with a fence or a source (what a merge of every run holds)."""
        return [self.record(d) for d, s in sorted(self.docs.items()) if s.fence or s.source is not None]

    def apply_record(self, doc_id: str, fence: int, source: mut.Source | None) -> None:
        """Loading: the record of a run (later runs win)."""
        if not fence and source is None:
            state = self.docs.get(doc_id)
            if state is not None:
                state.fence, state.source = 0, None
            return
        state = self.ensure(doc_id)
        state.fence, state.source = fence, source

    def settle(self) -> None:
        """After loading runs and segments: documents without rows lose their source, those
        with neither rows nor fence are dropped; the metadata index is built."""
        for doc_id in list(self.docs):
            state = self.docs[doc_id]
            if not state.live:
                state.source = None
                if not state.fence:
                    del self.docs[doc_id]
                    continue
            if state.source is not None and state.source.metadata:
                self.metadata.put(state.num, dict(state.source.metadata))
        self.with_chunks = sum(1 for s in self.docs.values() if s.live)

    def live_numbers(self) -> list[int]:
        """The numbers of the documents with chunks."""
        return [s.num for s in self.docs.values() if s.live]


# ----- runs -----


def encode_records(records: Iterable[DocRecord]) -> bytes:
    lines = [
        json.dumps([d, f, s.to_json() if s is not None else None], separators=(",", ":"), ensure_ascii=False)
        for d, f, s in records
    ]
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def write_run(path: Path, records: Iterable[DocRecord]) -> None:
    write_file(path, encode_records(records))


def read_run(root: Path, ref: FileRef) -> Iterator[DocRecord]:
    for line in verify(root, ref).read_bytes().decode("utf-8").splitlines():
        if line:
            raw: list[Any] = json.loads(line)
            doc_id, fence, source = raw
            yield str(doc_id), int(fence), mut.Source.from_json(source) if source is not None else None


def merge_runs(root: Path, refs: list[FileRef], drop_forgotten: bool) -> list[DocRecord]:
    """The records of ``refs`` folded (later wins); forgotten documents are left out when the
    merge starts at the oldest run (nothing older could hold a record they override)."""
    merged: dict[str, DocRecord] = {}
    for ref in refs:
        for record in read_run(root, ref):
            merged[record[0]] = record
    records = [merged[d] for d in sorted(merged)]
    if drop_forgotten:
        records = [r for r in records if r[1] or r[2] is not None]
    return records
