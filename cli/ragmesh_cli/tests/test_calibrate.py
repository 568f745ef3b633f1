"""``ragmesh calibrate``: pseudo-queries from documents (titles, else a first sentence, in linear
time), the sample, the choice from the paired measurement, and the command end to end against
fake gateway and ingestion servers (plain grpc servers on a thread)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli import calibrate, metrics
from ragmesh_cli.main import main

from .test_search_eval import fake_servers, write_dataset  # noqa: F401 (fake_servers: a fixture)

INDEXED = ingestion_pb2.DOCUMENT_STATE_INDEXED


def test_a_title_of_a_few_words_is_the_query_a_file_name_is_not() -> None:
    title = "  Configuring   retries for\nclients "
    assert calibrate.usable_title(title) == "Configuring retries for clients"
    for bad in ("", "Retries", "two words", "guides/retry-policy.md here", "1234 5678 9012 3456", "w " * 41):
        assert calibrate.usable_title(bad) is None, bad


def test_the_first_sentence_of_a_usable_length() -> None:
    text = "Short one. ## A heading of some words\n\nThe body says more here. Then more."
    assert calibrate.first_sentence(text) == "A heading of some words"
    assert calibrate.first_sentence("No end but long enough words") == "No end but long enough words"
    assert calibrate.first_sentence("a. b. c.") is None
    assert calibrate.first_sentence("Version 1.2.3 is out now. Next.") == "Version 1.2.3 is out now."


def test_a_document_without_a_title_gives_a_sentence_and_one_without_either_nothing() -> None:
    assert calibrate.pseudo_query("d", "What is the service mesh", "x") == calibrate.PseudoQuery(
        "d", "What is the service mesh", "title"
    )
    made = calibrate.pseudo_query("d", "d.md", "Retries back off exponentially up to a cap.")
    assert made is not None and made.source == "sentence"
    assert calibrate.pseudo_query("d", "", "...") is None


def test_a_query_two_documents_share_has_no_known_answer_and_is_dropped() -> None:
    made = [
        calibrate.PseudoQuery("b", "Getting started with S3", "title"),
        calibrate.PseudoQuery("a", "getting started with s3", "title"),
        calibrate.PseudoQuery("c", "Bucket naming rules explained", "title"),
    ]
    assert [q.doc_id for q in calibrate.unambiguous(made)] == ["c"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=".?! \n#abc", max_size=3000))
def test_first_sentence_is_bounded_on_any_text(text: str) -> None:
    found = calibrate.first_sentence(text)
    if found is not None:
        assert len(found) <= calibrate.MAX_QUERY_CHARS
        assert calibrate.MIN_WORDS <= len(found.split()) <= calibrate.MAX_WORDS


def test_first_sentence_time_grows_linearly_on_pathological_text() -> None:
    """Separators and words that never make a usable sentence: one pass, whatever the length."""

    def cost(n: int) -> float:
        text = "a. " * n + "\n\n#| " * n
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            assert calibrate.first_sentence(text) is None
            best = min(best, time.perf_counter() - started)
        return best

    # Eight times the input: linear code takes about 8x as long, a quadratic step 64x.
    small, large = cost(2_000), cost(16_000)
    assert large < 24 * small + 0.05, (small, large)


def gain(mean: float, low: float, high: float) -> metrics.PairedBootstrap:
    return metrics.PairedBootstrap(
        queries=200,
        mean_a=0.9,
        mean_b=0.9 + mean,
        mean_diff=mean,
        ci_low=low,
        ci_high=high,
        confidence=0.95,
        resamples=10_000,
        p_value=0.5,
    )


@pytest.mark.parametrize(
    ("mean", "low", "high", "rerank"),
    [
        (-0.047, -0.071, -0.025, False),  # a loss beyond noise (CISI's titles): off
        (-0.003, -0.013, 0.004, True),  # at the ceiling, within noise (SciFact's titles): the default
        (0.0, 0.0, 0.0, True),  # no difference at all
        (0.05, 0.02, 0.08, True),
    ],
)
def test_only_a_loss_beyond_noise_turns_reranking_off(
    mean: float, low: float, high: float, rerank: bool
) -> None:
    found = calibrate.Measurement(200, 1000, {"fused": 0.9}, gain(mean, low, high), {"title": 200}, 0)
    assert found.rerank is rerank and found.calibration().rerank is rerank


class FakeMesh(gateway_pb2_grpc.GatewayServiceServicer, ingestion_pb2_grpc.IngestionServiceServicer):
    """Documents d000..: the fused list ranks each title's document 3rd, the reranked list first
    when ``reranker_helps`` (else 5th); documents past ``titled`` have no title."""

    def __init__(self, documents: int, *, reranker_helps: bool, titled: int | None = None) -> None:
        self.doc_ids = [f"d{i:03d}" for i in range(documents)]
        self.reranker_helps = reranker_helps
        self.titled = documents if titled is None else titled
        self.recorded: list[ingestion_pb2.SetCollectionCalibrationRequest] = []
        self.measured: list[gateway_pb2.SearchRequest] = []

    def ListDocuments(self, request: Any, context: grpc.ServicerContext) -> Any:
        after = [d for d in self.doc_ids if d > request.after_doc_id][: request.limit or 1000]
        more = after and after[-1] != self.doc_ids[-1]
        return ingestion_pb2.ListDocumentsResponse(
            documents=[ingestion_pb2.DocumentSummary(doc_id=d, state=INDEXED) for d in after],
            next_after_doc_id=after[-1] if more else "",
        )

    def SetCollectionCalibration(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.recorded.append(request)
        return ingestion_pb2.SetCollectionCalibrationResponse(
            calibration=None if request.clear else request.calibration
        )

    def _title(self, doc_id: str) -> str:
        return f"the page about {doc_id}" if self.doc_ids.index(doc_id) < self.titled else ""

    def Search(self, request: gateway_pb2.SearchRequest, context: grpc.ServicerContext) -> Any:
        if request.doc_ids:
            doc_id = request.doc_ids[0]
            result = gateway_pb2.SearchResult(
                chunk_id=f"{doc_id}#0",
                doc_id=doc_id,
                title=self._title(doc_id),
                text=f"Notes on {doc_id} for readers. More.",
            )
            return gateway_pb2.SearchResponse(results=[result])
        self.measured.append(request)
        answer = request.query.split()[-1]
        if answer not in self.doc_ids:  # a sentence: "Notes on dNNN for readers."
            answer = request.query.split()[2]
        others = [d for d in self.doc_ids if d != answer][:9]
        fused = [*others[:2], answer, *others[2:]]
        reranked = [answer, *others] if self.reranker_helps else [*others[:4], answer, *others[4:]]
        return gateway_pb2.SearchResponse(
            results=[gateway_pb2.SearchResult(chunk_id=f"{d}#0", doc_id=d) for d in reranked],
            fused_hits=[gateway_pb2.LegHit(chunk_id=f"{d}#0", doc_id=d) for d in fused],
        )


@pytest.fixture
def mesh(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMesh]:
    fake = FakeMesh(**request.param)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(fake, server)
    ingestion_pb2_grpc.add_IngestionServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("RAGMESH_GATEWAY_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.setenv("RAGMESH_INGESTION_ADDRESS", f"127.0.0.1:{port}")
    yield fake
    server.stop(None)


@pytest.mark.parametrize("mesh", [{"documents": 80, "reranker_helps": True, "titled": 60}], indirect=True)
def test_calibrate_measures_pseudo_queries_and_records_rerank_on(
    mesh: FakeMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", "--collection", "docs", "--queries", "50", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["queries"] == 50 and report["documents"] == 80 and report["rerank"] is True
    sources = report["query_sources"]
    assert sum(sources.values()) == 50 and set(sources) <= {"title", "sentence"}
    assert report["measured"]["reranked"] == pytest.approx(1.0)
    assert report["measured"]["fused"] == pytest.approx(0.5)  # rank 3: 1 / log2(4)
    assert report["reranked_vs_fused"]["ci_low"] > 0
    # Every measurement asked for reranking and the leg lists, whatever was recorded before.
    assert all(r.rerank and r.HasField("rerank") and r.include_leg_results for r in mesh.measured)
    (recorded,) = mesh.recorded
    calibration = recorded.calibration
    assert recorded.collection == "docs" and calibration.rerank and calibration.method == calibrate.METHOD
    assert (calibration.weight_dense, calibration.weight_bm25, calibration.weight_exact) == (0, 0, 0)
    assert calibration.queries == 50 and calibration.documents == 80
    assert calibration.rerank_gain == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("mesh", [{"documents": 40, "reranker_helps": False}], indirect=True)
def test_a_reranker_that_hurts_is_recorded_off_and_a_dry_run_records_nothing(
    mesh: FakeMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", "--collection", "docs", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "choice: rerank off" in out and "dry run: nothing recorded" in out
    assert "40 pseudo-queries (40 titles) from 40 documents" in out
    assert not mesh.recorded
    assert main(["calibrate", "--collection", "docs"]) == 0
    assert "rerank off" in capsys.readouterr().out
    assert mesh.recorded[-1].calibration.rerank is False and mesh.recorded[-1].calibration.rerank_gain < 0
    assert main(["calibrate", "--collection", "docs", "--clear"]) == 0
    assert mesh.recorded[-1].clear and "cleared" in capsys.readouterr().out


@pytest.mark.parametrize("mesh", [{"documents": 20, "reranker_helps": True}], indirect=True)
def test_too_few_documents_is_a_clear_error_and_records_nothing(
    mesh: FakeMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", "--collection", "docs"]) == 1
    assert "20 usable pseudo-queries from 20 indexed documents, at least 30" in capsys.readouterr().err
    assert not mesh.recorded
    assert main(["calibrate", "--collection", "docs", "--queries", "5"]) == 1
    assert "--queries must be >= 30" in capsys.readouterr().err


@pytest.mark.usefixtures("fake_servers")
def test_eval_reports_the_collections_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = write_dataset(tmp_path / "tiny")
    assert main(["eval", "--dataset", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"] is None
    assert main(["eval", "--dataset", str(root), "--collection", "calibrated", "--json"]) == 0
    calibration = json.loads(capsys.readouterr().out)["calibration"]
    assert calibration["rerank"] is False and calibration["queries"] == 200
    assert main(["eval", "--dataset", str(root), "--collection", "calibrated"]) == 0
    assert "collection calibration: rerank off where a search leaves it unset" in capsys.readouterr().out
