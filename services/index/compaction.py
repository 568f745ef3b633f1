"""What background work a collection's segments and files call for, as pure decisions:

- **compaction**: sealed segments whose deleted share reached ``compact_deleted_ratio`` are
  rewritten without their deleted rows, merged with small ones (fewer live rows than half a
  segment), up to ``segment_max_rows``; past ``compact_max_segments`` sealed segments the two
  smallest neighbours are merged; a segment whose index type the policy no longer asks for is
  rebuilt;
- **merging files**: a checkpoint writes the growing segment's new rows and the changed document
  records as small files; once the newest ``FANOUT`` of them are of one size tier they are merged
  into one (an LSM's size-tiered merge: each row is rewritten a logarithmic number of times and
  the files stay few).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from services.index.records import IndexPolicy

# Files of one size tier merged at once; the tier of a file of n units is floor(log_FANOUT n).
FANOUT = 4
# Past this many files one merge takes them all, whatever their tiers.
MAX_FILES = 32


@dataclass(frozen=True)
class SegmentInfo:
    sid: int
    rows: int
    live: int
    kind: str

    @property
    def dead_share(self) -> float:
        return 1 - self.live / self.rows if self.rows else 0.0


def _wants_rewrite(s: SegmentInfo, policy: IndexPolicy) -> bool:
    return s.rows > 0 and s.dead_share >= policy.compact_deleted_ratio


def _small(s: SegmentInfo, policy: IndexPolicy) -> bool:
    return s.live < max(1, policy.segment_rows // 2)


def compaction_plan(sealed: list[SegmentInfo], policy: IndexPolicy) -> list[int] | None:
    """The sealed segments (ids, in order) to merge into one now, or None."""
    picked: list[SegmentInfo] = []
    total = 0
    for s in sealed:
        if (_wants_rewrite(s, policy) or _small(s, policy)) and total + s.live <= policy.segment_max_rows:
            picked.append(s)
            total += s.live
    if len(picked) > 1 or (picked and _wants_rewrite(picked[0], policy)):
        return [s.sid for s in picked]
    for s in sealed:
        if s.kind != policy.kind_for(s.rows):
            return [s.sid]  # the policy changed (index type, thresholds), or its index did not load
    if len(sealed) > policy.compact_max_segments:
        pairs = [(a.live + b.live, i) for i, (a, b) in enumerate(pairwise(sealed))]
        size, i = min(pairs)
        if size <= policy.segment_max_rows:
            return [sealed[i].sid, sealed[i + 1].sid]
    return None


def output_kind(sealed: list[SegmentInfo], plan: list[int], policy: IndexPolicy) -> str:
    live = sum(s.live for s in sealed if s.sid in plan)
    return policy.kind_for(live)


def tier(size: int) -> int:
    return int(math.log(max(size, 1), FANOUT))


def merge_plan(sizes: list[int]) -> tuple[int, int] | None:
    """The run [start, end) of consecutive files to merge into one, or None: the newest FANOUT
    files when they share a size tier (or every file past MAX_FILES)."""
    if len(sizes) > MAX_FILES:
        return (0, len(sizes))
    if len(sizes) < FANOUT:
        return None
    tiers = [tier(s) for s in sizes[-FANOUT:]]
    if len(set(tiers)) == 1:
        return (len(sizes) - FANOUT, len(sizes))
    return None
