"""The write path under races and faults, with production timings (lease 120 s, ack_wait 60 s,
five attempts): the real API and workers on a real nats-server, fakes only for the object
store and the stores (see conftest). Each test pins one way a document used to be stranded,
rolled back or lost; the interleavings are made deterministic with pauses in the fakes or a
wrapper around one client call."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import urllib3
from nats.js.client import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from meshkit.core.errors import ServiceError
from meshkit.domain.ids import doc_key
from ragmesh.ingestion.v1 import ingestion_pb2

from .conftest import STATUS_BUCKET, Harness
from .write_helpers import (
    BROKEN_PDF,
    DELETED,
    FAILED,
    INDEXED,
    PDF,
    PROCESSING,
    doc,
    idle,
    sha,
    until,
)


async def test_submit_index_edit_delete(harness: Harness) -> None:
    await harness.start_api()
    await harness.start_worker()
    await harness.submit("c", "a.md", doc("alpha"))
    first = await harness.wait_state("c", "a.md", INDEXED)
    assert first.chunks == 1
    await harness.submit("c", "a.md", doc("beta"))
    second = await harness.wait_state("c", "a.md", INDEXED)
    assert second.content_sha256 == sha("beta")
    assert len(harness.stores.index.chunks("c", "a.md")) == 1
    # The first version's bytes are removed once the second is indexed, the second's kept.
    await until(lambda: asyncio.sleep(0, len(harness.objects.keys()) == 1), "cleanup of the old bytes")
    raw, _ = await harness.raw_status(doc_key("c", "a.md"))
    assert raw["request"]["object_key"] == harness.objects.keys()[0]
    request = ingestion_pb2.DeleteDocumentsRequest(collection="c", doc_ids=["a.md"])
    await harness.api.DeleteDocuments(request, None)
    await harness.wait_state("c", "a.md", DELETED)
    assert harness.stores.index.chunks("c", "a.md") == set()
    await until(lambda: asyncio.sleep(0, harness.objects.keys() == []), "cleanup after the delete")


# --- finding: cleanup of an old version deleted the bytes of a newer one ---------------------


async def test_cleanup_of_an_old_version_never_deletes_newer_bytes(harness: Harness) -> None:
    """v1 is indexed and its cleanup runs while the API has stored v2's bytes but not yet
    recorded v2: the cleanup must not take v2's bytes (it listed the document's prefix and
    deleted every key but v1's and the recorded target's)."""
    await harness.start_api()
    await harness.submit("c", "d.md", doc("one"))
    v2_stored, release_api = asyncio.Event(), asyncio.Event()

    async def pause_after_v2(key: str) -> None:
        if sha("two") in key:
            v2_stored.set()
            await release_api.wait()

    harness.objects.after_put = pause_after_v2
    submit_v2 = asyncio.create_task(harness.submit("c", "d.md", doc("two")))
    await asyncio.wait_for(v2_stored.wait(), 10)
    worker = await harness.start_worker()
    await harness.wait_state("c", "d.md", INDEXED)
    await until(lambda: idle(worker), "v1's cleanup")
    release_api.set()
    await submit_v2
    status = await harness.wait_state("c", "d.md", INDEXED)
    assert status.content_sha256 == sha("two"), status
    assert status.reason == ""


# --- finding: a worker whose lease expired kept writing; an older version could win ---------


@pytest.mark.parametrize("paused_in", ["embedding", "the index write"])
async def test_stale_worker_cannot_overwrite_a_newer_version(harness: Harness, paused_in: str) -> None:
    """Worker A claims v1 and stalls (a paused coroutine) past its lease; worker B indexes
    v2. When A resumes, nothing it does may show: the stores, the record and the status keep
    v2 (A's store write is refused by its fence, its record and status writes by its claim)."""
    await harness.start_api()
    gate = asyncio.Event()
    if paused_in == "embedding":
        harness.stores.embedder.pause_next = gate
        entered = harness.stores.embedder.entered
    else:
        harness.stores.index.pause_next["s.md"] = gate
        entered = harness.stores.index.entered["s.md"]
    # One fetch loop: the stalled batch keeps it, so every later event goes to worker B.
    worker_a = await harness.start_worker("a", ingest_max_in_flight=32, ingest_fetch_batch=32)
    await harness.submit("c", "s.md", doc("old"))
    await asyncio.wait_for(entered.wait(), 10)
    # A stays stalled longer than its lease: time moves on, the lease runs out.
    await harness.edit_status(doc_key("c", "s.md"), lease_until=time.time() - 1)
    await harness.start_worker("b")
    await harness.submit("c", "s.md", doc("new"))
    status = await harness.wait_state("c", "s.md", INDEXED)
    assert status.content_sha256 == sha("new")
    new_chunks = harness.stores.index.chunks("c", "s.md")

    gate.set()  # A resumes
    await until(lambda: idle(worker_a), "worker A to finish")
    await asyncio.sleep(0.5)
    status = await harness.status("c", "s.md")
    assert (status.state, status.content_sha256) == (INDEXED, sha("new")), status
    assert harness.stores.index.chunks("c", "s.md") == new_chunks
    assert harness.stores.sparse.chunks("c", "s.md") == new_chunks
    texts = [harness.stores.sparse_service.texts[c] for c in new_chunks]
    assert all("new" in t for t in texts), texts


# --- finding: replay was check-then-act --------------------------------------------------------


async def test_replay_racing_a_new_submission_never_brings_the_old_version_back(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v2 is dead-lettered; while a replay of it reads the status, v3 is submitted. The
    replay must see that its letter is superseded (it used to requeue v2 over v3)."""
    await harness.start_api()
    await harness.start_worker()
    await harness.submit("c", "r.md", doc("one"))
    await harness.wait_state("c", "r.md", INDEXED)
    await harness.submit("c", "r.md", BROKEN_PDF, fmt=PDF)
    await harness.wait_state("c", "r.md", FAILED)
    assert len(await harness.dead_letters("c")) == 1

    key = doc_key("c", "r.md")
    armed = True
    real_get = KeyValue.get

    async def get_then_race(self: KeyValue, name: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal armed
        entry = await real_get(self, name, *args, **kwargs)
        if armed and self._name == STATUS_BUCKET and name == key:
            armed = False
            await harness.submit("c", "r.md", doc("three"))  # lands right after the replay's read
        return entry

    monkeypatch.setattr(KeyValue, "get", get_then_race)
    await harness.api.ReplayDeadLetters(ingestion_pb2.ReplayDeadLettersRequest(collection="c"), None)
    monkeypatch.setattr(KeyValue, "get", real_get)
    assert not armed

    status = await harness.wait_state("c", "r.md", INDEXED)
    assert status.content_sha256 == sha("three"), status
    await asyncio.sleep(1.0)  # anything requeued by the replay would run now
    status = await harness.status("c", "r.md")
    assert (status.state, status.content_sha256) == (INDEXED, sha("three")), status
    assert await harness.dead_letters("c") == []


# --- finding: the publish revert was check-then-act; a crash stranded the document ----------


async def test_submission_whose_publish_never_happened_is_still_indexed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call is cancelled (client deadline, API process dying) after the status was
    written and before the event was published: the document must not stay QUEUED with no
    event (the reconciler publishes it; a short grace here, production's is 30 s)."""
    harness.overrides = {"ingest_reconcile_grace_s": 1.0, "ingest_reconcile_interval_s": 0.5}
    await harness.start_api()
    await harness.start_worker()
    real_publish = JetStreamContext.publish
    cancelled = []

    async def publish_cancelled(self: JetStreamContext, subject: str, *args: Any, **kwargs: Any) -> Any:
        if subject.startswith("ragmesh.ingest.") and not cancelled:
            cancelled.append(subject)
            raise asyncio.CancelledError
        return await real_publish(self, subject, *args, **kwargs)

    monkeypatch.setattr(JetStreamContext, "publish", publish_cancelled)
    with pytest.raises(asyncio.CancelledError):
        await harness.submit("c", "p.md", doc("lost"))
    assert cancelled
    status = await harness.wait_state("c", "p.md", INDEXED, timeout=30)
    assert status.content_sha256 == sha("lost")


# --- finding: two retry counts; an outcome given up on was acked anyway ---------------------


async def test_outcome_is_recorded_despite_write_contention(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight writers in a row get in before the worker's outcome write (rapid re-requests,
    heartbeats): the worker gave up after five tries, acked anyway and left the document
    PROCESSING for good. One retry policy, and never an ack without a recorded outcome."""
    await harness.start_api()
    await harness.start_worker()
    key = doc_key("c", "k.md")
    conflicts = []
    real_update = KeyValue.update

    async def contended_update(self: KeyValue, name: str, value: bytes, *args: Any, **kwargs: Any) -> Any:
        outcome = self._name == STATUS_BUCKET and name == key and json.loads(value).get("state") == "indexed"
        if outcome and len(conflicts) < 8:
            conflicts.append(name)
            raise KeyWrongLastSequenceError(description="wrong last sequence")
        return await real_update(self, name, value, *args, **kwargs)

    monkeypatch.setattr(KeyValue, "update", contended_update)
    await harness.submit("c", "k.md", doc("contended"))
    status = await harness.wait_state("c", "k.md", INDEXED, timeout=30)
    assert len(conflicts) == 8
    assert status.content_sha256 == sha("contended")


async def test_outcome_not_recorded_is_never_acked(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The outcome write conflicts for longer than the retry policy lasts: the event stays
    unacknowledged and the document is finished on the next delivery."""
    await harness.start_api()
    worker = await harness.start_worker()
    worker.lifecycle.policy = type(worker.lifecycle.policy)(deadline_s=0.3)
    key = doc_key("c", "n.md")
    # The contention lasts 2 s from the first outcome write (however long a loaded machine
    # takes to get there), longer than the 0.3 s policy.
    contended_from: list[float] = []
    real_update = KeyValue.update

    async def contended_update(self: KeyValue, name: str, value: bytes, *args: Any, **kwargs: Any) -> Any:
        outcome = self._name == STATUS_BUCKET and name == key and json.loads(value).get("state") == "indexed"
        if outcome and not contended_from:
            contended_from.append(time.monotonic())
        if outcome and time.monotonic() < contended_from[0] + 2.0:
            raise KeyWrongLastSequenceError(description="wrong last sequence")
        return await real_update(self, name, value, *args, **kwargs)

    monkeypatch.setattr(KeyValue, "update", contended_update)
    await harness.submit("c", "n.md", doc("later"))
    status = await harness.wait_state("c", "n.md", INDEXED, timeout=30)
    assert status.attempts >= 2  # the first claim's outcome was lost; the event came back


# --- finding: a slow document held back its batch -------------------------------------------


async def test_slow_document_does_not_hold_back_its_batch(harness: Harness) -> None:
    await harness.start_api()
    slow_key = doc_key("c", "slow.md").split(".", 1)[1]
    release = asyncio.Event()

    async def slow_fetch(key: str) -> None:
        if slow_key in key:
            await release.wait()

    harness.objects.on_get = slow_fetch
    await harness.submit_many("c", [("slow.md", doc("slow")), ("fast.md", doc("fast"))])
    await harness.start_worker()  # one fetch takes both events: one batch
    try:
        fast = await harness.wait_state("c", "fast.md", INDEXED, timeout=10)
        assert fast.content_sha256 == sha("fast")
        assert (await harness.status("c", "slow.md")).state == PROCESSING
    finally:
        release.set()
    await harness.wait_state("c", "slow.md", INDEXED)


# --- finding: errors echoed repr(exc) to callers --------------------------------------------


def s3_down() -> urllib3.exceptions.MaxRetryError:
    return urllib3.exceptions.MaxRetryError(
        None,  # type: ignore[arg-type]
        "/ragmesh-documents/c/3f2a",
        reason=ConnectionRefusedError(111, "Connection refused (10.4.0.17:9000)"),
    )


INTERNALS = ("MaxRetryError", "Connection refused", "10.4.0.17", "Errno", "Error(")


async def test_errors_to_callers_carry_no_internals(harness: Harness) -> None:
    await harness.start_api()

    async def refuse(key: str) -> None:
        raise s3_down()

    harness.objects.on_put = refuse
    with pytest.raises(ServiceError) as refused:
        await harness.submit("c", "e.md", doc("refused"))
    error = refused.value
    assert error.code.name == "UNAVAILABLE"
    assert "e.md" in error.message and "object store" in error.message and "retry" in error.message
    assert not [bit for bit in INTERNALS if bit in error.message], error.message

    # The reason a worker records is shown to callers too.
    harness.objects.on_put = None
    harness.objects.on_get = refuse
    await harness.start_worker()
    await harness.submit("c", "w.md", doc("waiting"))
    await until(lambda: has_reason(harness, "w.md"), "a recorded reason")
    status = await harness.status("c", "w.md")
    assert "object store" in status.reason
    assert not [bit for bit in INTERNALS if bit in status.reason], status.reason


async def has_reason(harness: Harness, doc_id: str) -> bool:
    return bool((await harness.status("c", doc_id)).reason)


# --- finding: replay loaded up to a million letters at once ---------------------------------


async def test_replay_handles_a_bounded_batch_per_call(harness: Harness) -> None:
    api = await harness.start_api()
    js = (await harness.connect()).jetstream()
    for i in range(300):
        event = {
            "op": "upsert",
            "collection": "c",
            "doc_id": f"gone-{i}.md",
            "content_sha256": "ab" * 32,
            "object_key": f"c/x{i}/ab",
            "format": 1,
        }
        await js.publish("ragmesh.dlq.c", json.dumps(event).encode(), stream="RAGMESH_INGEST_DLQ")
    assert len(await harness.dead_letters("c")) == 300

    first = await api.ReplayDeadLetters(ingestion_pb2.ReplayDeadLettersRequest(collection="c"), None)
    assert len(await harness.dead_letters("c")) == 300 - 256
    handled = first.replayed + first.superseded
    cursor = first.next_after_sequence
    assert handled == 256 and cursor
    while cursor:
        reply = await api.ReplayDeadLetters(
            ingestion_pb2.ReplayDeadLettersRequest(collection="c", after_sequence=cursor), None
        )
        handled += reply.replayed + reply.superseded
        cursor = reply.next_after_sequence
    assert handled == 300
    assert await harness.dead_letters("c") == []


# --- finding: "busy" naks spent deliveries; a re-submission was dead-lettered and stranded ---


async def hold(harness: Harness, key: str, stop: asyncio.Event) -> None:
    """Another live worker holding the document: a claim whose lease it keeps renewing."""
    while not stop.is_set():
        await harness.edit_status(
            key, state="processing", owner="other-worker", lease_until=time.time() + 1.0
        )
        await asyncio.sleep(0.3)


async def test_busy_redeliveries_spend_no_attempts(harness: Harness) -> None:
    await harness.start_api()
    key = doc_key("c", "b.md")
    await harness.submit("c", "b.md", doc("first"))
    stop = asyncio.Event()
    holder = asyncio.create_task(hold(harness, key, stop))
    await asyncio.sleep(0.5)
    await harness.start_worker()
    await asyncio.sleep(1.0)
    await harness.submit("c", "b.md", doc("second"))  # a re-submission while it is held
    await asyncio.sleep(10)  # its event comes back "busy" again and again meanwhile
    stop.set()
    await holder
    # The holder finishes with a newer request recorded: it leaves the document queued.
    await harness.edit_status(key, state="queued", owner="", lease_until=0.0)
    status = await harness.wait_state("c", "b.md", INDEXED, timeout=20)
    assert status.content_sha256 == sha("second")
    assert await harness.dead_letters("c") == []


# --- finding: dead-lettering after the last delivery depended on the API process -------------


async def test_worker_dead_letters_by_its_own_count_with_the_api_down(harness: Harness) -> None:
    """Five workers in a row claimed the document and died mid-document (their leases ran
    out). With the API process down, the next worker must dead-letter it itself."""
    api = await harness.start_api()
    key = doc_key("c", "dies.md")
    await harness.submit("c", "dies.md", doc("poison"))
    await api.stop()
    harness.api = None
    js = (await harness.connect()).jetstream()
    consumer = await js.pull_subscribe_bind(durable="ingest-workers", stream="RAGMESH_INGEST")
    for attempt in range(1, 6):
        [msg] = await consumer.fetch(1, timeout=10)
        raw, _ = await harness.raw_status(key)
        dead_claim: dict[str, Any] = {
            "state": "processing",
            "owner": f"dead-{attempt}",
            "lease_until": time.time() - 1,
            "attempts": attempt,
        }
        if "charged" in raw:
            dead_claim["charged"] = raw["charged"] + 1
        await harness.edit_status(key, **dead_claim)
        await msg.nak()  # (its ack_wait ran out: redelivered)
    await consumer.unsubscribe()

    await harness.start_worker()

    async def failed() -> bool:
        raw, _ = await harness.raw_status(key)
        return bool(raw.get("state") == "failed")

    await until(failed, "the document FAILED", timeout=20)
    raw, _ = await harness.raw_status(key)
    assert "stopped mid-document" in raw["reason"], raw
    info = await js.stream_info("RAGMESH_INGEST_DLQ")
    assert info.state.messages == 1
