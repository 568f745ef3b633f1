"""``ragmesh eval``: retrieval quality of the live mesh on a BEIR-style dataset.

Pipeline: load the dataset -> make sure the collection holds the whole corpus (ingesting it
through the real ingestion pipeline when it does not) -> one gateway Search per judged query,
with ``include_leg_results`` so every leg's own ranking comes from the same call -> per-system
runs (``bm25``, ``dense``, ``exact``, ``fused``) -> metrics (see ``metrics``) -> a report.

Systems are just named runs, so another one (e.g. a reranked list) is one more entry of
``SYSTEMS`` filled in by ``runs_from_response``; a different query mode (e.g. answers) is another
``collect`` function producing ``QueryOutcome``s.

Doc ids: corpus ids go through the same sanitising as ``ragmesh ingest`` (documents.sanitize_doc_id)
and qrels ids are mapped the same way, so they match what the gateway returns.

Refused queries: a search the gateway answers with an error (any gRPC status, e.g. a query over
its length limit, or a transient failure left after the client's retries) does not stop the
eval. The query is reported as refused (how many, their ids, the first error) and scored as an
empty ranking: 0 in every metric of every system, and still counted in each mean, so a system
cannot score higher by refusing the queries it would get wrong. Only when every query is refused
for a reason that says the eval itself is misconfigured (``FATAL_CODES``: no such collection, not
allowed, ...) does the eval stop with that error instead of reporting zeros.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from tqdm import tqdm

from ragmesh.gateway.v1 import gateway_pb2
from ragmesh_cli import metrics
from ragmesh_cli.channels import gateway_client, ingestion_client
from ragmesh_cli.datasets import BeirDataset, corpus_size, load_dataset, never_a_file
from ragmesh_cli.documents import InputError
from ragmesh_cli.search import LEG_NAMES, add_request_arguments, build_request, degradation_label, timeout_of
from ragmesh_cli.search import request_settings as search_settings
from ragmesh_cli.stats import percentile
from ragmesh_cli.tables import calibration_dict, format_table
from ragmesh_client import AsyncClient, NotFoundError, RagmeshError

RUN_FORMAT = "ragmesh-eval-run/1"
# Every system an eval reports, in report order; the per-leg names match LEG_NAMES.
SYSTEMS: tuple[str, ...] = ("bm25", "dense", "exact", "fused", "reranked")
# Errors that say the whole eval is misconfigured when every query gets one: stop instead of
# scoring every query as a miss (one query refused with one of them is a refused query).
FATAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)


# ---------------------------------------------------------------------------- ingestion


async def indexed_count(address: str, collection: str) -> int:
    async with ingestion_client(address) as client:
        try:
            status = await client.collection_status(collection, timeout=30.0)
        except NotFoundError:
            return 0
        return status.indexed


async def ensure_ingested(
    dataset: BeirDataset, collection: str, address: str, *, timeout_s: float, max_in_flight: int
) -> None:
    """Ingest the corpus unless the collection already has every document indexed. Re-submitting an
    already indexed document is cheap (the service answers UNCHANGED), so a partial collection is
    simply completed."""
    from ragmesh_cli.ingest import run_ingest

    expected = await asyncio.to_thread(corpus_size, dataset.corpus_path)
    indexed = await indexed_count(address, collection)
    if indexed >= expected:
        if indexed > expected:
            _note(f"collection {collection!r} has {indexed} documents, more than the corpus's {expected}")
        return
    _note(f"collection {collection!r} has {indexed} of {expected} documents indexed: ingesting the corpus")
    # The ingest command reports on stdout; here stdout belongs to the eval report (e.g. --json).
    with contextlib.redirect_stdout(sys.stderr):
        code = await run_ingest(
            address,
            collection,
            [dataset.corpus_path],
            wait=True,
            timeout_s=timeout_s,
            detect=never_a_file,
            max_in_flight=max_in_flight,
        )
    if code != 0:
        raise RuntimeError(f"ingesting {dataset.corpus_path} into {collection!r} did not complete")


async def recorded_calibration(address: str, collection: str) -> dict[str, Any] | None:
    """The collection's calibration (``ragmesh calibrate``) for the report: the choices a search
    that leaves them unset runs with. None when none is recorded or the API cannot say."""
    async with ingestion_client(address) as client:
        try:
            status = await client.collection_status(collection, timeout=10.0)
        except RagmeshError:
            return None
    return calibration_dict(status.calibration)


def _note(message: str) -> None:
    tqdm.write(message, file=sys.stderr)


# ---------------------------------------------------------------------------- querying


@dataclass
class QueryOutcome:
    query_id: str
    # system name -> ranked doc ids (documents, best first)
    runs: dict[str, list[str]]
    latency_ms: float
    degradations: list[str] = field(default_factory=list)
    # "CODE: message" when the gateway refused the search (scored as an empty ranking).
    error: str | None = None


def runs_from_response(response: gateway_pb2.SearchResponse) -> dict[str, list[str]]:
    """Each system's ranked doc list: leg lists collapsed to documents by first occurrence, the
    fused list as returned (already one per document with collapse_documents). A leg missing from
    the response (disabled or degraded) gets an empty list. When the gateway reranked (it then
    sends the fused list apart), the results are the ``reranked`` system."""
    runs: dict[str, list[str]] = {name: [] for name in SYSTEMS if name != "reranked"}
    for leg_result in response.leg_results:
        name = LEG_NAMES.get(leg_result.leg)
        if name is not None:
            runs[name] = metrics.first_occurrence(hit.doc_id for hit in leg_result.hits)
    returned = metrics.first_occurrence(result.doc_id for result in response.results)
    if response.fused_hits:
        # Reranking was asked for: the results are the reranked system's (in fused order when the
        # reranker degraded, which is what a caller got), the fused list comes separately.
        runs["fused"] = metrics.first_occurrence(hit.doc_id for hit in response.fused_hits)
        runs["reranked"] = returned
    else:
        runs["fused"] = returned
    return runs


async def collect(
    client: AsyncClient,
    requests: Mapping[str, gateway_pb2.SearchRequest],
    *,
    timeout_s: float,
    concurrency: int,
) -> list[QueryOutcome]:
    """Run every request with at most ``concurrency`` in flight. A search that fails (any gRPC
    error left after the client's retries) is recorded as refused and scored as an empty
    ranking; only when every search failed with a ``FATAL_CODES`` error is that (the first, in
    query order) raised: the eval itself is misconfigured."""
    if concurrency < 1:
        raise ValueError("--concurrency must be >= 1")
    gate = asyncio.Semaphore(concurrency)
    fatal: dict[str, RagmeshError] = {}

    async def one(query_id: str, request: gateway_pb2.SearchRequest) -> QueryOutcome:
        async with gate:
            started = time.perf_counter()
            try:
                # The request as the eval built it (leg results included): the client sends it
                # as it is, and the legs are read from the reply message.
                found = await client.search(
                    request.collection, request.query, request=request, timeout=timeout_s
                )
            except RagmeshError as exc:
                if exc.code in FATAL_CODES:
                    fatal[query_id] = exc
                elapsed = (time.perf_counter() - started) * 1000.0
                empty: dict[str, list[str]] = {name: [] for name in SYSTEMS}
                return QueryOutcome(query_id, empty, elapsed, error=f"{exc.code.name}: {exc.message}")
            elapsed = (time.perf_counter() - started) * 1000.0
        response: gateway_pb2.SearchResponse = found.raw
        labels = [degradation_label(d) for d in response.degradations]
        return QueryOutcome(query_id, runs_from_response(response), elapsed, labels)

    tasks = [asyncio.ensure_future(one(qid, req)) for qid, req in requests.items()]
    outcomes: list[QueryOutcome] = []
    try:
        with tqdm(total=len(tasks), desc="queries", unit="q", file=sys.stderr) as bar:
            for next_done in asyncio.as_completed(tasks):
                outcomes.append(await next_done)
                bar.update(1)
    finally:
        for task in tasks:
            task.cancel()
    if fatal and len(fatal) == len(requests):
        raise fatal[next(iter(requests))]
    order = {qid: i for i, qid in enumerate(requests)}
    return sorted(outcomes, key=lambda o: order[o.query_id])


# ---------------------------------------------------------------------------- report


def system_runs(outcomes: Sequence[QueryOutcome]) -> dict[str, dict[str, list[str]]]:
    """system -> query id -> ranked doc ids."""
    present = [name for name in SYSTEMS if any(name in o.runs for o in outcomes if o.error is None)]
    return {name: {o.query_id: o.runs.get(name, []) for o in outcomes} for name in present}


def score_systems(
    runs: Mapping[str, Mapping[str, Sequence[str]]], qrels: metrics.Qrels
) -> dict[str, dict[str, dict[str, float]]]:
    """system -> metric -> query id -> score."""
    return {name: metrics.evaluate(run, qrels) for name, run in runs.items()}


def build_report(
    dataset: BeirDataset,
    settings: Mapping[str, Any],
    outcomes: Sequence[QueryOutcome],
    per_query: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> dict[str, Any]:
    latencies = [o.latency_ms for o in outcomes if o.error is None]
    by_kind = Counter(label for o in outcomes for label in o.degradations)
    errors = Counter((o.error or "").split(":", 1)[0] for o in outcomes if o.error)
    report: dict[str, Any] = {
        "dataset": dataset.name,
        "dataset_path": str(dataset.root.absolute()),
        "split": dataset.split,
        "queries": len(outcomes),
        "settings": dict(settings),
    }
    for name, scores in per_query.items():
        entry: dict[str, Any] = {metric: metrics.mean(values.values()) for metric, values in scores.items()}
        entry["queries"] = max((len(values) for values in scores.values()), default=0)
        report[name] = entry
    report["latency_ms"] = {
        "p50": percentile(latencies, 50, method="linear", empty=0.0),
        "p95": percentile(latencies, 95, method="linear", empty=0.0),
        "mean": metrics.mean(latencies),
    }
    if "reranked" in per_query and "fused" in per_query:
        # The two systems come from the same searches: a paired comparison on the same queries.
        paired = metrics.paired_bootstrap(per_query["fused"]["ndcg@10"], per_query["reranked"]["ndcg@10"])
        report["reranked_vs_fused"] = {"metric": "ndcg@10", **paired.to_dict()}
    report["degraded"] = {
        "responses": sum(1 for o in outcomes if o.degradations),
        "by_kind": dict(sorted(by_kind.items())),
    }
    refused = [o for o in outcomes if o.error]
    report["refused"] = {
        "queries": len(refused),
        "query_ids": [o.query_id for o in refused],
        "first_error": refused[0].error if refused else None,
        "by_code": dict(sorted(errors.items())),
        # Each refused query is an empty ranking: 0 in every metric, counted in every mean.
        "scored_as": "zero",
    }
    # The same count under its older name, for readers of earlier reports.
    report["failed"] = {"queries": len(refused), "by_code": dict(sorted(errors.items()))}
    if dataset.missing_queries:
        report["skipped_queries_without_text"] = len(dataset.missing_queries)
    return report


def format_report(report: Mapping[str, Any]) -> str:
    metric_names = list(metrics.STANDARD_METRICS)
    systems = [name for name in SYSTEMS if name in report]
    rows = [
        (name, *(f"{report[name][m]:.4f}" for m in metric_names), report[name]["queries"]) for name in systems
    ]
    latency = report["latency_ms"]
    lines = [
        f"{report['dataset']} ({report['split']}): {report['queries']} queries",
        "",
        format_table(["SYSTEM", *(m.upper() for m in metric_names), "QUERIES"], rows),
        "",
        f"search latency: p50 {latency['p50']:.1f} ms, p95 {latency['p95']:.1f} ms",
        f"degraded responses: {report['degraded']['responses']}",
    ]
    if "reranked_vs_fused" in report:
        paired = report["reranked_vs_fused"]
        lines.insert(
            3,
            f"reranked - fused, nDCG@10: {paired['mean_diff']:+.4f} "
            f"[{paired['ci_low']:+.4f}, {paired['ci_high']:+.4f}] "
            f"({paired['confidence']:.0%} paired bootstrap)",
        )
    lines.extend(f"  {kind}: {count}" for kind, count in report["degraded"]["by_kind"].items())
    if calibration := report.get("calibration"):
        choice = "on" if calibration["rerank"] else "off"
        lines.append(
            f"collection calibration: rerank {choice} where a search leaves it unset "
            f"({calibration['method']}, {calibration['calibrated_at']})"
        )
    lines.extend(_refused_lines(report))
    return "\n".join(lines)


# Refused query ids the text report lists (the JSON report has them all).
SHOWN_REFUSED_IDS = 10


def _refused_lines(report: Mapping[str, Any]) -> list[str]:
    refused = report.get("refused")
    if not refused or not refused["queries"]:
        return []
    ids = refused["query_ids"]
    shown = ", ".join(ids[:SHOWN_REFUSED_IDS]) + (
        f", ... ({len(ids) - SHOWN_REFUSED_IDS} more)" if len(ids) > SHOWN_REFUSED_IDS else ""
    )
    return [
        f"refused queries: {refused['queries']} of {report['queries']} "
        "(scored 0 in every metric and counted in every mean): " + shown,
        f"  first error: {refused['first_error']}",
        *(f"  {code}: {count}" for code, count in refused["by_code"].items()),
    ]


def save_run(
    path: Path,
    report: Mapping[str, Any],
    runs: Mapping[str, Mapping[str, Sequence[str]]],
    per_query: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> None:
    """Everything needed for a paired comparison later: the rankings and the per-query scores."""
    payload = {"format": RUN_FORMAT, "report": report, "runs": runs, "per_query": per_query}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


# ---------------------------------------------------------------------------- compare


def load_run(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read run file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != RUN_FORMAT:
        raise InputError(f"{path}: not a ragmesh eval run (format {RUN_FORMAT})")
    return data


def compare_runs(
    run_a: Mapping[str, Any],
    run_b: Mapping[str, Any],
    systems: Sequence[str] | None = None,
    metric_names: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """A paired bootstrap (B - A) for each system and metric both runs have."""
    per_a, per_b = run_a["per_query"], run_b["per_query"]
    rows: list[dict[str, Any]] = []
    for system in systems or [s for s in per_a if s in per_b]:
        if system not in per_a or system not in per_b:
            raise InputError(f"system {system!r} is not in both runs")
        for metric in metric_names or [m for m in per_a[system] if m in per_b[system]]:
            result = metrics.paired_bootstrap(per_a[system][metric], per_b[system][metric])
            rows.append({"system": system, "metric": metric, **result.to_dict()})
    return rows


def format_comparison(rows: Sequence[Mapping[str, Any]], name_a: str, name_b: str) -> str:
    table = format_table(
        ["SYSTEM", "METRIC", "A", "B", "B-A", "95% CI", "P", "QUERIES"],
        [
            (
                r["system"],
                r["metric"],
                f"{r['mean_a']:.4f}",
                f"{r['mean_b']:.4f}",
                f"{r['mean_diff']:+.4f}",
                f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]",
                f"{r['p_value']:.3f}",
                r["queries"],
            )
            for r in rows
        ],
    )
    return f"A = {name_a}\nB = {name_b}\n\n{table}"


# ---------------------------------------------------------------------------- command


async def run_eval(args: argparse.Namespace, gateway_address: str, ingestion_address: str) -> int:
    """The whole eval; exits 1 when some queries were refused (the report is printed all the
    same, each refused query scored 0)."""
    if not args.dataset:
        raise InputError("--dataset is required (or --compare RUN_A RUN_B)")
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be >= 1")
    dataset = await asyncio.to_thread(load_dataset, Path(args.dataset), args.split, args.limit)
    if not dataset.queries:
        raise InputError(f"{args.dataset}: no judged queries in split {args.split!r}")
    collection = args.collection or dataset.name
    timeout_s = timeout_of(args)
    requests = {
        qid: build_request(args, text, collection, collapse=True, include_leg_results=True)
        for qid, text in dataset.queries.items()
    }
    if args.ingest:
        await ensure_ingested(
            dataset,
            collection,
            ingestion_address,
            timeout_s=args.ingest_timeout,
            max_in_flight=args.in_flight,
        )
    async with gateway_client(gateway_address) as client:
        outcomes = await collect(client, requests, timeout_s=timeout_s, concurrency=args.concurrency)
    runs = system_runs(outcomes)
    per_query = score_systems(runs, dataset.qrels)
    settings = {
        **search_settings(next(iter(requests.values())), timeout_s),
        "concurrency": args.concurrency,
        "limit": args.limit,
    }
    report = build_report(dataset, settings, outcomes, per_query)
    report["calibration"] = await recorded_calibration(ingestion_address, collection)
    if args.save_run:
        save_run(Path(args.save_run), report, runs, per_query)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if report["refused"]["queries"] else 0


def run_compare(args: argparse.Namespace) -> int:
    path_a, path_b = (Path(p) for p in args.compare)
    rows = compare_runs(load_run(path_a), load_run(path_b), args.systems, args.metrics)
    if args.json:
        print(json.dumps({"a": str(path_a), "b": str(path_b), "comparisons": rows}, indent=2))
    else:
        print(format_comparison(rows, str(path_a), str(path_b)))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default=None, metavar="DIR", help="BEIR-style dataset folder")
    parser.add_argument("--split", default="test", help="qrels split (qrels/<split>.tsv; default test)")
    add_request_arguments(parser, top_k=100, collection_default="the dataset folder's name")
    parser.add_argument("--limit", type=int, default=None, help="only the first N judged queries")
    parser.add_argument("--concurrency", type=int, default=8, help="searches in flight (default 8)")
    parser.add_argument(
        "--no-ingest", dest="ingest", action="store_false", help="evaluate the collection as it is"
    )
    parser.add_argument("--ingest-timeout", type=float, default=3600.0, help="seconds to wait for indexing")
    parser.add_argument("--in-flight", type=int, default=4, help="concurrent IngestDocuments requests")
    parser.add_argument(
        "--save-run", default=None, metavar="PATH", help="write per-query rankings and scores"
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        default=None,
        metavar=("RUN_A", "RUN_B"),
        help="paired bootstrap of two saved runs",
    )
    parser.add_argument("--systems", nargs="+", default=None, help="with --compare: systems to compare")
    parser.add_argument("--metrics", nargs="+", default=None, help="with --compare: metrics to compare")
    parser.add_argument("--json", action="store_true")
