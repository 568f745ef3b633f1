"""The CLI without servers: address resolution, tables, config listing, the submit loop and the
--wait loop against a fake IngestionService (served in-process, called through ragmesh_client)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh_cli import ingest, procutil
from ragmesh_cli.config import settings_rows
from ragmesh_cli.documents import WalkStats
from ragmesh_cli.main import build_parser, format_table, main, resolve_address
from ragmesh_cli.stack import STATE_FILE, STATE_VERSION, Stack

from .fake_ingestion import serve


def fake_detect(filename: str, content: bytes) -> int | None:
    return ingestion_pb2.DOCUMENT_FORMAT_TEXT if filename.endswith(".txt") else None


def _write_state(state_dir: Path, ingestion_port: int) -> None:
    procutil.write_json_atomic(
        state_dir / STATE_FILE,
        {
            "version": STATE_VERSION,
            "workers": 1,
            "index_shards": 1,
            "services": ["ingestion"],
            "extra_env": {},
            "components": [
                {"name": "ingestion", "kind": "ingestion", "ports": {"main": ingestion_port, "metrics": 1}},
            ],
        },
    )


def test_address_env_beats_stack_json_beats_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGMESH_INGESTION_ADDRESS", raising=False)
    assert resolve_address("ingestion", tmp_path) == "127.0.0.1:50054"
    _write_state(tmp_path, 41234)
    assert resolve_address("ingestion", tmp_path) == "127.0.0.1:41234"
    monkeypatch.setenv("RAGMESH_INGESTION_ADDRESS", "remote:9000")
    assert resolve_address("ingestion", tmp_path) == "remote:9000"


def test_load_reads_the_recorded_stack(tmp_path: Path) -> None:
    _write_state(tmp_path, 41234)
    stack = Stack.load(tmp_path)
    assert stack.address("ingestion") == "127.0.0.1:41234"
    assert stack.services == ["ingestion"]
    assert [s.alive for s in stack.status()] == [False]


def test_format_table_aligns_columns() -> None:
    table = format_table(["A", "LONGER"], [("xxxx", 1), ("y", None)])
    assert table.splitlines() == ["A     LONGER", "xxxx  1", "y"]


def test_settings_rows_cover_every_class_once() -> None:
    rows = {r["env"]: r for r in settings_rows()}
    assert rows["RAGMESH_PORT"]["section"] == "MeshSettings"
    assert rows["RAGMESH_INDEX_SHARD_COUNT"]["default"] == 1
    assert rows["RAGMESH_INGEST_WORKER_ID"]["section"] == "IngestionSettings"
    assert rows["RAGMESH_EMBEDDER_MODEL_PATH"]["default"]  # default_factory is evaluated
    assert all(r["description"] for r in rows.values())


def test_config_never_echoes_a_secret(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGMESH_S3_SECRET_KEY", "hunter2-very-secret")
    monkeypatch.setenv("RAGMESH_LOG_LEVEL", "DEBUG")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out
    assert "RAGMESH_LOG_LEVEL=INFO" in out and "[set: DEBUG]" in out
    assert main(["config", "--json"]) == 0
    assert any(r["env"] == "RAGMESH_SHUTDOWN_GRACE_S" for r in json.loads(capsys.readouterr().out))


def test_parser_shapes() -> None:
    args = build_parser().parse_args(["ingest", "a", "b", "--collection", "c", "--wait", "--state-dir", "/s"])
    assert (args.paths, args.collection, args.wait, args.state_dir) == (["a", "b"], "c", True, "/s")
    args = build_parser().parse_args(["dlq", "replay", "--seq", "3", "5"])
    assert args.seq == [3, 5]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["delete", "doc"])  # --collection is required


class FakeStub:
    """IngestionService: every document is queued except ids starting with 'same'; documents
    index one poll after submission; ids starting with 'bad' fail."""

    def __init__(self) -> None:
        self.requests: list[ingestion_pb2.IngestDocumentsRequest] = []
        self.concurrent = 0
        self.max_concurrent = 0
        self.polls = 0

    async def IngestDocuments(self, request: Any, **_: Any) -> Any:
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        await asyncio.sleep(0.01)
        self.concurrent -= 1
        self.requests.append(request)
        unchanged = ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED
        queued = ingestion_pb2.SUBMIT_OUTCOME_QUEUED
        return ingestion_pb2.IngestDocumentsResponse(
            results=[
                ingestion_pb2.SubmitResult(
                    doc_id=d.doc_id, outcome=unchanged if d.doc_id.startswith("same") else queued
                )
                for d in request.documents
            ]
        )

    async def GetCollectionStatus(self, request: Any, **_: Any) -> Any:
        self.polls += 1
        pending = 0 if self.polls > 1 else 3
        return ingestion_pb2.GetCollectionStatusResponse(collection=request.collection, queued=pending)

    async def GetDocumentStatus(self, request: Any, **_: Any) -> Any:
        def state(doc_id: str) -> int:
            return (
                ingestion_pb2.DOCUMENT_STATE_FAILED
                if doc_id.startswith("bad")
                else ingestion_pb2.DOCUMENT_STATE_INDEXED
            )

        return ingestion_pb2.GetDocumentStatusResponse(
            documents=[
                ingestion_pb2.DocumentStatus(
                    doc_id=i, state=state(i), reason="boom" if i.startswith("bad") else ""
                )
                for i in request.doc_ids
            ]
        )


def _corpus(path: Path, ids: list[str]) -> Path:
    path.write_text("".join(json.dumps({"_id": i, "title": "", "text": f"text {i}"}) + "\n" for i in ids))
    return path


async def test_submit_batches_with_bounded_concurrency(tmp_path: Path) -> None:
    ids = [f"d{i}" for i in range(50)] + ["same1", "same2"]
    stub = FakeStub()
    async with serve(stub) as client:
        result = await ingest.submit(
            client,
            "c",
            [_corpus(tmp_path / "corpus.jsonl", ids)],
            fake_detect,
            WalkStats(),
            max_in_flight=3,
            max_docs=5,
        )
    assert (result.submitted, result.queued, result.unchanged) == (52, 50, 2)
    assert sorted(result.queued_ids) == sorted(ids[:50])
    assert len(stub.requests) == 11
    assert all(r.collection == "c" for r in stub.requests)
    assert 1 < stub.max_concurrent <= 3


async def test_wait_reports_failed_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "POLL_INTERVAL_S", 0.01)
    async with serve(FakeStub()) as client:
        statuses = await ingest.wait_indexed(client, "c", ["ok1", "bad1"], timeout_s=5)
    assert statuses is not None
    failed = [s.doc_id for s in statuses if s.state == "failed"]
    assert failed == ["bad1"]


async def test_wait_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    class NeverDone(FakeStub):
        async def GetCollectionStatus(self, request: Any, **_: Any) -> Any:
            return ingestion_pb2.GetCollectionStatusResponse(processing=1)

    monkeypatch.setattr(ingest, "POLL_INTERVAL_S", 0.01)
    async with serve(NeverDone()) as client:
        assert await ingest.wait_indexed(client, "c", ["x"], timeout_s=0.05) is None


def test_grpc_errors_print_code_and_exit_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens on this port: the call fails with UNAVAILABLE.
    (port,) = procutil.free_ports(1)
    monkeypatch.setenv("RAGMESH_INGESTION_ADDRESS", f"127.0.0.1:{port}")
    assert main(["delete", "x", "--collection", "c", "--state-dir", str(tmp_path)]) == 1
    assert "error: UNAVAILABLE" in capsys.readouterr().err


def test_ingest_unknown_explicit_file_fails_before_sending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (port,) = procutil.free_ports(1)
    monkeypatch.setenv("RAGMESH_INGESTION_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.setattr(ingest, "load_detector", lambda: fake_detect)
    (tmp_path / "x.bin").write_bytes(b"\0")
    assert main(["ingest", str(tmp_path / "x.bin"), "--state-dir", str(tmp_path)]) == 1
    assert "unsupported format" in capsys.readouterr().err
