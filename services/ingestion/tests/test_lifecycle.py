"""The lifecycle's transitions and guards against a real nats-server (KV compare-and-set is
what is under test), with production's lease and attempt limit and a clock the tests move."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from meshkit.settings import IngestionSettings
from services.ingestion.events import IngestEvent, new_request_id, object_key_for
from services.ingestion.lifecycle.buckets import open_buckets
from services.ingestion.lifecycle.entries import DocRecord
from services.ingestion.lifecycle.machine import (
    DELETING,
    FAILED,
    INDEXED,
    PROCESSING,
    QUEUED,
    IllegalTransition,
    check_transition,
    transition_table,
)
from services.ingestion.lifecycle.outcomes import (
    Busy,
    Claim,
    ClaimLost,
    Done,
    Failure,
    GiveUp,
    Lost,
    Retry,
    Skip,
    Success,
    Superseded,
)
from services.ingestion.lifecycle.retry import Conflict
from services.ingestion.lifecycle.store import Lifecycle
from services.ingestion.reconciler import Reconciler
from services.ingestion.topology import ensure_topology, publish_event

from .conftest import PRODUCTION

REPO = Path(__file__).resolve().parents[3]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def env(nats_url: str) -> AsyncIterator[tuple[Lifecycle, Clock, IngestionSettings, object]]:
    settings = IngestionSettings(nats_url=nats_url, ingest_transient_retry_window_s=600, **PRODUCTION)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_topology(js, settings)
    status, records = await open_buckets(js)
    clock = Clock()
    yield Lifecycle(status, records, settings, clock=clock), clock, settings, js
    await nc.close()


def upsert(word: str, doc_id: str = "a.md") -> IngestEvent:
    request_id = new_request_id()
    sha = word * 64 if len(word) == 1 else (word * 64)[:64]
    return IngestEvent(
        op="upsert",
        collection="c",
        doc_id=doc_id,
        content_sha256=sha,
        object_key=object_key_for("c", f"c.{'0' * 40}", sha, request_id),
        format=1,
        request_id=request_id,
    )


def delete(doc_id: str = "a.md") -> IngestEvent:
    return IngestEvent(op="delete", collection="c", doc_id=doc_id, request_id=new_request_id())


async def claimed(lifecycle: Lifecycle, event: IngestEvent, owner: str) -> Claim:
    result = await lifecycle.claim(event, owner)
    assert isinstance(result, Claim), result
    return result


async def test_a_stale_claim_has_every_write_refused(env: tuple) -> None:
    lifecycle, clock, settings, _js = env
    v1 = upsert("1")
    await lifecycle.request(v1)
    a = await claimed(lifecycle, v1, "worker-a")
    assert isinstance(await lifecycle.claim(v1, "worker-b"), Busy)  # a live claim
    clock.now += settings.ingest_lease_s + 1  # A stalls past its lease
    b = await claimed(lifecycle, v1, "worker-b")
    assert b.fence > a.fence
    assert not await lifecycle.renew(a) and a.lost
    with pytest.raises(ClaimLost):
        await lifecycle.commit_record(a, None, 0)
    assert isinstance(await lifecycle.finish(a, Success(v1.content_sha256, 3, False)), Lost)
    assert await lifecycle.renew(b)
    assert isinstance(await lifecycle.finish(b, Success(v1.content_sha256, 2, False)), Done)
    status = (await lifecycle.status(v1.key)).value
    assert (status.state, status.chunks, status.owner, status.attempts) == (INDEXED, 2, "", 2)


async def test_fences_of_one_document_strictly_increase(env: tuple) -> None:
    lifecycle, _clock, _settings, _js = env
    fences = []
    for word in "1234":
        event = upsert(word)
        await lifecycle.request(event)
        claim = await claimed(lifecycle, event, "w")
        fences.append(claim.fence)
        await lifecycle.request(upsert(word + "x"))  # the API writes while it is claimed
        assert await lifecycle.renew(claim)
        assert isinstance(await lifecycle.finish(claim, Success(event.content_sha256, 1, False)), Superseded)
    assert fences == sorted(set(fences))


async def test_claim_guards(env: tuple) -> None:
    lifecycle, _clock, _settings, _js = env
    v1 = upsert("1")
    assert isinstance(await lifecycle.claim(v1, "w"), Skip)  # no status: never committed
    await lifecycle.request(v1)
    v2 = upsert("2")
    await lifecycle.request(v2)
    skip = await lifecycle.claim(v1, "w")
    assert isinstance(skip, Skip) and skip.superseded
    claim = await claimed(lifecycle, v2, "w")
    # The same owner may take over its own claim (its outcome could not be recorded).
    again = await claimed(lifecycle, v2, "w")
    assert again.fence > claim.fence
    await lifecycle.finish(again, Success(v2.content_sha256, 1, False))
    done = await lifecycle.claim(v2, "w")
    assert isinstance(done, Skip) and not done.superseded


async def test_request_outcomes(env: tuple) -> None:
    lifecycle, _clock, _settings, _js = env
    v1 = upsert("1")
    assert (await lifecycle.request(delete())).outcome == "absent"
    assert (await lifecycle.request(v1)).outcome == "requested"
    same = replace(v1, request_id=new_request_id())
    assert (await lifecycle.request(same)).outcome == "pending"
    claim = await claimed(lifecycle, v1, "w")
    await lifecycle.finish(claim, Success(v1.content_sha256, 1, False))
    assert (await lifecycle.request(same)).outcome == "unchanged"
    gone = delete()
    assert (await lifecycle.request(gone)).outcome == "requested"
    assert (await lifecycle.status(v1.key)).value.state == DELETING
    assert (await lifecycle.request(delete())).outcome == "pending"


async def test_a_request_while_claimed_keeps_the_claim_and_waits(env: tuple) -> None:
    lifecycle, _clock, _settings, _js = env
    v1, v2 = upsert("1"), upsert("2")
    await lifecycle.request(v1)
    claim = await claimed(lifecycle, v1, "w")
    requested = await lifecycle.request(v2)
    assert requested.status.state == PROCESSING and requested.status.owner == "w"
    assert await lifecycle.renew(claim)
    assert isinstance(await lifecycle.finish(claim, Success(v1.content_sha256, 4, False)), Superseded)
    status = (await lifecycle.status(v1.key)).value
    assert (status.state, status.indexed_sha256, status.target_sha256) == (
        QUEUED,
        v1.content_sha256,
        v2.content_sha256,
    )


async def test_attempts_are_counted_by_the_lifecycle(env: tuple) -> None:
    lifecycle, _clock, settings, _js = env
    event = upsert("1")
    await lifecycle.request(event)
    # Transient failures give their charge back.
    for _ in range(7):
        claim = await claimed(lifecycle, event, "w")
        result = await lifecycle.finish(claim, Failure("object store unavailable", "transient"))
        assert isinstance(result, Retry)
    status = (await lifecycle.status(event.key)).value
    assert (status.state, status.attempts, status.charged, status.retries) == (QUEUED, 7, 0, 7)
    assert status.reason == "waiting: object store unavailable"
    # Counted failures use them up; the last one gives up.
    for charged in range(1, settings.ingest_max_deliver):
        claim = await claimed(lifecycle, event, "w")
        assert isinstance(await lifecycle.finish(claim, Failure("boom", "counted")), Retry)
        assert (await lifecycle.status(event.key)).value.charged == charged
    claim = await claimed(lifecycle, event, "w")
    result = await lifecycle.finish(claim, Failure("boom", "counted"))
    assert isinstance(result, GiveUp) and result.reason == "gave up after 5 attempts; last error: boom"
    assert (await lifecycle.status(event.key)).value.state == FAILED
    assert isinstance(await lifecycle.claim(event, "w"), GiveUp)  # its event again: dead-letter


async def test_workers_that_die_mid_document_are_counted_and_the_next_claim_gives_up(env: tuple) -> None:
    lifecycle, clock, settings, _js = env
    event = upsert("1")
    await lifecycle.request(event)
    for i in range(settings.ingest_max_deliver):
        await claimed(lifecycle, event, f"dies-{i}")
        clock.now += settings.ingest_lease_s + 1
    result = await lifecycle.claim(event, "survivor")
    assert isinstance(result, GiveUp)
    assert "stopped mid-document" in result.reason and result.attempts == settings.ingest_max_deliver
    assert (await lifecycle.status(event.key)).value.state == FAILED


async def test_transient_failures_end_after_the_window(env: tuple) -> None:
    lifecycle, clock, settings, _js = env
    event = upsert("1")
    await lifecycle.request(event)
    claim = await claimed(lifecycle, event, "w")
    assert isinstance(await lifecycle.finish(claim, Failure("embedder unavailable", "transient")), Retry)
    clock.now += settings.ingest_transient_retry_window_s
    claim = await claimed(lifecycle, event, "w")
    result = await lifecycle.finish(claim, Failure("embedder unavailable", "transient"))
    assert isinstance(result, GiveUp) and result.reason == "embedder unavailable for more than 600 s"


async def test_permanent_failure_gives_up_at_once(env: tuple) -> None:
    lifecycle, _clock, _settings, _js = env
    event = upsert("1")
    await lifecycle.request(event)
    claim = await claimed(lifecycle, event, "w")
    result = await lifecycle.finish(claim, Failure("unparseable PDF", "permanent"))
    assert isinstance(result, GiveUp) and result.attempts == 1


async def test_replay_is_one_compare_and_set(env: tuple) -> None:
    lifecycle, _clock, _settings, _js = env
    event = upsert("1")
    await lifecycle.request(event)
    claim = await claimed(lifecycle, event, "w")
    await lifecycle.finish(claim, Failure("unparseable", "permanent"))
    # Two replays of the same letter race: exactly one requeues it.
    results = await asyncio.gather(*(lifecycle.replay(event, new_request_id()) for _ in range(4)))
    assert sorted(r.outcome for r in results) == ["requeued", "superseded", "superseded", "superseded"]
    requeued = next(r for r in results if r.outcome == "requeued")
    status = (await lifecycle.status(event.key)).value
    assert status.state == QUEUED and status.request_id == requeued.event.request_id
    assert requeued.event.object_key == event.object_key  # the same bytes
    # A letter whose request was replaced by a newer submission is superseded.
    claim = await claimed(lifecycle, requeued.event, "w")
    await lifecycle.finish(claim, Failure("unparseable", "permanent"))
    await lifecycle.request(upsert("2"))
    assert (await lifecycle.replay(requeued.event, new_request_id())).outcome == "superseded"


async def test_record_commit_is_fenced(env: tuple) -> None:
    lifecycle, clock, settings, _js = env
    event = upsert("1")
    await lifecycle.request(event)
    record = DocRecord("c", "a.md", event.content_sha256, event.object_key, "t", ["x"])
    a = await claimed(lifecycle, event, "a")
    base = (await lifecycle.record(event.key)).revision
    # Another writer got in first (a stale worker's late write): the claim holder still wins.
    await lifecycle._cas(lifecycle.records_kv, event.key, replace(record, chunk_ids=["stale"]).to_bytes(), 0)
    with pytest.raises(Conflict):
        await lifecycle._cas(lifecycle.records_kv, event.key, record.to_bytes(), base)
    await lifecycle.commit_record(a, record, base)
    assert (await lifecycle.record(event.key)).value.chunk_ids == ["x"]
    clock.now += settings.ingest_lease_s + 1
    await claimed(lifecycle, event, "b")
    with pytest.raises(ClaimLost):
        await lifecycle.commit_record(a, replace(record, chunk_ids=["late"]), 0)
    assert (await lifecycle.record(event.key)).value.chunk_ids == ["x"]


async def test_object_in_use(env: tuple) -> None:
    lifecycle, _clock, _settings, _js = env
    v1, v2 = upsert("1"), upsert("2")
    await lifecycle.request(v1)
    claim = await claimed(lifecycle, v1, "w")
    await lifecycle.commit_record(claim, DocRecord("c", "a.md", v1.content_sha256, v1.object_key, "", []), 0)
    await lifecycle.finish(claim, Success(v1.content_sha256, 0, False))
    await lifecycle.request(v2)
    assert await lifecycle.object_in_use(v1.key, v1.object_key)  # the record's
    assert await lifecycle.object_in_use(v1.key, v2.object_key)  # the request's
    assert not await lifecycle.object_in_use(v1.key, upsert("3").object_key)


def test_writes_follow_the_table_and_the_docs_show_it() -> None:
    check_transition("new", "submit", QUEUED)
    check_transition(PROCESSING, "succeed", INDEXED)
    with pytest.raises(IllegalTransition):
        check_transition(INDEXED, "succeed", INDEXED)
    with pytest.raises(IllegalTransition):
        check_transition(FAILED, "claim", PROCESSING)
    architecture = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    assert transition_table() in architecture, "docs/ARCHITECTURE.md must carry lifecycle.transition_table()"


async def test_reconciler_republishes_only_what_has_no_event(env: tuple) -> None:
    lifecycle, _clock, settings, js = env
    stranded, published = upsert("1", "stranded.md"), upsert("2", "published.md")
    for event in (stranded, published):
        await lifecycle.request(event)
    await publish_event(js, settings, published, "ev-1")  # the other one's publish never happened
    reconciler = Reconciler(js, lifecycle, settings)
    for event in (stranded, published):
        current = await lifecycle.status(event.key)
        reconciler.apply(event.key, current.revision, current.value)
    later = current.value.updated_at + settings.ingest_reconcile_grace_s + 1
    assert await reconciler.sweep(now=current.value.updated_at) == 0  # within the grace period
    assert await reconciler.sweep(now=later) == 1
    assert await reconciler.sweep(now=later + 1) == 0  # its event is pending now
    raw = await js.get_last_msg(settings.ingest_stream, stranded.subject)
    assert IngestEvent.from_bytes(raw.data).request_id == stranded.request_id
    # A final state is dropped from the watch list.
    claim = await claimed(lifecycle, stranded, "w")
    await lifecycle.finish(claim, Success(stranded.content_sha256, 1, False))
    current = await lifecycle.status(stranded.key)
    reconciler.apply(stranded.key, current.revision, current.value)
    assert stranded.key not in reconciler.waiting


async def test_a_consumer_with_a_delivery_limit_is_recreated_and_its_exhausted_events_return(
    nats_url: str,
) -> None:
    settings = IngestionSettings(nats_url=nats_url, **PRODUCTION)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_topology(js, settings)
        await js.delete_consumer(settings.ingest_stream, settings.ingest_consumer)
        old = ConsumerConfig(
            durable_name=settings.ingest_consumer, ack_policy=AckPolicy.EXPLICIT, max_deliver=2
        )
        await js.add_consumer(settings.ingest_stream, old)
        await publish_event(js, settings, upsert("1"), "ev-x")
        consumer = await js.pull_subscribe_bind(
            durable=settings.ingest_consumer, stream=settings.ingest_stream
        )
        for _ in range(2):
            [msg] = await consumer.fetch(1, timeout=5)
            await msg.nak()
        with pytest.raises(nats.errors.TimeoutError):
            await consumer.fetch(1, timeout=1)  # exhausted under the old limit
        await consumer.unsubscribe()

        await ensure_topology(js, settings)
        info = await js.consumer_info(settings.ingest_stream, settings.ingest_consumer)
        assert info.config.max_deliver == -1
        consumer = await js.pull_subscribe_bind(
            durable=settings.ingest_consumer, stream=settings.ingest_stream
        )
        [msg] = await consumer.fetch(1, timeout=5)
        assert IngestEvent.from_bytes(msg.data).op == "upsert"
        await consumer.unsubscribe()
    finally:
        await nc.close()
