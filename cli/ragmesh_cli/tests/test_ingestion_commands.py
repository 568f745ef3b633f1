"""``ragmesh status --collection``, ``delete``, ``dlq list`` and ``dlq replay`` run on
ragmesh_client: the same flags and output as when they called raw stubs (tables, JSON, the
failure time as UTC ``...Z``, replay batch after batch until the cursor ends), the API key on
every call, and a transient UNAVAILABLE on a read retried."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli.main import main

FAILED_AT = datetime(2026, 12, 1, 9, 30, 5, 250000, tzinfo=UTC)


class Ingestion(ingestion_pb2_grpc.IngestionServiceServicer):
    def __init__(self) -> None:
        self.fail_next: list[grpc.StatusCode] = []
        self.calibration: ingestion_pb2.CollectionCalibration | None = None
        self.calls: list[tuple[str, dict[str, str], Any]] = []

    def _enter(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        self.calls.append((method, metadata, request))
        if self.fail_next:
            code = self.fail_next.pop(0)
            context.abort(code, f"scripted {code.name.lower()}")

    def GetCollectionStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("GetCollectionStatus", request, context)
        return ingestion_pb2.GetCollectionStatusResponse(
            collection=request.collection,
            queued=2,
            processing=1,
            indexed=40,
            failed=3,
            deleting=0,
            chunks=812,
            calibration=self.calibration,
        )

    def DeleteDocuments(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("DeleteDocuments", request, context)
        return ingestion_pb2.DeleteDocumentsResponse(queued=len(request.doc_ids))

    def ListDeadLetters(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("ListDeadLetters", request, context)
        failed_at = Timestamp()
        failed_at.FromDatetime(FAILED_AT)
        return ingestion_pb2.ListDeadLettersResponse(
            dead_letters=[
                ingestion_pb2.DeadLetter(
                    sequence=7,
                    collection=request.collection or "docs",
                    doc_id="broken.pdf",
                    reason="document produced no chunks",
                    attempts=5,
                    failed_at=failed_at,
                ),
                ingestion_pb2.DeadLetter(
                    sequence=9, collection="docs", doc_id="late.md", reason="r", attempts=1
                ),
            ][: request.limit]
        )

    def ReplayDeadLetters(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Explicit sequences in one call; else two batches, the cursor ending on the second."""
        self._enter("ReplayDeadLetters", request, context)
        if request.sequences:
            return ingestion_pb2.ReplayDeadLettersResponse(replayed=len(request.sequences))
        if request.after_sequence == 0:
            return ingestion_pb2.ReplayDeadLettersResponse(replayed=3, superseded=1, next_after_sequence=12)
        return ingestion_pb2.ReplayDeadLettersResponse(replayed=2, next_after_sequence=0)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[Ingestion]:
    servicer = Ingestion()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    ingestion_pb2_grpc.add_IngestionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("RAGMESH_INGESTION_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.setenv("RAGMESH_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("RAGMESH_API_KEY", "k-ops")
    yield servicer
    server.stop(None)


def test_status_of_a_collection_table_and_json(api: Ingestion, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--collection", "docs"]) == 0
    out = capsys.readouterr().out
    assert "collection 'docs'" in out
    rows = [line.split() for line in out.split("collection 'docs'")[1].strip().splitlines()]
    assert rows[0] == ["STATE", "COUNT"]
    assert [r for r in rows if len(r) == 2 and r[0] != "STATE"] == [
        ["indexed", "40"],
        ["queued", "2"],
        ["processing", "1"],
        ["failed", "3"],
        ["deleting", "0"],
        ["chunks", "812"],
    ]
    assert main(["status", "--collection", "docs", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["collection"] == "docs" and body["indexed"] == 40 and body["chunks"] == 812
    assert body["processes"] == []
    assert all(md.get("authorization") == "Bearer k-ops" for _, md, _ in api.calls)


def test_status_shows_the_collections_calibration(api: Ingestion, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--collection", "docs"]) == 0
    assert "calibration: none recorded" in capsys.readouterr().out
    calibrated_at = Timestamp()
    calibrated_at.FromDatetime(FAILED_AT)
    api.calibration = ingestion_pb2.CollectionCalibration(
        rerank=False,
        weight_dense=1.0,
        weight_bm25=0.5,
        queries=150,
        documents=150,
        measured={"fused": 0.612, "reranked": 0.587},
        rerank_gain=-0.025,
        rerank_gain_low=-0.04,
        rerank_gain_high=-0.01,
        method="pseudo-queries/v1",
        calibrated_at=calibrated_at,
        embedder_sha256="ab" * 32,
    )
    assert main(["status", "--collection", "docs"]) == 0
    out = capsys.readouterr().out
    assert "calibration (pseudo-queries/v1, 2026-12-01T09:30:05+00:00, embedder abababababab)" in out
    assert "rerank off; keep-fused margin server default; weights dense 1, bm25 0.5, exact 0" in out
    assert "fused 0.612, reranked 0.587" in out and "-0.025 [-0.040, -0.010]" in out
    assert main(["status", "--collection", "docs", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["calibration"]
    assert shown["rerank"] is False and shown["weights"] == {"dense": 1.0, "bm25": 0.5, "exact": 0.0}
    assert shown["keep_fused_margin"] is None and shown["queries"] == 150
    assert "has grown" not in out
    # Measured on 15 documents, the collection holds 40 now: status says to measure it again.
    api.calibration.documents = 15
    api.calibration.ClearField("weight_dense")
    api.calibration.ClearField("weight_bm25")
    assert main(["status", "--collection", "docs"]) == 0
    out = capsys.readouterr().out
    assert "has grown to 40 documents since: run `ragmesh calibrate` again" in out
    assert "weights server default" in out


def test_a_status_read_is_retried_on_unavailable(api: Ingestion, capsys: pytest.CaptureFixture[str]) -> None:
    api.fail_next = [grpc.StatusCode.UNAVAILABLE]
    assert main(["status", "--collection", "docs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["indexed"] == 40
    assert [c[0] for c in api.calls] == ["GetCollectionStatus"] * 2


def test_delete_prints_what_was_queued_and_is_not_retried(
    api: Ingestion, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["delete", "a.md", "b.md", "--collection", "docs"]) == 0
    assert capsys.readouterr().out == "queued 2 deletions in collection 'docs'\n"
    assert list(api.calls[0][2].doc_ids) == ["a.md", "b.md"]
    api.fail_next = [grpc.StatusCode.UNAVAILABLE]
    assert main(["delete", "a.md", "--collection", "docs"]) == 1
    assert capsys.readouterr().err.startswith("error: UNAVAILABLE: ")
    assert [c[0] for c in api.calls] == ["DeleteDocuments"] * 2


def test_dlq_list_table_and_json(api: Ingestion, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "list", "--collection", "docs", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert items[0] == {
        "sequence": 7,
        "collection": "docs",
        "doc_id": "broken.pdf",
        "attempts": 5,
        "reason": "document produced no chunks",
        "failed_at": "2026-12-01T09:30:05.250000Z",
    }
    assert items[1]["failed_at"] == ""
    assert main(["dlq", "list", "--limit", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SEQ", "COLLECTION", "DOC", "ID", "ATTEMPTS", "REASON", "TIME"]
    assert lines[-1].split()[:4] == ["7", "docs", "broken.pdf", "5"]
    assert lines[-1].endswith("2026-12-01T09:30:05.250000Z") and len(lines) == 2
    request = api.calls[-1][2]
    assert (request.collection, request.limit) == ("", 1)


def test_dlq_list_with_none(api: Ingestion, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "list", "--limit", "0"]) == 0
    assert capsys.readouterr().out == "no dead letters\n"


def test_dlq_replay_walks_every_batch_or_replays_given_sequences(
    api: Ingestion, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dlq", "replay", "--collection", "docs"]) == 0
    assert capsys.readouterr().out == "replayed 5 dead letters; dropped 1 superseded by newer versions\n"
    assert [c[2].after_sequence for c in api.calls] == [0, 12]
    assert main(["dlq", "replay", "--seq", "3", "5"]) == 0
    assert capsys.readouterr().out == "replayed 2 dead letters; dropped 0 superseded by newer versions\n"
    assert list(api.calls[-1][2].sequences) == [3, 5]
