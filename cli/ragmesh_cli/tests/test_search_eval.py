"""``ragmesh search`` and ``ragmesh eval`` without the mesh: request building, formatting, dataset
loading, per-leg collapsing, reporting, and both commands end to end against fake gateway and
ingestion servers (plain grpc servers on threads)."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from ragmesh_cli import evaluation, metrics, search
from ragmesh_cli.documents import InputError
from ragmesh_cli.main import build_parser, main

D, B, E = gateway_pb2.LEG_DENSE, gateway_pb2.LEG_BM25, gateway_pb2.LEG_EXACT


def _result(doc_id: str, score: float, text: str, **ranks: int) -> gateway_pb2.SearchResult:
    legs = {"dense": D, "bm25": B, "exact": E}
    return gateway_pb2.SearchResult(
        chunk_id=f"{doc_id}#0",
        doc_id=doc_id,
        text=text,
        fused_score=score,
        leg_ranks=[gateway_pb2.LegRank(leg=legs[name], rank=rank) for name, rank in ranks.items()],
    )


def sample_response() -> gateway_pb2.SearchResponse:
    return gateway_pb2.SearchResponse(
        results=[
            _result("guide.md", 0.0325, "Restart the\nnode " + "x" * 200, dense=3, bm25=1),
            _result("faq.md", 0.0161, "short", exact=2),
        ],
        plan=planner_pb2.Plan(
            strategy=planner_pb2.STRATEGY_PRECISE, pool_size=50, variations=["q"], hard_keywords=["E42"]
        ),
        degradations=[
            gateway_pb2.Degradation(
                stage=gateway_pb2.STAGE_SPARSE,
                reason=gateway_pb2.DEGRADATION_REASON_DEADLINE,
                message="sparse timed out",
                legs=[B, E],
            )
        ],
        timings=[
            gateway_pb2.StageTiming(stage="planner", ms=1.25),
            gateway_pb2.StageTiming(stage="total", ms=20),
        ],
    )


# ---------------------------------------------------------------------------- search


def test_parse_weights() -> None:
    weights = search.parse_weights("dense=1, bm25=0.5,exact=0")
    assert (weights.dense, weights.bm25, weights.exact) == (1.0, 0.5, 0.0)
    assert weights.HasField("exact")
    assert not search.parse_weights("dense=2").HasField("bm25")
    for bad in ("sparse=1", "dense", "dense=x", "dense=-1", "dense=nan"):
        with pytest.raises(ValueError):
            search.parse_weights(bad)


def test_build_request_from_the_command_line() -> None:
    argv = "--collection docs --top-k 5 --collapse --rrf-k 30 --weights exact=0.3 --strategy exhaustive"
    argv += " --doc a.md b.md --deadline-ms 1500"
    args = build_parser().parse_args(["search", "how to restart", *argv.split()])
    request = search.build_request(
        args, args.query, args.collection, collapse=args.collapse, doc_ids=args.doc
    )
    assert request.collection == "docs" and request.query == "how to restart" and request.top_k == 5
    assert request.collapse_documents and request.rrf_k == 30 and list(request.doc_ids) == ["a.md", "b.md"]
    assert request.strategy == planner_pb2.STRATEGY_EXHAUSTIVE
    assert request.weights.exact == pytest.approx(0.3) and not request.weights.HasField("dense")
    assert search.timeout_of(args) == 1.5
    settings = search.request_settings(request, 1.5)
    assert settings["weights"] == {"dense": None, "bm25": None, "exact": pytest.approx(0.3)}
    assert settings["strategy"] == "exhaustive" and settings["deadline_ms"] == 1500


def test_unset_options_leave_server_defaults() -> None:
    args = build_parser().parse_args(["search", "q"])
    request = search.build_request(args, "q", "default", collapse=False)
    assert not request.HasField("rrf_k") and not request.HasField("weights")
    assert request.strategy == planner_pb2.STRATEGY_UNSPECIFIED and request.top_k == 10
    assert not request.HasField("rerank") and request.rerank_candidates == 0


@pytest.mark.parametrize(("flag", "expected"), [("--rerank", True), ("--no-rerank", False)])
def test_rerank_flags(flag: str, expected: bool) -> None:
    args = build_parser().parse_args(["search", "q", flag, "--rerank-candidates", "20"])
    request = search.build_request(args, "q", "default", collapse=False)
    assert request.HasField("rerank") and request.rerank is expected and request.rerank_candidates == 20
    assert search.request_settings(request, 1.0)["rerank"] is expected


def test_format_response_table_degradations_and_timings() -> None:
    out = search.format_response(sample_response())
    lines = out.splitlines()
    assert lines[0].split() == ["RANK", "DOC", "ID", "FUSED", "RERANK", "LEGS", "TEXT"]
    assert lines[1].startswith("1     guide.md  0.0325  -       D3 B1 E-  Restart the node xxx")
    assert lines[1].endswith("…") and len(lines[1].split("  D3 B1 E-  ")[1]) == search.SNIPPET_CHARS
    assert "2     faq.md    0.0161  -       D- B- E2  short" in lines
    reranked = sample_response()
    reranked.results[0].rerank_score = 2.5
    assert "1     guide.md  0.0325  2.50    D3 B1 E-" in search.format_response(reranked)
    assert "plan: precise, pool 50, 1 variation(s), keywords: E42" in out
    assert "  sparse:deadline (legs bm25,exact): sparse timed out" in out
    assert out.endswith("timings (ms): planner 1.2  total 20.0")
    assert search.format_response(gateway_pb2.SearchResponse()) == "no results"


def test_response_to_dict_keeps_proto_field_names() -> None:
    data = search.response_to_dict(sample_response())
    assert data["results"][0]["doc_id"] == "guide.md"
    assert data["results"][0]["leg_ranks"][0] == {"leg": "LEG_DENSE", "rank": 3}
    assert data["degradations"][0]["stage"] == "STAGE_SPARSE"
    assert data["plan"]["hard_keywords"] == ["E42"]


# ---------------------------------------------------------------------------- dataset


def write_dataset(root: Path, *, gz: bool = False) -> Path:
    root.mkdir(parents=True)
    corpus = [
        {"_id": "d1", "title": "One", "text": "alpha"},
        {"_id": "d 2", "title": "", "text": "beta"},  # id sanitised to d_2, like ingest does
        {"_id": "d3", "text": "gamma"},
        {"_id": "empty", "text": "  "},  # not ingested
    ]
    lines = "".join(json.dumps(r) + "\n" for r in corpus)
    if gz:
        with gzip.open(root / "corpus.jsonl.gz", "wt") as handle:
            handle.write(lines)
    else:
        (root / "corpus.jsonl").write_text(lines)
    queries = [
        {"_id": "q1", "text": "find alpha"},
        {"_id": "q2", "text": "find beta"},
        {"_id": "q3", "text": "x"},
    ]
    queries += [{"_id": "q4", "text": ""}]
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td3\t2\nq2\td 2\t1\nq3\td3\t0\nq4\td1\t1\n"
    )
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq3\td3\t1\n")
    return root


def test_load_dataset_keeps_judged_queries_with_text(tmp_path: Path) -> None:
    dataset = evaluation.load_dataset(write_dataset(tmp_path / "tiny"), "test")
    assert dataset.name == "tiny" and dataset.corpus_path.name == "corpus.jsonl"
    assert dataset.queries == {"q1": "find alpha", "q2": "find beta"}  # q3: nothing relevant, q4: no text
    assert dataset.qrels == {"q1": {"d1": 1, "d3": 2}, "q2": {"d_2": 1}}
    assert dataset.missing_queries == ["q4"]
    assert evaluation.corpus_size(dataset.corpus_path) == 3
    assert list(evaluation.load_dataset(tmp_path / "tiny", "test", limit=1).queries) == ["q1"]
    assert evaluation.load_dataset(tmp_path / "tiny", "dev").queries == {"q3": "x"}


def test_load_dataset_gzip_corpus_and_errors(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "gz", gz=True)
    assert evaluation.load_dataset(root, "test").corpus_path.name == "corpus.jsonl.gz"
    with pytest.raises(InputError, match="no qrels"):
        evaluation.load_dataset(root, "train")
    (root / "qrels" / "bad.tsv").write_text("q1\td1\t1\n")
    with pytest.raises(InputError, match="header"):
        evaluation.load_dataset(root, "bad")
    with pytest.raises(InputError, match="not a directory"):
        evaluation.load_dataset(tmp_path / "missing", "test")


# ---------------------------------------------------------------------------- runs and report


def test_runs_from_response_collapses_each_leg_to_documents() -> None:
    response = gateway_pb2.SearchResponse(
        results=[_result("a", 0.1, ""), _result("b", 0.05, "")],
        leg_results=[
            gateway_pb2.LegResult(
                leg=B,
                hits=[gateway_pb2.LegHit(chunk_id=f"{d}#{i}", doc_id=d) for i, d in enumerate("bcbab")],
            ),
            gateway_pb2.LegResult(leg=D, hits=[gateway_pb2.LegHit(chunk_id="a#0", doc_id="a")]),
        ],
    )
    assert evaluation.runs_from_response(response) == {
        "bm25": ["b", "c", "a"],
        "dense": ["a"],
        "exact": [],  # leg absent (disabled or degraded)
        "fused": ["a", "b"],
    }


def test_a_reranked_response_is_two_systems() -> None:
    response = gateway_pb2.SearchResponse(
        results=[_result("b", 0.05, ""), _result("a", 0.1, "")],
        reranked=True,
        fused_hits=[
            gateway_pb2.LegHit(chunk_id="a#0", doc_id="a"),
            gateway_pb2.LegHit(chunk_id="b#0", doc_id="b"),
        ],
    )
    runs = evaluation.runs_from_response(response)
    assert runs["fused"] == ["a", "b"] and runs["reranked"] == ["b", "a"]


# ---------------------------------------------------------------------------- end to end (fake servers)


# The fake gateway refuses longer queries, as the real one does (gateway_max_query_chars).
QUERY_LIMIT = 16_000


class FakeGateway(gateway_pb2_grpc.GatewayServiceServicer):
    """bm25 finds the relevant documents, dense finds nothing useful, fused = bm25."""

    ANSWERS = {"find alpha": ["d3", "d1"], "find beta": ["zzz", "d_2"]}

    def __init__(self) -> None:
        self.requests: list[gateway_pb2.SearchRequest] = []

    def Search(self, request: gateway_pb2.SearchRequest, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        if request.collection == "forbidden":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "collection 'forbidden' is not allowed")
        if len(request.query) > QUERY_LIMIT:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the query length in characters is {len(request.query)}, the limit is {QUERY_LIMIT}",
            )
        docs = self.ANSWERS.get(request.query, [])
        bm25 = [gateway_pb2.LegHit(chunk_id=f"{d}#{i}", doc_id=d) for d in docs for i in range(2)]
        degraded = request.query == "find beta"
        return gateway_pb2.SearchResponse(
            results=[_result(d, 1.0 / (i + 1), f"text of {d}", bm25=i + 1) for i, d in enumerate(docs)],
            leg_results=[
                gateway_pb2.LegResult(leg=B, hits=bm25),
                gateway_pb2.LegResult(leg=D, hits=[gateway_pb2.LegHit(chunk_id="n#0", doc_id="nope")]),
            ],
            degradations=[gateway_pb2.Degradation(stage=gateway_pb2.STAGE_EMBEDDER)] if degraded else [],
            timings=[gateway_pb2.StageTiming(stage="total", ms=3.0)],
            # A conversation makes the fake "rewrite" the query.
            searched_query=f"{request.history[0].content} {request.query}"
            if request.history
            else request.query,
        )


class FakeIngestion(ingestion_pb2_grpc.IngestionServiceServicer):
    def GetCollectionStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        reply = ingestion_pb2.GetCollectionStatusResponse(collection=request.collection, indexed=3)
        if request.collection == "calibrated":
            reply.calibration.CopyFrom(
                ingestion_pb2.CollectionCalibration(rerank=False, method="pseudo-queries/v1", queries=200)
            )
        return reply


@pytest.fixture
def fake_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGateway]:
    gateway = FakeGateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(gateway, server)
    ingestion_pb2_grpc.add_IngestionServiceServicer_to_server(FakeIngestion(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("RAGMESH_GATEWAY_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.setenv("RAGMESH_INGESTION_ADDRESS", f"127.0.0.1:{port}")
    yield gateway
    server.stop(None)


def test_search_command_prints_table_json_and_errors(
    fake_servers: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["search", "find alpha", "--collection", "c", "--collapse"]) == 0
    out = capsys.readouterr().out
    assert "d3" in out and "D- B1 E-" in out and "timings (ms): total 3.0" in out
    assert fake_servers.requests[-1].collapse_documents
    assert main(["search", "find alpha", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["doc_id"] for r in data["results"]] == ["d3", "d1"]
    assert fake_servers.requests[-1].collection == "default"
    assert main(["search", "q", "--collection", "forbidden"]) == 1
    assert capsys.readouterr().err.strip() == "error: INVALID_ARGUMENT: collection 'forbidden' is not allowed"


def test_search_with_history_prints_the_query_searched_when_it_differs(
    fake_servers: FakeGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "history.json"
    history.write_text(
        json.dumps([{"role": "user", "content": "find alpha"}, {"role": "assistant", "content": "d3 [1]"}])
    )
    assert main(["search", "and beta?", "--history", str(history)]) == 0
    assert "searched: find alpha and beta?" in capsys.readouterr().out
    request = fake_servers.requests[-1]
    assert [(t.role, t.content) for t in request.history] == [
        (narrator_pb2.ROLE_USER, "find alpha"),
        (narrator_pb2.ROLE_ASSISTANT, "d3 [1]"),
    ]
    assert main(["search", "find alpha"]) == 0
    assert "searched:" not in capsys.readouterr().out
    history.write_text(json.dumps([{"role": "system", "content": "x"}]))
    assert main(["search", "and beta?", "--history", str(history)]) == 1
    assert "turn 0 needs role user|assistant" in capsys.readouterr().err


def test_ask_shows_the_query_searched_when_it_differs() -> None:
    from ragmesh_cli.ask import format_answer

    response = gateway_pb2.AskResponse(answer="Three nodes [1].", searched_query="staging cluster configured")
    assert "searched: staging cluster configured" in format_answer(response, "and for staging?")
    same = gateway_pb2.AskResponse(answer="Five nodes [1].", searched_query="How many nodes?")
    assert "searched:" not in format_answer(same, "How  many nodes?")


def test_ask_lists_facts_with_their_scores_best_first() -> None:
    from ragmesh_cli.ask import format_answer

    response = gateway_pb2.AskResponse(answer="Yes [1].")
    response.facts.add(text="Supplements cut hip fractures by a fifth.", doc_id="d1", score=2.5)
    response.facts.add(text="All subjects received calcium.", doc_id="d2", score=-4.25)
    text = format_answer(response, "Do supplements help?")
    assert "facts (score, best first):\n   +2.50 d1: Supplements cut hip fractures" in text
    assert "   -4.25 d2: All subjects received calcium." in text


def test_eval_command_reports_every_system_and_compares_runs(
    fake_servers: FakeGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_dataset(tmp_path / "tiny")
    run_path = tmp_path / "run.json"
    assert main(["eval", "--dataset", str(root), "--json", "--save-run", str(run_path), "--rrf-k", "20"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dataset"] == "tiny" and report["split"] == "test" and report["queries"] == 2
    assert report["settings"]["collection"] == "tiny" and report["settings"]["rrf_k"] == 20
    assert all(
        r.collapse_documents and r.include_leg_results and r.top_k == 100 for r in fake_servers.requests
    )
    # q1: d3 (grade 2) then d1 (grade 1) = ideal; q2: d_2 at rank 2.
    assert report["bm25"]["mrr@10"] == pytest.approx((1.0 + 0.5) / 2)
    assert report["bm25"]["recall@100"] == 1.0 and report["fused"] == report["bm25"]
    assert report["dense"] == {"ndcg@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0, "queries": 2}
    assert report["exact"]["queries"] == 2 and report["exact"]["ndcg@10"] == 0.0
    assert set(report["latency_ms"]) >= {"p50", "p95"}
    assert report["degraded"] == {"responses": 1, "by_kind": {"embedder:unspecified": 1}}
    assert report["failed"]["queries"] == 0

    saved = evaluation.load_run(run_path)
    assert saved["runs"]["bm25"] == {"q1": ["d3", "d1"], "q2": ["zzz", "d_2"]}
    assert saved["per_query"]["fused"]["mrr@10"] == {"q1": 1.0, "q2": 0.5}

    assert main(["eval", "--compare", str(run_path), str(run_path), "--systems", "fused", "dense"]) == 0
    table = capsys.readouterr().out
    assert "fused   ndcg@10" in table and "+0.0000" in table
    assert main(["eval", "--compare", str(run_path), str(run_path), "--json", "--metrics", "mrr@10"]) == 0
    rows = json.loads(capsys.readouterr().out)["comparisons"]
    # The fake gateway does not rerank: no reranked system in the runs, none compared.
    assert "reranked" not in saved["runs"]
    assert [(r["system"], r["metric"]) for r in rows] == [
        (s, "mrr@10") for s in evaluation.SYSTEMS if s != "reranked"
    ]

    assert main(["eval", "--dataset", str(root), "--limit", "1"]) == 0
    human = capsys.readouterr().out
    assert "tiny (test): 1 queries" in human and "SYSTEM" in human and "fused" in human


def test_eval_stops_on_a_fatal_error_and_needs_a_dataset(
    fake_servers: FakeGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_dataset(tmp_path / "tiny")
    assert main(["eval", "--dataset", str(root), "--collection", "forbidden"]) == 1
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
    assert main(["eval"]) == 1
    assert "--dataset is required" in capsys.readouterr().err


def test_eval_reports_a_refused_query_and_scores_it_zero(
    fake_servers: FakeGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_dataset(tmp_path / "tiny")
    long_query = "find beta " * 2000  # 20,000 characters: over the gateway's limit
    queries = [{"_id": "q1", "text": "find alpha"}, {"_id": "q2", "text": long_query}]
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    # Exit 1: not every query was searched; the report comes all the same.
    assert main(["eval", "--dataset", str(root), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["queries"] == 2
    assert report["refused"] == {
        "queries": 1,
        "query_ids": ["q2"],
        "first_error": "INVALID_ARGUMENT: the query length in characters is 20000, the limit is 16000",
        "by_code": {"INVALID_ARGUMENT": 1},
        "scored_as": "zero",
    }
    assert report["failed"] == {"queries": 1, "by_code": {"INVALID_ARGUMENT": 1}}
    # q1 is ranked ideally (1.0); the refused q2 counts as 0 in the mean over both.
    for system in ("bm25", "fused"):
        assert report[system]["ndcg@10"] == pytest.approx(0.5) and report[system]["queries"] == 2
        assert report[system]["mrr@10"] == pytest.approx(0.5)
    assert main(["eval", "--dataset", str(root)]) == 1
    human = capsys.readouterr().out
    assert "refused queries: 1 of 2 (scored 0 in every metric and counted in every mean): q2" in human
    assert "  first error: INVALID_ARGUMENT: the query length in characters is 20000" in human


def test_the_text_report_lists_the_first_refused_ids_only() -> None:
    dataset = evaluation.BeirDataset(
        name="d", root=Path("."), split="test", corpus_path=Path("c"), queries={}, qrels={}
    )
    outcomes = [evaluation.QueryOutcome(f"q{i}", {}, 1.0, error="UNAVAILABLE: down") for i in range(12)]
    text = evaluation.format_report(evaluation.build_report(dataset, {}, outcomes, {}))
    assert "refused queries: 12 of 12 (scored 0 in every metric and counted in every mean): q0, q1," in text
    assert "q9, ... (2 more)" in text and "  UNAVAILABLE: 12" in text


def test_ensure_ingested_completes_a_partial_collection_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = evaluation.load_dataset(write_dataset(tmp_path / "tiny"), "test")
    calls: list[dict[str, Any]] = []
    indexed = {"count": 1}

    async def fake_indexed(address: str, collection: str) -> int:
        return indexed["count"]

    async def fake_ingest(address: str, collection: str, paths: list[Path], **kwargs: Any) -> int:
        calls.append({"collection": collection, "paths": paths, **kwargs})
        print("ingest summary")
        return 0

    monkeypatch.setattr(evaluation, "indexed_count", fake_indexed)
    monkeypatch.setattr("ragmesh_cli.ingest.run_ingest", fake_ingest)
    asyncio.run(evaluation.ensure_ingested(dataset, "tiny", "addr", timeout_s=5.0, max_in_flight=2))
    assert calls == [
        {
            "collection": "tiny",
            "paths": [dataset.corpus_path],
            "wait": True,
            "timeout_s": 5.0,
            "max_in_flight": 2,
        }
        | {"detect": calls[0]["detect"]}
    ]
    captured = capsys.readouterr()
    assert "ingest summary" in captured.err and captured.out == ""  # stdout is the report's
    indexed["count"] = 3  # the whole corpus (3 non-empty documents)
    asyncio.run(evaluation.ensure_ingested(dataset, "tiny", "addr", timeout_s=5.0, max_in_flight=2))
    assert len(calls) == 1


def test_parser_knows_the_new_commands() -> None:
    args = build_parser().parse_args(["eval", "--dataset", "d", "--concurrency", "3", "--no-ingest"])
    assert isinstance(args, argparse.Namespace)
    assert args.top_k == 100 and args.concurrency == 3 and not args.ingest and args.split == "test"


def test_report_pairs_the_reranked_system_with_the_fused_one() -> None:
    dataset = evaluation.BeirDataset(
        name="d", root=Path("."), split="test", corpus_path=Path("c"), queries={}, qrels={}
    )
    outcomes = [evaluation.QueryOutcome("q1", {}, 1.0), evaluation.QueryOutcome("q2", {}, 2.0)]
    fused = {"q1": 0.5, "q2": 0.2}
    reranked = {"q1": 0.7, "q2": 0.4}
    per_query = {
        "fused": dict.fromkeys(metrics.STANDARD_METRICS, fused),
        "reranked": dict.fromkeys(metrics.STANDARD_METRICS, reranked),
    }
    report = evaluation.build_report(dataset, {}, outcomes, per_query)
    paired = report["reranked_vs_fused"]
    assert paired["metric"] == "ndcg@10" and paired["mean_diff"] == pytest.approx(0.2)
    assert paired["ci_low"] == pytest.approx(0.2) and paired["queries"] == 2
    assert "reranked - fused, nDCG@10: +0.2000 [+0.2000, +0.2000]" in evaluation.format_report(report)
