"""The lifecycle's state machine (services/ingestion/lifecycle/machine.py): its table covers every
state and event there is, every transition the code makes is one of its rows and every row is
one the code makes (walked through ``Lifecycle`` over in-memory buckets), a change outside it
is refused, and docs/ARCHITECTURE.md shows the same table."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import nats.js.errors
import pytest

from meshkit.settings import IngestionSettings
from services.ingestion.events import IngestEvent, new_request_id, object_key_for
from services.ingestion.lifecycle import buckets
from services.ingestion.lifecycle.buckets import Keep, Write, update_status
from services.ingestion.lifecycle.entries import DocStatus
from services.ingestion.lifecycle.machine import (
    FAILED,
    INDEXED,
    NEW,
    STATES,
    TRANSITIONS,
    Event,
    IllegalTransition,
    State,
    check_transition,
    transition_table,
)
from services.ingestion.lifecycle.outcomes import Claim, Done, Failure, GiveUp, Retry, Success, Superseded
from services.ingestion.lifecycle.retry import CAS_POLICY
from services.ingestion.lifecycle.store import Lifecycle

from .conftest import PRODUCTION

REPO = Path(__file__).resolve().parents[3]
TABLE_HEADER = "| From | Event | Guard | To | Who |"

# Every (from, event) the table allows, with where it leads.
TABLE_MOVES: dict[tuple[str, str], str] = {
    (str(source), str(t.event)): str(t.target) for t in TRANSITIONS for source in t.sources
}


# --- in-memory buckets ------------------------------------------------------------------------


@dataclass
class Entry:
    value: bytes | None
    revision: int
    operation: str | None = None


class FakeKV:
    """A JetStream key-value bucket as the lifecycle uses it: revisions from one sequence,
    compare-and-set on ``last``, the errors nats-py raises."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.sequence = itertools.count(1)

    async def get(self, key: str) -> Entry:
        if key not in self.entries:
            raise nats.js.errors.KeyNotFoundError
        return self.entries[key]

    def _put(self, key: str, value: bytes | None, last: int, operation: str | None = None) -> int:
        held = self.entries.get(key)
        if (held.revision if held else 0) != last:
            raise nats.js.errors.KeyWrongLastSequenceError(f"{key} is not at {last}")
        revision = next(self.sequence)
        self.entries[key] = Entry(value, revision, operation)
        return revision

    async def create(self, key: str, value: bytes) -> int:
        return self._put(key, value, 0)

    async def update(self, key: str, value: bytes, last: int) -> int:
        return self._put(key, value, last)

    async def delete(self, key: str, last: int) -> None:
        self._put(key, None, last, "DEL")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


Move = tuple[str, str, str]


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Move]]:
    """Every (from, event, to) the status bucket's one write checks, in order."""
    seen: list[Move] = []
    real = buckets.check_transition

    def recording(source: str, event: str, target: str) -> None:
        seen.append((source, event, target))
        real(source, event, target)

    monkeypatch.setattr(buckets, "check_transition", recording)
    yield seen


class Walk:
    """One document's lifecycle at a time, through the public API of ``Lifecycle``."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.status_kv, self.records_kv = FakeKV(), FakeKV()
        self.settings = IngestionSettings(ingest_transient_retry_window_s=600, **PRODUCTION)
        self.lifecycle = self.with_settings()
        self.docs = (f"doc-{i}.md" for i in itertools.count())

    def with_settings(self, **changes: object) -> Lifecycle:
        """A lifecycle over the same buckets (another process, or a restart with new settings)."""
        settings = self.settings.model_copy(update=changes)
        return Lifecycle(self.status_kv, self.records_kv, settings, clock=self.clock)  # type: ignore[arg-type]

    def upsert(self, doc_id: str, word: str) -> IngestEvent:
        request_id = new_request_id()
        sha = (word * 64)[:64]
        return IngestEvent(
            op="upsert",
            collection="c",
            doc_id=doc_id,
            content_sha256=sha,
            object_key=object_key_for("c", f"c.{'0' * 40}", sha, request_id),
            format=1,
            request_id=request_id,
        )

    @staticmethod
    def delete(doc_id: str) -> IngestEvent:
        return IngestEvent(op="delete", collection="c", doc_id=doc_id, request_id=new_request_id())

    async def claimed(
        self, event: IngestEvent, owner: str = "w", lifecycle: Lifecycle | None = None
    ) -> Claim:
        result = await (lifecycle or self.lifecycle).claim(event, owner)
        assert isinstance(result, Claim), result
        return result

    async def state(self, event: IngestEvent) -> str:
        status = (await self.lifecycle.status(event.key)).value
        assert status is not None
        return status.state

    def expire_leases(self) -> None:
        self.clock.now += self.settings.ingest_lease_s + 1


async def walk_requests(w: Walk) -> None:
    """submit from every state a request can find, delete from every state it moves."""
    life, doc = w.lifecycle, next(w.docs)
    v1 = w.upsert(doc, "1")
    await life.request(v1)  # new -> queued
    await life.request(w.upsert(doc, "2"))  # queued -> queued
    await life.request(w.delete(doc))  # queued -> deleting
    v3 = w.upsert(doc, "3")
    await life.request(v3)  # deleting -> queued
    assert isinstance(await life.finish(await w.claimed(v3), Success(v3.content_sha256, 1, False)), Done)
    v4 = w.upsert(doc, "4")
    await life.request(v4)  # indexed -> queued
    assert isinstance(await life.finish(await w.claimed(v4), Success(v4.content_sha256, 1, False)), Done)
    gone = w.delete(doc)
    await life.request(gone)  # indexed -> deleting
    assert isinstance(await life.finish(await w.claimed(gone), Success("", 0, True)), Done)
    assert await w.state(gone) == State.DELETED
    v5 = w.upsert(doc, "5")
    await life.request(v5)  # deleted -> queued
    await life.finish(await w.claimed(v5), Failure("unparseable", "permanent"))
    await life.request(w.upsert(doc, "6"))  # failed -> queued
    v7 = w.upsert(doc, "7")
    await life.request(v7)
    await life.finish(await w.claimed(v7), Failure("unparseable", "permanent"))
    await life.request(w.delete(doc))  # failed -> deleting


async def walk_replays(w: Walk) -> None:
    life = w.lifecycle
    for event in (w.upsert(next(w.docs), "1"), w.delete(next(w.docs))):
        if event.op == "delete":  # a delete of something: index it first
            indexed = w.upsert(event.doc_id, "0")
            await life.request(indexed)
            await life.finish(await w.claimed(indexed), Success(indexed.content_sha256, 1, False))
        await life.request(event)
        result = await life.finish(await w.claimed(event), Failure("unparseable", "permanent"))
        assert isinstance(result, GiveUp)
        replayed = await life.replay(event, new_request_id())  # failed -> queued / deleting
        assert replayed.outcome == "requeued"


async def walk_claims(w: Walk) -> None:
    """Claims, take-overs, renewals, give-ups; requests that find a claim."""
    life, doc = w.lifecycle, next(w.docs)
    v1 = w.upsert(doc, "1")
    await life.request(v1)
    a = await w.claimed(v1, "a")
    w.expire_leases()
    b = await w.claimed(v1, "b")  # processing -> processing (a's lease expired)
    assert not await life.renew(a) and await life.renew(b)  # processing -> processing
    v2 = w.upsert(doc, "2")
    await life.request(v2)  # processing -> processing: the claim is kept
    result = await life.finish(b, Success(v1.content_sha256, 1, False))  # -> queued
    assert isinstance(result, Superseded)
    c = await w.claimed(v2)
    await life.request(w.delete(doc))
    assert isinstance(await life.finish(c, Success(v2.content_sha256, 1, False)), Superseded)  # -> deleting
    assert await w.state(v2) == State.DELETING
    # Workers that die mid-document spend the attempts: the next claim gives up.
    dying = w.upsert(next(w.docs), "1")
    await life.request(dying)
    for i in range(w.settings.ingest_max_deliver):
        await w.claimed(dying, f"dies-{i}")
        w.expire_leases()
    assert isinstance(await life.claim(dying, "survivor"), GiveUp)  # processing -> failed
    # Attempts counted under a higher limit, claimed after a restart with a lower one.
    for event in (w.upsert(next(w.docs), "1"), w.delete(next(w.docs))):
        if event.op == "delete":
            indexed = w.upsert(event.doc_id, "0")
            await life.request(indexed)
            await life.finish(await w.claimed(indexed), Success(indexed.content_sha256, 1, False))
        await life.request(event)
        assert isinstance(await life.finish(await w.claimed(event), Failure("boom", "counted")), Retry)
        restarted = w.with_settings(ingest_max_deliver=1)
        assert isinstance(await restarted.claim(event, "w"), GiveUp)  # queued / deleting -> failed


async def walk_failures(w: Walk) -> None:
    """Every kind of failure of an upsert and of a delete."""
    life = w.lifecycle
    for op in ("upsert", "delete"):
        doc = next(w.docs)
        if op == "delete":
            indexed = w.upsert(doc, "0")
            await life.request(indexed)
            await life.finish(await w.claimed(indexed), Success(indexed.content_sha256, 1, False))
        event = w.upsert(doc, "1") if op == "upsert" else w.delete(doc)
        await life.request(event)
        result = await life.finish(await w.claimed(event), Failure("embedder unavailable", "transient"))
        assert isinstance(result, Retry)
        for _ in range(w.settings.ingest_max_deliver - 1):
            assert isinstance(await life.finish(await w.claimed(event), Failure("boom", "counted")), Retry)
        result = await life.finish(await w.claimed(event), Failure("boom", "counted"))
        assert isinstance(result, GiveUp)  # fail (counted, last)
    window = w.upsert(next(w.docs), "1")
    await life.request(window)
    await life.finish(await w.claimed(window), Failure("object store unavailable", "transient"))
    w.clock.now += w.settings.ingest_transient_retry_window_s + 1
    result = await life.finish(await w.claimed(window), Failure("object store unavailable", "transient"))
    assert isinstance(result, GiveUp) and "for more than" in result.reason


# --- the tests --------------------------------------------------------------------------------


def test_the_table_covers_every_state_and_every_event() -> None:
    assert set(State) == {NEW, *STATES}
    in_table = {state for t in TRANSITIONS for state in (*t.sources, t.target)}
    assert in_table == set(State), f"states the table never names: {set(State) - in_table}"
    events = [t.event for t in TRANSITIONS]
    assert sorted(events) == sorted(Event), "each event has exactly one row"
    assert all(isinstance(s, State) for t in TRANSITIONS for s in (*t.sources, t.target))
    assert NEW not in {t.target for t in TRANSITIONS}, "nothing goes back to having no status"


async def test_the_code_makes_every_transition_of_the_table_and_no_other(moves: list[Move]) -> None:
    w = Walk()
    for walk in (walk_requests, walk_replays, walk_claims, walk_failures):
        await walk(w)
    for source, event, target in moves:  # check_transition let each through: each is a row
        assert TABLE_MOVES[(source, event)] == target
    made = {(str(source), str(event)) for source, event, _target in moves}
    never = sorted(set(TABLE_MOVES) - made)
    assert made == set(TABLE_MOVES), f"(from, event) of the table the code never takes: {never}"


def test_a_change_outside_the_table_is_refused() -> None:
    check_transition(NEW, Event.SUBMIT, State.QUEUED)
    for source, event, target in (
        (INDEXED, Event.SUCCEED, INDEXED),  # not from indexed
        (FAILED, Event.CLAIM, State.PROCESSING),  # a failed document is replayed, not claimed
        (State.PROCESSING, Event.SUCCEED, State.QUEUED),  # not where succeed leads
        (State.QUEUED, "teleport", INDEXED),  # no such event
    ):
        with pytest.raises(IllegalTransition, match=f"{source} --{event}--> {target} is not in"):
            check_transition(source, event, target)


async def test_the_status_write_refuses_what_the_table_does_not_allow_and_writes_nothing() -> None:
    kv = FakeKV()
    status = DocStatus("c", "a.md", INDEXED, indexed_sha256="a" * 64)
    await kv.create("k", status.to_bytes())
    before = dict(kv.entries)

    def decide(current: DocStatus | None, revision: int, now: float) -> Write | Keep:
        assert current is not None
        return Write(replace(current, state=State.PROCESSING), None, Event.CLAIM)

    with pytest.raises(IllegalTransition, match="indexed --claim--> processing"):
        await update_status(kv, "k", decide, policy=CAS_POLICY, clock=Clock())  # type: ignore[arg-type]
    assert kv.entries == before


def parse_doc_table(markdown: str) -> list[tuple[tuple[str, ...], str, str, str, str]]:
    """The rows of the Markdown table under TABLE_HEADER: (from states, event, guard, to, who)."""
    lines = markdown.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == TABLE_HEADER]
    assert len(starts) == 1, f"docs/ARCHITECTURE.md must hold one table headed {TABLE_HEADER!r}"
    rows = []
    for line in itertools.takewhile(lambda line: line.startswith("|"), lines[starts[0] + 2 :]):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"a row of five cells: {line!r}"
        sources, event, guard, target, who = cells
        rows.append((tuple(s.strip() for s in sources.split(",")), event, guard, target, who))
    return rows


def test_the_architecture_doc_shows_the_modules_table() -> None:
    documented = parse_doc_table((REPO / "docs" / "ARCHITECTURE.md").read_text())
    coded = [
        (tuple(str(s) for s in t.sources), str(t.event), t.guard, str(t.target), t.who) for t in TRANSITIONS
    ]
    missing = [row for row in coded if row not in documented]
    extra = [row for row in documented if row not in coded]
    assert not missing and not extra, f"rows the doc lacks: {missing}; rows only the doc has: {extra}"
    assert documented == coded, "the doc's rows are in the module's order"
    assert parse_doc_table(transition_table()) == coded  # the renderer the doc is made with
