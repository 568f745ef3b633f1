"""The ingestion API's status index (``lifecycle.index.StatusIndex``): keyset pages in doc id
order, folder listings, exact counts kept by triggers, revision-gated changes, tombstones, the
changes counter, what survives a reopen and what a reset empties, and what a page or a removal
costs. Properties and the follower: test_status_index_follow.py.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.ingestion.lifecycle.index import (
    INDEX_FILE,
    Change,
    CollectionCounts,
    IndexLocked,
    Removal,
    StatusIndex,
    prefix_upper,
)
from services.ingestion.lifecycle.machine import (
    DELETED,
    DELETING,
    FAILED,
    INDEXED,
    PROCESSING,
    QUEUED,
    STATES,
)
from services.ingestion.lifecycle.rows import Row
from services.ingestion.tests.status_rows import OTHER, C, all_rows, expected_counts, make_row, removal


@pytest.fixture
def index() -> Iterator[StatusIndex]:
    opened = StatusIndex(None)
    yield opened
    opened.close()


# --- pages ---------------------------------------------------------------------------------------

# Ids whose code point order differs from naive expectations (case, accents, astral characters,
# prefixes of one another, characters SQL treats specially).
AWKWARD_IDS = ["A", "a", "a b", "a%", "a_", "aa", "a\u00ff", "é", "z", "\u4e2d", "\U0001f600", "x'y", "0"]


def test_pages_in_doc_id_order_cover_every_document_once(index: StatusIndex) -> None:
    ids = AWKWARD_IDS + [f"doc-{i:04d}" for i in range(300)]
    shuffled = ids[:]
    random.Random(7).shuffle(shuffled)
    states = [QUEUED, PROCESSING, INDEXED, FAILED, DELETING, DELETED]
    rows = [make_row(d, i + 1, state=states[i % len(states)]) for i, d in enumerate(shuffled)]
    # Batches of several sizes, and a second collection on both sides of the first in key order.
    index.apply(rows[:5])
    index.apply(rows[5:200])
    index.apply(rows[200:])
    index.apply([make_row(d, 1000 + i, collection=OTHER) for i, d in enumerate(ids[:50])])
    index.apply([make_row(d, 2000 + i, collection="b") for i, d in enumerate(ids[:50])])

    listed = sorted(d for d, r in zip(shuffled, rows, strict=True) if r.state != DELETED)
    for limit in (1, 7, 100, len(ids) + 5):
        seen: list[str] = []
        after = ""
        pages = 0
        while True:
            page, more = index.documents(C, "", after, limit)
            pages += 1
            assert len(page) <= limit
            assert all(r.collection == C and r.state != DELETED for r in page)
            seen += [r.doc_id for r in page]
            if not more:
                break
            assert len(page) == limit
            after = page[-1].doc_id
        assert seen == listed, f"limit {limit}"
        assert pages == max(1, -(-len(listed) // limit)), f"limit {limit}"

    # rows_after: every state, the same order.
    everything = [r.doc_id for r in all_rows(index)]
    assert everything == sorted(ids)
    # A page after the last id is empty, and says so.
    assert index.documents(C, "", listed[-1], 10) == ([], False)


def test_a_page_holds_the_rows_as_applied(index: StatusIndex) -> None:
    row = make_row("d", 3, state=FAILED, chunks=9, source_uri="s/u")
    row = replace(row, op="delete", source_digest="dig", indexed_version=4)
    index.apply([row])
    assert index.documents(C, "", "", 10) == ([row], False)
    assert index.rows_after(C, "", 10) == [row]


# --- counts -------------------------------------------------------------------------------------


def test_counts_exact_after_inserts_state_changes_and_removals(index: StatusIndex) -> None:
    model: dict[str, Row] = {}
    rng = random.Random(11)
    revision = 0

    def check() -> None:
        rows = sorted(model.values(), key=lambda r: r.doc_id)
        assert index.counts(C) == expected_counts(rows)
        assert index.recount(C) == index.counts(C)
        assert all_rows(index) == rows
        assert index.collections() == ([C] if rows else [])

    assert index.counts(C) is None
    for _round in range(12):
        changes: list[Change] = []
        for _ in range(rng.randint(1, 40)):
            revision += 1
            doc_id = f"d{rng.randint(0, 30)}"
            if doc_id in model and rng.random() < 0.25:
                changes.append(removal(doc_id, revision))
            else:
                changes.append(make_row(doc_id, revision, rng.choice(STATES), rng.randint(0, 50)))
        index.apply(changes)
        for change in changes:  # in order: the model of the bucket
            if isinstance(change, Removal):
                model = {d: r for d, r in model.items() if r.key != change.key}
            else:
                model[change.doc_id] = change
        check()

    # Every document removed: no counts, no collection.
    revision += 1
    index.apply([removal(d, revision) for d in list(model)])
    model = {}
    check()
    assert index.counts(C) is None
    assert index.changes(C) > 0


def test_counts_are_per_collection_and_chunks_count_indexed_only(index: StatusIndex) -> None:
    index.apply(
        [
            make_row("a", 1, INDEXED, 5),
            make_row("b", 2, FAILED, 7),
            make_row("c", 3, INDEXED, 11),
            make_row("a", 4, INDEXED, 100, collection=OTHER),
        ]
    )
    counts = index.counts(C)
    assert counts is not None
    assert counts.chunks == 16
    assert counts.by_state == {QUEUED: 0, PROCESSING: 0, INDEXED: 2, FAILED: 1, DELETING: 0, DELETED: 0}
    other = index.counts(OTHER)
    assert other is not None and other.chunks == 100 and other.by_state[INDEXED] == 1
    # Reindexed with fewer chunks, then failed: its chunks leave the indexed total.
    index.apply([make_row("c", 5, INDEXED, 2)])
    assert index.counts(C) == CollectionCounts({**counts.by_state}, 7)
    index.apply([make_row("c", 6, FAILED, 2)])
    assert index.counts(C) == CollectionCounts({**counts.by_state, INDEXED: 1, FAILED: 2}, 5)
    assert index.collections() == [C, OTHER]
    assert index.counts("nothing") is None


# --- revisions ----------------------------------------------------------------------------------


def test_an_older_revision_never_replaces_a_newer_one(index: StatusIndex) -> None:
    old, new = make_row("d", 3, QUEUED, 0), make_row("d", 8, INDEXED, 4)
    index.apply([new])
    changes = index.changes(C)
    index.apply([old])
    index.apply([new])  # again
    index.apply([old, new, old])
    assert all_rows(index) == [new]
    assert index.counts(C) == expected_counts([new])
    assert index.recount(C) == index.counts(C)
    # Neither the stale row nor the repeated one changed anything.
    assert index.changes(C) == changes

    other = StatusIndex(None)
    try:
        other.apply([old])
        other.apply([new])
        other.apply([old])
        assert all_rows(other) == [new]
        assert other.counts(C) == index.counts(C)
    finally:
        other.close()


def test_same_revision_applied_again_changes_nothing(index: StatusIndex) -> None:
    first = make_row("d", 5, QUEUED)
    index.apply([first])
    # Another body at the same revision (cannot happen in the bucket): the first one stays.
    index.apply([replace(first, state=FAILED)])
    assert all_rows(index) == [first]
    assert index.changes(C) == 1


def test_a_removal_outranks_older_revisions_only(index: StatusIndex) -> None:
    index.apply([make_row("gone", 2), make_row("kept", 3), make_row("rewritten", 4)])
    index.apply([removal("gone", 5), removal("kept", 1)])
    assert [r.doc_id for r in all_rows(index)] == ["kept", "rewritten"]
    # Written again after its removal (a newer revision): the removal does not take it.
    index.apply([make_row("rewritten", 9, FAILED)])
    index.apply([removal("rewritten", 6)])
    assert [(r.doc_id, r.revision) for r in all_rows(index)] == [("kept", 3), ("rewritten", 9)]
    # A removal of a key never seen, or repeated, is harmless.
    index.apply([removal("never", 10), removal("gone", 5)])
    assert index.counts(C) == expected_counts(all_rows(index))


@pytest.mark.parametrize("order", ["row-first", "removal-first"])
def test_a_removal_and_an_older_row_in_one_batch(index: StatusIndex, order: str) -> None:
    changes: list[Change] = [make_row("d", 3), removal("d", 7)]
    index.apply(changes if order == "row-first" else changes[::-1])
    assert all_rows(index) == []
    assert index.counts(C) is None


def test_an_older_row_after_a_removal_in_another_batch_stays_removed(index: StatusIndex) -> None:
    index.apply([make_row("d", 3)])
    index.apply([removal("d", 7)])
    index.apply([make_row("d", 3)])
    assert all_rows(index) == []


# --- the changes counter -------------------------------------------------------------------------


def test_changes_bump_on_every_row_change_per_collection(index: StatusIndex) -> None:
    assert index.changes(C) == 0
    index.apply([make_row("a", 1), make_row("b", 2)])
    assert index.changes(C) == 2
    index.apply([make_row("a", 3, FAILED)])  # state change
    assert index.changes(C) == 3
    index.apply([make_row("a", 4, FAILED)])  # same state, newer revision: still a change
    assert index.changes(C) == 4
    index.apply([make_row("x", 5, collection=OTHER)])
    assert (index.changes(C), index.changes(OTHER)) == (4, 1)
    index.apply([removal("b", 6)])
    assert index.changes(C) == 5
    # Changes that change nothing do not count.
    index.apply([make_row("a", 2), removal("b", 7), removal("a", 1)])
    assert index.changes(C) == 5
    # A document added after the collection emptied still counts on.
    index.apply([removal("a", 8)])
    assert index.counts(C) is None
    index.apply([make_row("c", 9)])
    assert index.changes(C) == 7


# --- persistence -------------------------------------------------------------------------------


def test_reopening_keeps_rows_counts_identity_and_sequence(tmp_path: Path) -> None:
    directory = tmp_path / "idx"
    first = StatusIndex(directory)
    first.reset("gen-1")
    rows = [make_row(f"d{i:03d}", i + 1, STATES[i % 6], i) for i in range(120)]
    first.apply(rows[:60], applied_sequence=60)
    first.apply(rows[60:], applied_sequence=120)
    first.apply([removal("d005", 121)], applied_sequence=121)
    before = (all_rows(first), first.counts(C), first.changes(C))
    first.close()

    again = StatusIndex(directory)
    try:
        assert again.identity == "gen-1"
        assert again.applied_sequence == 121
        assert (all_rows(again), again.counts(C), again.changes(C)) == before
        assert len(before[0]) == 119
        # An apply without a sequence (the API's own write) leaves the sequence where it was.
        again.apply([make_row("new", 500)])
        assert again.applied_sequence == 121
    finally:
        again.close()


def test_a_second_opener_of_the_directory_is_refused(tmp_path: Path) -> None:
    first = StatusIndex(tmp_path)
    try:
        with pytest.raises(IndexLocked):
            StatusIndex(tmp_path)
    finally:
        first.close()
    StatusIndex(tmp_path).close()  # released by close


def test_reset_for_another_bucket_empties_the_index(tmp_path: Path) -> None:
    index = StatusIndex(tmp_path)
    try:
        index.reset("gen-1")
        index.apply([make_row("a", 1), make_row("b", 2, collection=OTHER)], applied_sequence=2)
        before = index.changes(C)
        index.reset("gen-2")
        assert index.identity == "gen-2"
        assert index.applied_sequence == 0
        assert all_rows(index) == [] and all_rows(index, OTHER) == []
        assert index.counts(C) is None and index.collections() == []
        # The changes counter only grows, across a rebuild too: a reindex pass sees it as a change.
        assert index.changes(C) > before
        # It works as before after the reset (the triggers came back with the tables).
        index.apply([make_row("c", 1, INDEXED, 3)], applied_sequence=1)
        assert index.counts(C) == expected_counts([make_row("c", 1, INDEXED, 3)])
        assert index.recount(C) == index.counts(C)
    finally:
        index.close()
    reopened = StatusIndex(tmp_path)
    try:
        assert (reopened.identity, reopened.applied_sequence) == ("gen-2", 1)
    finally:
        reopened.close()


def test_an_index_of_another_schema_or_unreadable_is_rebuilt_empty(tmp_path: Path) -> None:
    index = StatusIndex(tmp_path)
    index.reset("gen-1")
    index.apply([make_row("a", 1)], applied_sequence=1)
    index.close()
    db = sqlite3.connect(tmp_path / INDEX_FILE)
    db.execute("UPDATE meta SET value = '0' WHERE name = 'schema'")
    db.commit()
    db.close()
    index = StatusIndex(tmp_path)
    assert (index.identity, index.applied_sequence, all_rows(index)) == ("", 0, [])
    index.apply([make_row("b", 1)], applied_sequence=1)
    index.close()

    (tmp_path / INDEX_FILE).write_bytes(b"not a database" * 512)
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"{INDEX_FILE}{suffix}").unlink(missing_ok=True)
    index = StatusIndex(tmp_path)
    try:
        assert (index.identity, index.applied_sequence, all_rows(index)) == ("", 0, [])
    finally:
        index.close()


# --- folders ------------------------------------------------------------------------------------

SOURCES = [
    "notes/a.md",
    "notes/b/c.md",
    "notes/b/d.md",
    "notes/\U0010ffff.md",
    "notes",
    "notesX/e.md",
    "note/f.md",
    "other/g.md",
    "",
]


def _folder_rows() -> list[Row]:
    rows = []
    for i, source in enumerate(SOURCES):
        for j in range(3):
            state = DELETED if (i + j) % 7 == 0 else INDEXED
            rows.append(make_row(f"{chr(ord('z') - j)}{i}", 10 * i + j + 1, state, source_uri=source))
    return rows


def test_folder_listing_in_doc_id_order(index: StatusIndex) -> None:
    rows = _folder_rows()
    index.apply(rows)
    index.apply([make_row("zz", 999, source_uri="notes/a.md", collection=OTHER)])
    for prefix in ("notes/", "notes/b/", "notes", "note", "x", ""):
        want = sorted(r.doc_id for r in rows if r.source_uri.startswith(prefix) and r.state != DELETED)
        seen: list[str] = []
        after = ""
        while True:
            page, more = index.documents(C, prefix, after, 2)
            seen += [r.doc_id for r in page]
            if not more:
                break
            after = page[-1].doc_id
        assert seen == want, prefix


def test_folder_listing_in_source_order(index: StatusIndex) -> None:
    rows = _folder_rows()
    index.apply(rows)
    index.apply([make_row("zz", 999, source_uri="notes/a.md", collection=OTHER)])
    for prefix in ("notes/", "notes/b/", "notes", "note", "x", ""):
        want = sorted(
            (r.source_uri, r.doc_id) for r in rows if r.source_uri.startswith(prefix) and r.state != DELETED
        )
        seen: list[tuple[str, str]] = []
        after = ("", "")
        while True:
            page, more = index.documents_by_source(C, prefix, after[0], after[1], 2)
            seen += [(r.source_uri, r.doc_id) for r in page]
            if not more:
                break
            after = (page[-1].source_uri, page[-1].doc_id)
        assert seen == want, prefix


def test_prefix_upper() -> None:
    assert prefix_upper("ab") == "ac"
    assert prefix_upper("a\U0010ffff") == "b"
    assert prefix_upper("\U0010ffff\U0010ffff") is None
    assert prefix_upper("\ud7ff") == "\ue000"  # past the surrogates
    for prefix in ("notes/", "a\u00ff", "\U0001f600"):
        upper = prefix_upper(prefix)
        assert upper is not None and upper > prefix
        assert upper > prefix + "\U0010ffff" * 3
        assert upper.encode() > (prefix + "\U0010ffff").encode()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sources=st.lists(st.text(alphabet="ab/\u00e9\U0010ffff", max_size=5), min_size=1, max_size=25),
    prefix=st.text(alphabet="ab/\u00e9\U0010ffff", max_size=3),
    limit=st.integers(1, 6),
)
def test_folder_listings_match_a_filter(sources: list[str], prefix: str, limit: int) -> None:
    index = StatusIndex(None)
    try:
        rows = [make_row(f"d{i:02d}", i + 1, source_uri=s) for i, s in enumerate(sources)]
        index.apply(rows)
        by_source: list[Row] = []
        after = ("", "")
        while True:
            page, more = index.documents_by_source(C, prefix, after[0], after[1], limit)
            by_source += page
            if not more:
                break
            after = (page[-1].source_uri, page[-1].doc_id)
        matching = [r for r in rows if r.source_uri.startswith(prefix)]
        assert by_source == sorted(matching, key=lambda r: (r.source_uri, r.doc_id))
        by_id, _more = index.documents(C, prefix, "", len(rows) + 1)
        assert by_id == sorted(matching, key=lambda r: r.doc_id)
    finally:
        index.close()


def vm_steps(index: StatusIndex, call: Callable[[], object]) -> int:
    """SQLite virtual machine steps (in hundreds) a call costs: a cost that does not depend on
    the machine's speed."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    index.db.set_progress_handler(count, 100)
    try:
        call()
    finally:
        index.db.set_progress_handler(None, 100)
    return steps


def test_a_folders_first_page_costs_its_page_not_what_sorts_before_it(index: StatusIndex) -> None:
    index.apply([make_row(f"a{i:05d}", i + 1, source_uri=f"a/{i:05d}") for i in range(5000)])
    index.apply([make_row(f"b{i}", 10_000 + i, source_uri=f"b/{i}") for i in range(20)])
    first = vm_steps(index, lambda: index.documents_by_source(C, "b/", "", "", 10))
    # The same page asked with the cursor at the folder's start: a range of the source index.
    at_prefix = vm_steps(index, lambda: index.documents_by_source(C, "b/", "b/", "", 10))
    assert index.documents_by_source(C, "b/", "", "", 10) == index.documents_by_source(C, "b/", "b/", "", 10)
    assert first <= 3 * at_prefix + 5, (first, at_prefix)


def test_a_removal_costs_the_same_whatever_the_collection_holds() -> None:
    small, large = StatusIndex(None), StatusIndex(None)
    try:
        small.apply([make_row(f"d{i:05d}", i + 1) for i in range(10)])
        large.apply([make_row(f"d{i:05d}", i + 1) for i in range(5000)])
        costs = [vm_steps(ix, lambda ix=ix: ix.apply([removal("d00005", 99_999)])) for ix in (small, large)]
        assert all_rows(large)[5].doc_id == "d00006"
        assert costs[1] <= 3 * costs[0] + 5, costs
    finally:
        small.close()
        large.close()
