"""The client's ingest outcomes (per-document rejection), document listing and reindex driving,
against the in-process fake of the ingestion API."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import grpc
import pytest

from ragmesh_client import (
    AsyncClient,
    Client,
    CollectionCalibration,
    Document,
    DocumentsRejectedError,
    InvalidArgumentError,
    ReindexProgress,
    RetryPolicy,
    UnavailableError,
)

from .fakemesh import FakeMesh

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05)
GOOD, EMPTY = Document("good.md", "# Good\n\ntext", format="markdown"), Document("empty.md", "")


@pytest.fixture
def mesh() -> Iterator[FakeMesh]:
    fake = FakeMesh()
    yield fake
    fake.stop()


@pytest.fixture
def client(mesh: FakeMesh) -> Iterator[Client]:
    with Client(mesh.address, ingestion=mesh.address, retry=FAST_RETRY) as c:
        yield c


# ---------------------------------------------------------------------------- ingest outcomes


def test_a_rejected_document_is_reported_with_its_reason(client: Client) -> None:
    result = client.ingest("docs", [GOOD, EMPTY])
    assert [(s.doc_id, s.outcome) for s in result] == [("good.md", "queued"), ("empty.md", "rejected")]
    assert [(s.doc_id, s.reason) for s in result.rejected] == [("empty.md", "empty document")]
    assert [s.doc_id for s in result.accepted] == [s.doc_id for s in result.queued] == ["good.md"]
    assert result[0].reason == ""


def test_nothing_accepted_raises_with_every_reason(client: Client) -> None:
    with pytest.raises(DocumentsRejectedError) as caught:
        client.ingest("docs", [EMPTY, Document("blank.txt", b"")], on_rejected="raise_if_none_accepted")
    error = caught.value
    assert isinstance(error, InvalidArgumentError) and error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [s.doc_id for s in error.rejected] == ["empty.md", "blank.txt"]
    assert "2 of 2 documents rejected" in error.message and "blank.txt: empty document" in error.message
    # Some accepted: no error, the rejected ones are in the result.
    result = client.ingest("docs", [GOOD, EMPTY], on_rejected="raise_if_none_accepted")
    assert [s.doc_id for s in result.rejected] == ["empty.md"]


def test_raise_on_any_rejection_still_reports_what_was_queued(client: Client) -> None:
    with pytest.raises(DocumentsRejectedError) as caught:
        client.ingest("docs", [GOOD, EMPTY], on_rejected="raise")
    assert [s.doc_id for s in caught.value.result.queued] == ["good.md"]
    assert client.ingest("docs", [GOOD], on_rejected="raise").queued


def test_an_unknown_rejection_policy_is_refused_before_any_call(mesh: FakeMesh, client: Client) -> None:
    with pytest.raises(ValueError, match="on_rejected"):
        client.ingest("docs", [GOOD], on_rejected="ignore")  # type: ignore[arg-type]
    assert mesh.script.attempts("IngestDocuments") == 0


# ---------------------------------------------------------------------------- listing


def test_list_documents_walks_every_page(mesh: FakeMesh, client: Client) -> None:
    mesh.script.documents = [f"d{i}" for i in range(7)]
    listed = list(client.list_documents("docs", page_size=3))
    assert [d.doc_id for d in listed] == [f"d{i}" for i in range(7)]
    assert listed[0].state == "indexed" and listed[0].source_uri == "file:///d0"
    assert mesh.script.attempts("ListDocuments") == 3


def test_list_documents_by_source_prefix(mesh: FakeMesh, client: Client) -> None:
    mesh.script.documents = ["a/x.md", "a/y.md", "b/z.md"]
    assert [d.doc_id for d in client.list_documents("docs", source_prefix="file:///a/")] == [
        "a/x.md",
        "a/y.md",
    ]
    assert list(client.list_documents("docs", source_prefix="file:///c/")) == []


def test_list_documents_is_retried_and_checks_its_page_size(mesh: FakeMesh, client: Client) -> None:
    mesh.script.documents = ["a"]
    mesh.script.outcomes = [UNAVAILABLE]
    assert [d.doc_id for d in client.list_documents("docs")] == ["a"]
    assert mesh.script.attempts("ListDocuments") == 2
    with pytest.raises(ValueError, match="page_size"):
        next(iter(client.list_documents("docs", page_size=0)))


# ---------------------------------------------------------------------------- reindex


def test_reindex_steps_until_done_with_progress(mesh: FakeMesh, client: Client) -> None:
    seen: list[ReindexProgress] = []
    final = client.reindex("docs", on_progress=seen.append, interval_s=0.01)
    assert final.done and final.serving_generation == 2
    assert [p.phase for p in seen] == ["building", "building", "building", "retiring", "done"]
    assert [p.indexed for p in seen[:3]] == [2, 4, 5] and seen[0].documents == 5
    # Only the first step starts a reindex; the others advance the one in progress.
    assert mesh.script.reindex_calls == [("docs", True)] + [("docs", False)] * 4


def test_one_reindex_step_reports_where_it_stands(mesh: FakeMesh, client: Client) -> None:
    assert client.reindex_step("docs").done  # nothing in progress, nothing started
    step = client.reindex_step("docs", start=True)
    assert (step.phase, step.other_generation, step.pending, step.building_model) == (
        "building",
        2,
        3,
        "minilm",
    )
    assert not step.stuck_on_failures


def test_reindex_step_is_retried_like_a_read(mesh: FakeMesh, client: Client) -> None:
    mesh.script.outcomes = [UNAVAILABLE, UNAVAILABLE]
    assert client.reindex_step("docs", start=True).phase == "building"
    assert mesh.script.attempts("ReindexCollection") == 3


def test_a_calibration_is_sent_whole_retried_and_read_back(mesh: FakeMesh, client: Client) -> None:
    sent = CollectionCalibration(
        rerank=False,
        weights={"dense": 1.0, "bm25": 0.5, "exact": 0.0},
        keep_fused_margin=2.0,
        queries=120,
        documents=100,
        # Exact in float32, the contract's type.
        measured={"fused": 0.5, "reranked": 0.375},
        rerank_gain=-0.125,
        rerank_gain_low=-0.25,
        rerank_gain_high=-0.0625,
        method="pseudo-queries/v1",
    )
    mesh.script.outcomes = [UNAVAILABLE]
    recorded = client.set_collection_calibration("docs", sent)
    assert mesh.script.attempts("SetCollectionCalibration") == 2
    assert recorded is not None and recorded.embedder_sha256 == "e" * 64
    assert recorded.calibrated_at is not None and recorded.calibrated_at.year == 2023
    assert replace(recorded, calibrated_at=None, embedder_sha256="") == sent
    request = mesh.script.calibrations[-1]
    assert request.collection == "docs" and not request.clear and request.calibration.weight_bm25 == 0.5
    assert client.set_collection_calibration("docs", None) is None
    assert mesh.script.calibrations[-1].clear


def test_reindex_rides_out_a_failing_step(mesh: FakeMesh) -> None:
    """With channel retries off, an unavailable API mid-run costs a retried step, not the run."""
    with Client(mesh.address, ingestion=mesh.address, retry=RetryPolicy(max_attempts=1)) as c:
        mesh.script.outcomes = [None, UNAVAILABLE]
        assert c.reindex("docs", interval_s=0.01).done
        with pytest.raises(UnavailableError):
            mesh.script.outcomes = [UNAVAILABLE] * 5
            c.reindex("docs", interval_s=0.01, step_retry_s=0.5)


def test_reindex_gives_up_after_its_timeout(mesh: FakeMesh, client: Client) -> None:
    mesh.script.reindex_per_step = 0  # never completes
    mesh.script.reindexed = 0
    with pytest.raises(TimeoutError, match="not complete"):
        client.reindex("docs", interval_s=0.05, timeout=0.3)
    with pytest.raises(ValueError, match="timeout"):
        client.reindex("docs", timeout=0)


async def test_async_list_documents_and_reindex(mesh: FakeMesh) -> None:
    mesh.script.documents = [f"d{i}" for i in range(5)]
    async with AsyncClient(mesh.address, ingestion=mesh.address) as c:
        assert [d.doc_id async for d in c.list_documents("docs", page_size=2)] == [f"d{i}" for i in range(5)]
        phases: list[str] = []
        final = await c.reindex("docs", on_progress=lambda p: phases.append(p.phase), interval_s=0.01)
        assert final.done and phases[-2:] == ["retiring", "done"]
        result = await c.ingest("docs", [GOOD, EMPTY])
        assert [s.reason for s in result.rejected] == ["empty document"]


# ---------------------------------------------------------------------------- filters


def test_every_filter_operator_of_the_contract_can_be_expressed() -> None:
    from ragmesh_client import EXISTS, Not
    from ragmesh_client._convert import search_request
    from ragmesh_client._pb.common.v1 import common_pb2

    request = search_request(
        "docs", "q", filter={"team": "ops", "tag": ["a", "b"], "status": Not("draft"), "weight": EXISTS}
    )
    clauses = [(c.key, c.op, list(c.values)) for c in request.filter.clauses]
    assert clauses == [
        ("team", common_pb2.FILTER_OP_EQ, ["ops"]),
        ("tag", common_pb2.FILTER_OP_IN, ["a", "b"]),
        ("status", common_pb2.FILTER_OP_NE, ["draft"]),
        ("weight", common_pb2.FILTER_OP_EXISTS, []),
    ]
