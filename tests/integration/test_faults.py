"""Faults on the local stack, each bounded in time and on loopback only:

- the S3 server down while documents wait for a worker: a short outage only delays them (an
  infrastructure failure costs no attempt); one longer than the transient retry window sends
  them to the dead-letter stream with the reason, and a replay once S3 is back indexes every
  one (nothing lost);
- NATS killed (SIGKILL) and restarted: documents submitted just before are not lost (JetStream
  file storage), the same worker and API processes reconnect and index what comes next;
- SIGKILL of one replica of a stateless stage under load: the gateway routes around it
  (client round-robin, retries, breakers) and only calls in flight at the kill may fail.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
from grpc import aio

from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.planner.v1 import planner_pb2
from ragmesh.sparse.v1 import sparse_pb2
from ragmesh_cli.stack import Stack

from .meshclients import CallLog, Mesh, drive, replicas_of
from .test_ingest import FAILED, INDEXED, dead_letters, new_collection
from .test_rerank import DOCS as RERANK_DOCS
from .test_rerank import QUESTION

pytestmark = pytest.mark.integration

TOPICS = ["volcanic basalt", "sourdough starter", "ocean tides", "glacier ice", "desert dunes"]


def note(doc_id: str, i: int) -> str:
    """A one-chunk document with a word no other document has (``marker``)."""
    topic = TOPICS[i % len(TOPICS)]
    return f"# Note {i}\n\nThis ragmesh note {marker(doc_id)} is about {topic} and nothing else."


def marker(doc_id: str) -> str:
    return "mk" + "".join(ch for ch in doc_id if ch.isalnum()).lower()


@pytest.fixture
async def mesh(stack: Stack) -> AsyncIterator[Mesh]:
    clients = Mesh(stack)
    yield clients
    await clients.close()


def workers_of(stack: Stack) -> list[str]:
    return [name for name in stack.names() if stack.component(name).kind == "worker"]


def signal_all(stack: Stack, names: list[str], sig: int) -> None:
    for name in names:
        stack.kill(name, sig)


async def assert_all_indexed_and_searchable(
    mesh: Mesh, collection: str, doc_ids: list[str], timeout: float = 120.0
) -> None:
    """Every document INDEXED, the stores hold exactly their chunks, each found by its marker,
    and the API's collection counts (a watch of the status bucket) agree."""
    statuses = await mesh.wait_settled(collection, doc_ids, timeout=timeout)
    bad = {d: (ingestion_pb2.DocumentState.Name(s.state), s.reason) for d, s in statuses.items()}
    assert {s.state for s in statuses.values()} == {INDEXED}, bad
    chunks = sum(s.chunks for s in statuses.values())
    assert await mesh.index_chunks(collection) == chunks
    sparse = await mesh.sparse_stats(collection)
    assert (sparse.documents, sparse.chunks) == (len(doc_ids), chunks)
    want = (len(doc_ids), 0, 0, 0, chunks)
    deadline = time.monotonic() + 20
    while True:
        counts = await mesh.ingestion.GetCollectionStatus(
            ingestion_pb2.GetCollectionStatusRequest(collection=collection), timeout=10
        )
        got = (counts.indexed, counts.queued, counts.processing, counts.failed, counts.chunks)
        if got == want:
            break
        assert time.monotonic() < deadline, f"collection counts stuck at {got}, want {want}"
        await asyncio.sleep(0.2)
    reply = await mesh.sparse.SearchExact(
        sparse_pb2.SearchExactRequest(
            collection=collection, keywords=[marker(d) for d in doc_ids[:32]], top_k=1000
        ),
        timeout=10,
    )
    for hit in reply.hits:
        assert [marker(hit.doc_id)] == list(hit.matched_keywords), hit
    assert {h.doc_id for h in reply.hits} == set(doc_ids[:32])


# --- S3 -------------------------------------------------------------------------------------


async def submit_with_s3_down(mesh: Mesh, stack: Stack, collection: str, doc_ids: list[str]) -> list[str]:
    """The API writes the bytes to S3 before it queues an event, so the documents go in with S3
    up; the workers are paused meanwhile so that none of them reads a document before S3 is
    stopped: every document then meets a dead S3 on its first delivery. Returns the workers
    (still paused)."""
    workers = workers_of(stack)
    assert workers, "the stack runs no ingestion worker"
    signal_all(stack, workers, signal.SIGSTOP)
    await asyncio.sleep(1.5)  # pull requests the paused workers had open expire
    reply = await mesh.ingest(collection, [(d, note(d, i)) for i, d in enumerate(doc_ids)])
    assert [r.outcome for r in reply.results] == [ingestion_pb2.SUBMIT_OUTCOME_QUEUED] * len(doc_ids)
    await asyncio.to_thread(stack.stop, "s3")
    # With S3 down the API refuses new documents outright (UNAVAILABLE: retry later), records
    # nothing for them and says what failed without internals.
    with pytest.raises(aio.AioRpcError) as refused:
        await mesh.ingest(collection, [("refused.md", note("refused.md", 0))])
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    details = refused.value.details() or ""
    assert "object store" in details and "request id" in details, details
    assert "Error" not in details and "127.0.0.1" not in details, details
    with pytest.raises(aio.AioRpcError) as unknown:
        await mesh.statuses(collection, ["refused.md"])
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    return workers


async def restart_s3(stack: Stack, workers: list[str]) -> None:
    signal_all(stack, workers, signal.SIGCONT)
    if stack.component("s3").pid is None:
        await asyncio.to_thread(stack.start, "s3")


@pytest.mark.timeout(240)
async def test_s3_down_briefly_delays_documents_and_dead_letters_none(mesh: Mesh, stack: Stack) -> None:
    """An outage shorter than the transient retry window costs no attempt: the documents wait
    (queued, with the reason) and are indexed once S3 is back."""
    collection = new_collection()
    doc_ids = [f"s3b-{i:02d}.md" for i in range(8)]
    workers = await submit_with_s3_down(mesh, stack, collection, doc_ids)
    try:
        signal_all(stack, workers, signal.SIGCONT)
        await asyncio.sleep(5)
        waiting = await mesh.statuses(collection, doc_ids)
        assert {s.state for s in waiting.values()} <= {
            ingestion_pb2.DOCUMENT_STATE_QUEUED,
            ingestion_pb2.DOCUMENT_STATE_PROCESSING,
        }, waiting
    finally:
        await restart_s3(stack, workers)
    await assert_all_indexed_and_searchable(mesh, collection, doc_ids)
    assert await dead_letters(mesh, collection) == []


@pytest.mark.timeout(240)
async def test_s3_down_past_the_window_dead_letters_then_replay_indexes_everything(
    mesh: Mesh, stack: Stack
) -> None:
    collection = new_collection()
    doc_ids = [f"s3-{i:02d}.md" for i in range(12)]
    workers = await submit_with_s3_down(mesh, stack, collection, doc_ids)
    try:
        signal_all(stack, workers, signal.SIGCONT)
        # The window is 15 s here (TEST_ENV); the timeout is for a busy host.
        statuses = await mesh.wait_settled(collection, doc_ids, timeout=120)
        assert {s.state for s in statuses.values()} == {FAILED}, statuses
        # Retried for the whole window (an unreachable S3 is not the document's fault; a
        # permanent failure is dead-lettered on its first attempt), then given up with why.
        assert all(s.attempts >= 2 for s in statuses.values()), statuses
        assert all("object store unavailable for more than" in s.reason for s in statuses.values()), statuses
    finally:
        await restart_s3(stack, workers)

    letters = await dead_letters(mesh, collection)
    assert sorted(d.doc_id for d in letters) == doc_ids
    assert all(d.attempts >= 2 and "object store" in d.reason and d.collection == collection for d in letters)

    replay = await mesh.ingestion.ReplayDeadLetters(
        ingestion_pb2.ReplayDeadLettersRequest(collection=collection), timeout=30
    )
    assert (replay.replayed, replay.superseded, replay.next_after_sequence) == (len(doc_ids), 0, 0)
    await assert_all_indexed_and_searchable(mesh, collection, doc_ids)
    assert await dead_letters(mesh, collection) == []


# --- NATS -----------------------------------------------------------------------------------


async def ingest_retrying_unavailable(
    mesh: Mesh, collection: str, docs: list[tuple[str, str]], timeout: float = 30.0
) -> int:
    """Submit, retrying UNAVAILABLE (the API's "retry the call" while it reconnects to NATS);
    returns how many attempts it took."""
    deadline = time.monotonic() + timeout
    for attempt in itertools.count(1):
        try:
            await mesh.ingest(collection, docs)
            return attempt
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def restart_nats(stack: Stack) -> None:
    """SIGKILL: a crash of the server process (not of the host, so what JetStream acknowledged
    is in its file store's page cache), then a start on the same port and data directory."""
    await asyncio.to_thread(stack.kill, "nats", signal.SIGKILL)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(stack.start, "nats")


def pids_of(stack: Stack, names: list[str]) -> dict[str, int | None]:
    return {name: stack.component(name).pid for name in names}


@pytest.mark.timeout(180)
async def test_nats_killed_and_restarted_consumers_resume(mesh: Mesh, stack: Stack) -> None:
    collection = new_collection()
    before = [f"pre-{i:02d}.md" for i in range(10)]
    after = [f"post-{i:02d}.md" for i in range(10)]
    clients = pids_of(stack, ["ingestion", *workers_of(stack)])
    await mesh.ingest(collection, [(d, note(d, i)) for i, d in enumerate(before)])
    await mesh.wait_settled(collection, before, timeout=60)

    await restart_nats(stack)
    await ingest_retrying_unavailable(mesh, collection, [(d, note(d, i)) for i, d in enumerate(after)])
    await assert_all_indexed_and_searchable(mesh, collection, before + after, timeout=60)
    # The same processes did it: they reconnected by themselves, nobody restarted them.
    assert pids_of(stack, list(clients)) == clients


# NATS killed while a batch runs: this found a worker that hung for good (its heartbeat
# swallowed the cancellation inside nats-py; see the worker's _heartbeat).
@pytest.mark.timeout(180)
async def test_nats_killed_mid_batch_loses_nothing(mesh: Mesh, stack: Stack) -> None:
    collection = new_collection()
    doc_ids = [f"mid-{i:02d}.md" for i in range(30)]
    await mesh.ingest(collection, [(d, note(d, i)) for i, d in enumerate(doc_ids)])
    # JetStream writes what it acknowledged to its files within milliseconds; the worker is
    # in the middle of the batch by then.
    await asyncio.sleep(0.5)
    await restart_nats(stack)
    try:
        await assert_all_indexed_and_searchable(mesh, collection, doc_ids, timeout=45)
    except AssertionError:
        # A wedged worker would hold its events for the rest of the session: restart it so the
        # tests after this one run on a healthy stack.
        for name in workers_of(stack):
            await asyncio.to_thread(stack.kill, name, signal.SIGKILL)
            await asyncio.to_thread(stack.start, name)
        raise


# --- SIGKILL of one replica under load --------------------------------------------------------

# Stateless stages the gateway reaches through one round-robin channel over every replica, and
# the load that exercises each: a failure of any of them shows as a degradation of the answer.
REPLICATED = {
    "embedder": "search",
    # The gateway plans in process unless HyDE is asked for: such searches reach the planner.
    "planner": "hyde_search",
    "reranker": "search",
    "extractor": "ask",
    "narrator": "ask",
}
CONCURRENCY = 4
# Calls that must complete before the kill (warm-up) and after it; bounded by PHASE_TIMEOUT_S.
CALLS_PER_PHASE = CONCURRENCY
PHASE_TIMEOUT_S = 60.0
SEARCH_TIMEOUT_S = 30.0
ASK_TIMEOUT_S = 60.0
QUERIES = [
    QUESTION,
    "caloric restriction and DNA methylation",
    "epigenetic clock in ageing mice",
    "methylation age of rhesus monkeys",
]


@pytest.fixture(scope="module")
async def replica_corpus(stack: Stack) -> AsyncIterator[str]:
    if "gateway" not in stack.services:
        pytest.skip("the gateway service is not in this checkout")
    mesh = Mesh(stack)
    try:
        collection = new_collection()
        request = ingestion_pb2.IngestDocumentsRequest(collection=collection, documents=RERANK_DOCS)
        await mesh.ingestion.IngestDocuments(request, timeout=30)
        statuses = await mesh.wait_settled(collection, [d.doc_id for d in RERANK_DOCS])
        assert all(s.state == INDEXED for s in statuses.values()), statuses
        yield collection
    finally:
        await mesh.close()


def problem_of(degradations: list[pb.Degradation], results: int) -> str | None:
    """None for a whole answer; a degraded or empty one is a failure of the stage."""
    if degradations:
        return "degraded: " + "; ".join(
            f"{pb.Stage.Name(d.stage)} {pb.DegradationReason.Name(d.reason)} {d.message}"
            for d in degradations
        )
    return None if results else "no results"


def load_for(
    gateway: gateway_pb2_grpc.GatewayServiceStub, collection: str, load: str
) -> Callable[[], Awaitable[str | None]]:
    queries = itertools.cycle(QUERIES)

    async def search() -> str | None:
        request = pb.SearchRequest(collection=collection, query=next(queries), top_k=5, rerank=True)
        if load == "hyde_search":
            request.hyde_mode = planner_pb2.HYDE_MODE_FUSION
        reply = await gateway.Search(request, timeout=SEARCH_TIMEOUT_S, wait_for_ready=True)
        problem = problem_of(list(reply.degradations), len(reply.results))
        return problem or (None if reply.reranked else "not reranked")

    async def ask() -> str | None:
        request = pb.AskRequest(collection=collection, query=next(queries), mode=pb.ANSWER_MODE_EXTRACTIVE)
        reply = await gateway.Ask(request, timeout=ASK_TIMEOUT_S, wait_for_ready=True)
        return problem_of(list(reply.degradations), len(reply.sources))

    return ask if load == "ask" else search


async def until(condition: Callable[[], bool], what: str, timeout: float = PHASE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        await asyncio.sleep(0.1)


def served(mesh: Mesh, name: str) -> float:
    """RPCs a component has handled since it started (health checks are not counted)."""
    return mesh.metric(name, "ragmesh_rpc_requests_total")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", list(REPLICATED))
async def test_sigkill_one_replica_under_load_routes_around_it(
    kind: str,
    stack: Stack,
    replica_corpus: str,
    gateway: gateway_pb2_grpc.GatewayServiceStub,
    mesh: Mesh,
    record_property: Callable[[str, object], None],
) -> None:
    replicas = replicas_of(stack, kind)
    if len(replicas) < 2:
        pytest.skip(
            f"the stack runs {len(replicas)} {kind} replica(s); start it with replicas={{{kind!r}: 2}}"
        )
    victim = replicas[-1]
    load = REPLICATED[kind]
    work = load_for(gateway, replica_corpus, load)
    log = CallLog()
    stop = asyncio.Event()
    loops = [asyncio.create_task(drive(log, load, work, stop)) for _ in range(CONCURRENCY)]
    try:
        await until(
            lambda: len(log.finished_since(0.0)) >= CALLS_PER_PHASE and served(mesh, victim) > 0,
            f"{CALLS_PER_PHASE} calls before the kill, some served by {victim}",
        )
        assert not log.failed(), [c.problem for c in log.failed()]
        kill_started = time.monotonic()
        await asyncio.to_thread(stack.kill, victim, signal.SIGKILL)
        kill_done = time.monotonic()
        await until(
            lambda: len(log.finished_since(kill_done)) >= CALLS_PER_PHASE,
            f"{CALLS_PER_PHASE} calls after the kill",
        )
    finally:
        stop.set()
        # Each call is bounded by its own deadline, so this ends.
        await asyncio.gather(*loops)
    try:
        at_kill = log.in_flight_during(kill_started, kill_done)
        failed = log.failed()
        # Only calls that were running when the replica died may fail; every later call was
        # routed to the live replica (or retried there).
        record_property("in_flight_at_kill", len(at_kill))
        record_property("failed", [c.problem for c in failed])
        running = {id(c) for c in at_kill}
        late = [(round(c.started - kill_done, 3), c.problem) for c in failed if id(c) not in running]
        assert not late, f"calls started after the kill failed (s after the kill, why): {late}"
        # Results kept coming: every call started after the kill answered in full.
        after = log.finished_since(kill_done)
        assert len(after) >= CALLS_PER_PHASE and all(c.problem is None for c in after)
    finally:
        await asyncio.to_thread(stack.start, victim)

    # Restarted, the replica gets its share again (the gateway reconnects on its own).
    deadline = time.monotonic() + 30
    while served(mesh, victim) == 0:
        assert time.monotonic() < deadline, f"{victim} got no traffic within 30s of its restart"
        call = await log.run(load, work)
        assert call.problem is None, call.problem
