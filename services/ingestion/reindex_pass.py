"""The build phase of a reindex, page by page (services/ingestion/reindex.py): a *pass* walks the
serving generation and the one being built side by side in doc id order, one bounded page per
``ReindexCollection`` call, from a cursor (keyset pagination over the ingestion API's status
index: a call costs its page, not the collection).

On a page, a document whose rows already say it is done (indexed in both generations at the
same version, described alike) or that needs nothing (deleted in both, failed in the serving
one, still settling there) is counted from its rows alone; only the others (to copy, to delete,
failed in the new generation) are read from the status bucket and planned with ``plan_build``,
at most ``reindex_batch_documents`` of them per page.

The new generation is complete when one whole pass found nothing to do and neither generation
changed while it walked them (the index's change counters): what a single look at every
document said before, spread over calls. Progress between passes is estimated from the pass
under way and the previous one (``Walk.estimate``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from services.ingestion.events import DELETE_TARGET
from services.ingestion.lifecycle.machine import DELETED, INDEXED, PENDING_STATES
from services.ingestion.lifecycle.requests import PREPARATION_VERSION
from services.ingestion.lifecycle.rows import Row

# Rows of each generation read per page: a page of documents that need nothing is cheap.
SCAN_ROWS = 2000


@dataclass(frozen=True)
class Tally:
    """What a page (or a pass so far) found: serving documents to carry, those indexed at the
    same version in the new generation, those waiting, those failed there, and the submissions
    made (copies and deletes)."""

    documents: int = 0
    indexed: int = 0
    pending: int = 0
    failed: int = 0
    work: int = 0

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.documents + other.documents,
            self.indexed + other.indexed,
            self.pending + other.pending,
            self.failed + other.failed,
            self.work + other.work,
        )

    def __sub__(self, other: Tally) -> Tally:
        return Tally(
            self.documents - other.documents,
            self.indexed - other.indexed,
            self.pending - other.pending,
            self.failed - other.failed,
            self.work - other.work,
        )

    @property
    def complete(self) -> bool:
        """Nothing waits, nothing failed, nothing was submitted, everything is indexed."""
        return self.pending == 0 and self.failed == 0 and self.work == 0 and self.indexed == self.documents


@dataclass
class Walk:
    """A pass over one generation pair: the cursor, what the pages so far found, the running
    tally at each page's end (for estimates), and the change counters when it began."""

    changes_at_start: int
    after: str = ""
    found: Tally = field(default_factory=Tally)
    ends: list[str] = field(default_factory=list)
    running: list[Tally] = field(default_factory=list)
    previous: Walk | None = None

    def record(self, end: str | None, page: Tally) -> None:
        self.found = self.found + page
        if end is not None:
            self.after = end
            self.ends.append(end)
            self.running.append(self.found)

    def before(self, cursor: str) -> Tally:
        """The running tally of this (complete) pass at the last page that ended by ``cursor``."""
        at = bisect.bisect_right(self.ends, cursor)
        return self.running[at - 1] if at else Tally()

    def estimate(self, serving_indexed: int) -> Tally:
        """Where the whole pair stands: this pass's pages, and for what it has not walked yet the
        previous pass's finding there (the first pass counts it as waiting)."""
        if self.previous is not None:
            ahead = self.previous.found - self.previous.before(self.after)
            return self.found + ahead
        unseen = max(0, serving_indexed - self.found.documents)
        return replace(
            self.found, documents=self.found.documents + unseen, pending=self.found.pending + unseen
        )

    def next_pass(self, changes_now: int) -> Walk:
        return Walk(
            changes_now,
            previous=Walk(self.changes_at_start, found=self.found, ends=self.ends, running=self.running),
        )


@dataclass
class Page:
    """Rows of both generations in (after, end] (end None: to the last one), the tally of the
    rows that decided themselves, and the doc ids to read and plan."""

    end: str | None
    tally: Tally
    to_plan: list[str]
    serving: dict[str, Row]
    building: dict[str, Row]


def done_in_both(source: Row, target: Row | None) -> bool:
    """The serving generation's indexed version is indexed in the new one, described alike
    (``requests.unneeded`` would say UNCHANGED)."""
    return (
        target is not None
        and source.state == INDEXED
        and source.op == "upsert"
        and target.state == INDEXED
        and target.target_sha256 == source.target_sha256
        and target.indexed_sha256 == source.target_sha256
        and target.indexed_version == PREPARATION_VERSION
        and bool(source.source_digest)
        and target.source_digest == source.source_digest
    )


def row_tally(source: Row | None, target: Row | None) -> Tally | None:
    """The tally of a document its rows decide (None: it must be read and planned)."""
    if source is not None:
        if source.state in PENDING_STATES:
            return Tally(pending=1)  # settling in the serving generation: the next pass looks again
        if done_in_both(source, target):
            return Tally(documents=1, indexed=1)
        if source.state != INDEXED and (source.state != DELETED or target is None or target.state == DELETED):
            return Tally()  # failed there (kept wherever it stands), or deleted in both
        return None
    if target is None or target.state == DELETED:
        return Tally()
    if target.state in PENDING_STATES and target.target_sha256 == DELETE_TARGET:
        return Tally(pending=1)  # its delete is on its way
    return None


def _merged(source: list[Row], target: list[Row], end: str | None) -> Iterator[str]:
    ids = {row.doc_id for row in source} | {row.doc_id for row in target}
    return iter(sorted(doc_id for doc_id in ids if end is None or doc_id <= end))


def page_bounds(source: list[Row], target: list[Row], scan: int) -> str | None:
    """Where a page that read ``scan`` rows of each generation ends: at the nearer of the two
    last rows read when more may follow (None: both generations are read to their end)."""
    ends = [rows[-1].doc_id for rows in (source, target) if len(rows) >= scan]
    return min(ends) if ends else None


def make_page(source: list[Row], target: list[Row], scan: int, batch: int) -> Page:
    """The page over the rows read: decided rows tallied, at most ``batch`` to plan (the page
    ends at the last of those when there are more)."""
    end = page_bounds(source, target, scan)
    serving = {row.doc_id: row for row in source}
    building = {row.doc_id: row for row in target}
    tally, to_plan = Tally(), []
    for doc_id in _merged(source, target, end):
        decided = row_tally(serving.get(doc_id), building.get(doc_id))
        if decided is not None:
            tally = tally + decided
            continue
        to_plan.append(doc_id)
        if len(to_plan) >= batch:
            end = doc_id
            break
    return Page(end, tally, to_plan, serving, building)
