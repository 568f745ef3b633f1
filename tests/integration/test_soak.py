"""A soak of mixed traffic on the local stack: concurrent ingestion of new documents, searches
(reranked) and Asks, for RAGMESH_SOAK_SECONDS (default 60, what CI runs). At the end every
ingested document must be indexed and found (zero lost), no call may have failed or come back
degraded (zero unexpected errors), and the resident memory of every process of the stack is
reported at the start and the end, with a generous bound that catches a leak, not noise.

Asks run in the EXTRACTIVE mode: the local LLM (SmolLM2 on CPU) takes seconds per answer and
would turn the soak into a test of the LLM's queue; the extractive path still goes through
search, rerank, the extractor and the narrator. Concurrency is small and fixed (one ingester,
two searchers, one asker) so a 2-core CI host copes, and every deadline is generous: a
DEADLINE_EXCEEDED is counted as an error like any other.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ragmesh.gateway.v1 import gateway_pb2 as pb
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh.sparse.v1 import sparse_pb2
from ragmesh_cli.stack import Stack

from .meshclients import CallLog, Mesh, drive, stack_rss_kib
from .test_ingest import INDEXED, new_collection

pytestmark = pytest.mark.integration

SOAK_S = float(os.environ.get("RAGMESH_SOAK_SECONDS", "60"))
ASK_SERVICES = {"extractor", "narrator"}
SEARCHERS = 2
INGEST_BATCH = 4
INGEST_PAUSE_S = 1.0
SEARCH_TIMEOUT_S = 30.0
ASK_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 150.0
# A process may grow this much and no more: 3x its starting RSS plus 200 MB. Caches fill and
# allocators keep pages, so only a real leak goes past it in a minute.
GROWTH_FACTOR, GROWTH_SLACK_KIB = 3, 200 * 1024
# Every soak document holds this word (and a marker of its own).
COMMON = "soakdoc"
SUBJECTS = [
    ("Volcanoes", "Magma rises through vents and erupts as lava; basalt flows cool into new rock."),
    ("Sourdough", "A starter culture of wild yeast leavens the dough during a long fermentation."),
    ("Tides", "The moon's gravity pulls the oceans, raising high tides twice a day on most coasts."),
    ("Glaciers", "Compacted snow turns to ice that flows downhill and carves U-shaped valleys."),
    ("Deserts", "Wind shapes sand into dunes; rain is rare and evaporation exceeds precipitation."),
    ("Coral reefs", "Coral polyps build limestone skeletons in warm, shallow, clear tropical water."),
]
QUESTIONS = [
    "How does lava come out of a volcano?",
    "What makes sourdough bread rise?",
    "Why are there two high tides a day?",
    "How do glaciers shape valleys?",
    "How are sand dunes formed?",
    "Where do coral reefs grow?",
]


def document(n: int) -> tuple[str, str]:
    title, body = SUBJECTS[n % len(SUBJECTS)]
    doc_id = f"soak-{n:05d}.md"
    return doc_id, f"# {title} {n}\n\n{body} This {COMMON} note has the marker mk{n:05d}soak."


@pytest.fixture
async def mesh(stack: Stack) -> AsyncIterator[Mesh]:
    clients = Mesh(stack)
    yield clients
    await clients.close()


def degraded(degradations: list[pb.Degradation], stack: Stack) -> str | None:
    # A checkout without the planner service loses the plan: expected there, nowhere else.
    allowed = set() if "planner" in stack.services else {pb.STAGE_PLANNER}
    found = [d for d in degradations if d.stage not in allowed]
    if not found:
        return None
    return "degraded: " + "; ".join(
        f"{pb.Stage.Name(d.stage)} {pb.DegradationReason.Name(d.reason)} {d.message}" for d in found
    )


def memory_report(start: dict[str, int | None], end: dict[str, int | None]) -> list[dict[str, object]]:
    return [
        {
            "component": name,
            "start_mib": round((start[name] or 0) / 1024, 1),
            "end_mib": round((end.get(name) or 0) / 1024, 1),
        }
        for name in start
    ]


@pytest.mark.timeout(int(SOAK_S) + 240)
async def test_mixed_soak_loses_nothing_and_fails_nothing(
    stack: Stack,
    mesh: Mesh,
    gateway: gateway_pb2_grpc.GatewayServiceStub,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "gateway" not in stack.services:
        pytest.skip("the gateway service is not in this checkout")
    collection = new_collection()
    # Something to find from the first search on.
    seed = [document(n) for n in range(len(SUBJECTS))]
    await mesh.ingest(collection, seed)
    statuses = await mesh.wait_settled(collection, [d for d, _ in seed])
    assert {s.state for s in statuses.values()} == {INDEXED}, statuses

    submitted = [d for d, _ in seed]
    numbers = itertools.count(len(seed))
    questions = itertools.cycle(QUESTIONS)
    log = CallLog()

    async def ingest() -> str | None:
        batch = [document(next(numbers)) for _ in range(INGEST_BATCH)]
        reply = await mesh.ingest(collection, batch)
        submitted.extend(d for d, _ in batch)
        outcomes = {r.outcome for r in reply.results}
        return None if outcomes == {ingestion_pb2.SUBMIT_OUTCOME_QUEUED} else f"outcomes {outcomes}"

    async def search() -> str | None:
        request = pb.SearchRequest(collection=collection, query=next(questions), top_k=5)
        reply = await gateway.Search(request, timeout=SEARCH_TIMEOUT_S)
        return degraded(list(reply.degradations), stack) or (None if reply.results else "no results")

    async def ask() -> str | None:
        request = pb.AskRequest(collection=collection, query=next(questions), mode=pb.ANSWER_MODE_EXTRACTIVE)
        reply = await gateway.Ask(request, timeout=ASK_TIMEOUT_S)
        problem = degraded(list(reply.degradations), stack)
        return problem or (None if reply.mode == pb.ANSWER_MODE_EXTRACTIVE else "not extractive")

    memory_start = stack_rss_kib(stack)
    started = time.monotonic()
    stop = asyncio.Event()
    loops = [
        drive(log, "ingest", ingest, stop, pause_s=INGEST_PAUSE_S),
        *(drive(log, "search", search, stop) for _ in range(SEARCHERS)),
    ]
    if set(stack.services) >= ASK_SERVICES:
        loops.append(drive(log, "ask", ask, stop))
    tasks = [asyncio.create_task(loop) for loop in loops]
    try:
        await asyncio.sleep(SOAK_S)
    finally:
        stop.set()
        # Every call is bounded by its own deadline, so this ends.
        await asyncio.gather(*tasks)
    load_s = time.monotonic() - started

    statuses = await mesh.wait_settled(collection, submitted, timeout=SETTLE_TIMEOUT_S)
    settled_s = time.monotonic() - started
    memory_end = stack_rss_kib(stack)

    summary = log.summary()
    memory = memory_report(memory_start, memory_end)
    report = {
        "soak_s": SOAK_S,
        "load_s": round(load_s, 1),
        "settled_s": round(settled_s, 1),
        "documents": len(submitted),
        "calls": summary,
        "failures": [f"{c.kind}: {c.problem}" for c in log.failed()][:20],
        "memory": memory,
    }
    (tmp_path / "soak-report.json").write_text(json.dumps(report, indent=2))
    record_property("soak", json.dumps(report))
    with capsys.disabled():
        print(f"\nsoak report ({tmp_path / 'soak-report.json'}):")
        print(json.dumps({k: v for k, v in report.items() if k != "memory"}))
        for row in memory:
            print(
                f"  rss {row['component']:<12} start {row['start_mib']:>8} MiB  end {row['end_mib']:>8} MiB"
            )

    # Zero unexpected errors, and the load really ran.
    assert not log.failed(), report["failures"]
    assert summary["ingest"]["ok"] >= SOAK_S / (INGEST_PAUSE_S * 4), summary
    assert summary["search"]["ok"] >= SOAK_S / 10, summary

    # Zero lost documents: each one indexed, in both stores, and found by the sparse store.
    lost = {d: ingestion_pb2.DocumentState.Name(s.state) for d, s in statuses.items() if s.state != INDEXED}
    assert not lost, lost
    assert sorted(statuses) == sorted(submitted)
    chunks = sum(s.chunks for s in statuses.values())
    counts = await mesh.ingestion.GetCollectionStatus(
        ingestion_pb2.GetCollectionStatusRequest(collection=collection), timeout=10
    )
    assert (counts.indexed, counts.chunks) == (len(submitted), chunks), counts
    assert await mesh.index_chunks(collection) == chunks
    sparse = await mesh.sparse_stats(collection)
    assert (sparse.documents, sparse.chunks) == (len(submitted), chunks)
    found: set[str] = set()
    for i in range(0, len(submitted), 500):
        reply = await mesh.sparse.SearchExact(
            sparse_pb2.SearchExactRequest(
                collection=collection, keywords=[COMMON], top_k=1000, doc_ids=submitted[i : i + 500]
            ),
            timeout=10,
        )
        found.update(h.doc_id for h in reply.hits)
    assert found == set(submitted)

    # No process leaked memory; none died.
    for name, before in memory_start.items():
        after = memory_end.get(name)
        assert after is not None, f"{name} is no longer running"
        if before is not None:
            assert after <= GROWTH_FACTOR * before + GROWTH_SLACK_KIB, f"{name}: {before} KiB -> {after} KiB"
