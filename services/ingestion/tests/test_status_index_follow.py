"""The status index in any order and repetition (hypothesis), the two ways of making a row
(``rows.row_of`` and ``rows.row_from_entry``) giving the same row, and, against a real
nats-server, ``follow.IndexFollower`` catching up, following and rebuilding.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import linecache
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshkit.domain.ids import doc_key
from services.ingestion.events import IngestEvent
from services.ingestion.lifecycle.entries import DocStatus
from services.ingestion.lifecycle.index import (
    Change,
    Removal,
    StatusIndex,
)
from services.ingestion.lifecycle.machine import (
    DELETING,
    FAILED,
    INDEXED,
    QUEUED,
    STATES,
)
from services.ingestion.lifecycle.rows import Row, row_from_entry, row_of
from services.ingestion.tests.status_rows import C, all_rows, expected_counts, make_row, removal

# --- any order, any repetition ------------------------------------------------------------------

KEYS = [f"d{i}" for i in range(5)]


@st.composite
def histories(draw: st.DrawFn, removals: bool) -> list[Change]:
    """A bucket's history: changes of a few keys at increasing sequences (the revisions)."""
    steps = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 9)), min_size=1, max_size=30))
    changes: list[Change] = []
    for sequence, (doc_id, kind) in enumerate(steps, start=1):
        if removals and kind >= 8:
            changes.append(removal(doc_id, sequence))
        else:
            state = STATES[kind % len(STATES)]
            changes.append(make_row(doc_id, sequence, state, chunks=kind))
    return changes


def in_order(changes: list[Change]) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for change in changes:
        if isinstance(change, Removal):
            for doc_id in [d for d, r in rows.items() if r.key == change.key]:
                del rows[doc_id]
        elif change.collection == C:
            rows[change.doc_id] = change
    return rows


def applied(batches: list[list[Change]]) -> StatusIndex:
    index = StatusIndex(None)
    for batch in batches:
        index.apply(batch)
    return index


def assert_same_as_in_order(index: StatusIndex, changes: list[Change]) -> None:
    want = sorted(in_order(changes).values(), key=lambda r: r.doc_id)
    assert all_rows(index) == want
    assert index.counts(C) == expected_counts(want)
    assert index.recount(C) == index.counts(C)


def cut(items: list[Change], points: list[int]) -> list[list[Change]]:
    bounds = sorted({p % (len(items) + 1) for p in points} | {0, len(items)})
    return [items[a:b] for a, b in itertools.pairwise(bounds) if b > a]


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(
    changes=histories(removals=False),
    data=st.data(),
)
def test_rows_in_any_order_and_repetition_give_the_in_order_result(
    changes: list[Change], data: st.DataObject
) -> None:
    """The API's own writes and the watch: rows in any interleaving, any duplication, any
    batching end as the bucket's history in order does."""
    repeated = changes + data.draw(st.lists(st.sampled_from(changes), max_size=20), label="duplicates")
    shuffled = data.draw(st.permutations(repeated), label="order")
    points = data.draw(st.lists(st.integers(0, 100), max_size=8), label="batches")
    index = applied(cut(list(shuffled), points))
    try:
        assert_same_as_in_order(index, changes)
    finally:
        index.close()


@PROPERTY
@given(
    changes=histories(removals=True),
    data=st.data(),
)
def test_history_with_removals_in_any_batching_gives_the_in_order_result(
    changes: list[Change], data: st.DataObject
) -> None:
    """The watch's delivery: the history in stream order, cut into batches at any points, each
    batch in any order and with duplicates within it (one transaction each)."""
    points = data.draw(st.lists(st.integers(0, 100), max_size=8), label="batches")
    batches = []
    for batch in cut(changes, points):
        extra = data.draw(st.lists(st.sampled_from(batch), max_size=4), label="duplicates")
        batches.append(list(data.draw(st.permutations(batch + extra), label="order")))
    index = applied(batches)
    try:
        assert_same_as_in_order(index, changes)
    finally:
        index.close()


@PROPERTY
@given(changes=histories(removals=True), data=st.data())
def test_history_with_removals_in_any_order_in_one_batch_gives_the_in_order_result(
    changes: list[Change], data: st.DataObject
) -> None:
    repeated = changes + data.draw(st.lists(st.sampled_from(changes), max_size=10), label="duplicates")
    index = applied([list(data.draw(st.permutations(repeated), label="order"))])
    try:
        assert_same_as_in_order(index, changes)
    finally:
        index.close()


# --- rows from a decoded status and from its JSON -----------------------------------------------


def _statuses() -> list[DocStatus]:
    request = IngestEvent(
        op="upsert",
        collection=C,
        doc_id="notes/doc-1.md",
        content_sha256="c" * 64,
        object_key="objects/1",
        title="A title",
        source_uri="notes/a.md",
        metadata={"b": "2", "a": "1"},
        request_id="r1",
    )
    base = DocStatus(
        collection=C,
        doc_id="notes/doc-1.md",
        state=INDEXED,
        request=request,
        target_sha256="c" * 64,
        indexed_sha256="c" * 64,
        indexed_version=3,
        chunks=12,
        owner="w",
        fence=4,
    )
    return [
        base,
        replace(base, request=None, state=QUEUED, indexed_sha256="", chunks=0),
        replace(base, request=replace(request, op="delete", metadata={}, title=""), state=DELETING),
    ]


@pytest.mark.parametrize("status", _statuses())
def test_a_row_from_json_equals_the_row_of_the_decoded_status(status: DocStatus) -> None:
    key = doc_key(status.collection, status.doc_id)
    data = status.to_bytes()
    assert row_from_entry(key, 17, data) == row_of(key, 17, DocStatus.from_bytes(data))
    assert row_of(key, 17, status) == row_from_entry(key, 17, data)


def test_a_row_from_json_that_is_no_status_raises() -> None:
    for data in (b"[]", b'{"collection": "c"}', json.dumps({"collection": C, "doc_id": "d"}).encode()):
        with pytest.raises(ValueError):
            row_from_entry("c.k", 1, data)


# --- following a real status bucket ------------------------------------------------------------


async def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the index did not get there in time"
        await asyncio.sleep(0.02)


async def _subscribed(follower: Any) -> None:
    """Wait until the follower's subscription is set up (its task waits on ``_failed``).

    Works around a hang in ``IndexFollower.stop``: cancelled while ``_subscribe`` awaits
    nats-py (which swallows a CancelledError in its flush), the follow task carries on and then
    waits on ``_failed`` forever, and ``stop`` with it."""
    task = follower._tasks[0]
    deadline = time.monotonic() + 10
    while True:
        frames = task.get_stack(limit=1)
        if frames and "self._failed.wait()" in linecache.getline(
            frames[0].f_code.co_filename, frames[0].f_lineno
        ):
            return
        assert time.monotonic() < deadline, "the follower did not subscribe"
        await asyncio.sleep(0.01)


@pytest.mark.integration
async def test_the_follower_catches_up_follows_and_rebuilds(nats_url: str, tmp_path: Path) -> None:
    import nats
    from nats.js.api import KeyValueConfig, StorageType
    from nats.js.kv import KeyValue

    from services.ingestion.lifecycle.buckets import STATUS_BUCKET
    from services.ingestion.lifecycle.follow import IndexFollower, stream_of

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    config = KeyValueConfig(bucket=STATUS_BUCKET, history=1, storage=StorageType.FILE)
    # doc_id -> (revision, state, chunks): what the bucket holds.
    bucket: dict[str, tuple[int, str, int]] = {}

    async def put(kv: KeyValue, doc_id: str, state: str, chunks: int = 0) -> None:
        request = IngestEvent(op="upsert", collection=C, doc_id=doc_id, source_uri=f"src/{doc_id}")
        status = DocStatus(collection=C, doc_id=doc_id, state=state, request=request, chunks=chunks)
        revision = await kv.put(doc_key(C, doc_id), status.to_bytes())
        bucket[doc_id] = (int(revision), state, chunks)

    def indexed(index: StatusIndex) -> dict[str, tuple[int, str, int]]:
        return {r.doc_id: (r.revision, r.state, r.chunks) for r in all_rows(index)}

    index_dir = tmp_path / "index"
    follower: IndexFollower | None = None
    index: StatusIndex | None = None
    try:
        kv = await js.create_key_value(config)
        for i in range(40):
            await put(kv, f"d{i:02d}", QUEUED)
        for i in range(0, 40, 3):
            await put(kv, f"d{i:02d}", INDEXED, i)
        await kv.delete(doc_key(C, "d01"))
        del bucket["d01"]

        # Catching up from nothing.
        index = StatusIndex(index_dir)
        follower = IndexFollower(js, index)
        await follower.start()
        await asyncio.wait_for(follower.caught_up.wait(), 10)
        await _subscribed(follower)
        last = (await js.stream_info(stream_of(STATUS_BUCKET))).state.last_seq
        assert index.applied_sequence == last
        assert indexed(index) == bucket
        assert index.recount(C) == index.counts(C)
        assert all(r.source_uri == f"src/{r.doc_id}" for r in all_rows(index))

        # Following later writes.
        await put(kv, "d02", FAILED)
        await put(kv, "new", INDEXED, 5)
        await kv.delete(doc_key(C, "d04"))
        del bucket["d04"]
        await kv.purge(doc_key(C, "d05"))
        del bucket["d05"]
        await _eventually(lambda: indexed(index) == bucket)
        last = (await js.stream_info(stream_of(STATUS_BUCKET))).state.last_seq
        await _eventually(lambda: index.applied_sequence == last)
        assert index.recount(C) == index.counts(C)
        await follower.stop()
        index.close()

        # A restart resumes from its sequence: nothing applied again.
        index = StatusIndex(index_dir)
        changes, identity = index.changes(C), index.identity
        follower = IndexFollower(js, index)
        await follower.start()
        await asyncio.wait_for(follower.caught_up.wait(), 10)
        await _subscribed(follower)
        await put(kv, "after-restart", QUEUED)
        await _eventually(lambda: indexed(index) == bucket)
        assert index.identity == identity
        assert index.changes(C) == changes + 1
        await follower.stop()
        index.close()

        # The stream created again (a server that lost its data), this time with more entries
        # than the index applied: the identity alone tells the generations apart.
        applied = StatusIndex(index_dir)
        old_sequence = applied.applied_sequence
        applied.close()
        await js.delete_key_value(STATUS_BUCKET)
        kv = await js.create_key_value(config)
        bucket.clear()
        for i in range(old_sequence + 5):
            await put(kv, f"g2-{i:03d}", INDEXED, 1)
        index = StatusIndex(index_dir)
        follower = IndexFollower(js, index)
        await follower.start()
        await asyncio.wait_for(follower.caught_up.wait(), 10)
        await _subscribed(follower)
        assert index.identity != identity
        assert indexed(index) == bucket
        assert index.applied_sequence == old_sequence + 5
        counts = index.counts(C)
        assert counts is not None and counts.by_state[INDEXED] == len(bucket) == sum(counts.by_state.values())
    finally:
        if follower is not None:
            await follower.stop()
        if index is not None:
            index.close()
        await nc.close()
