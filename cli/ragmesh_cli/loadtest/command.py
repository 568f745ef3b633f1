"""``ragmesh loadtest``: the command's arguments and its run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ragmesh_cli.addresses import resolve_address
from ragmesh_cli.documents import InputError
from ragmesh_cli.loadtest.report import format_report
from ragmesh_cli.loadtest.runner import DriveOptions, drive
from ragmesh_cli.loadtest.targets import (
    ANSWER_MODES,
    STRATEGIES,
    TARGETS,
    LoadData,
    RequestOptions,
    Target,
    embed_queries,
    index_dimension,
    load_data,
    random_unit_vectors,
)

# ---------------------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    targets = "; ".join(f"{name}: {t.help}" for name, t in TARGETS.items())
    parser.add_argument("service", choices=sorted(TARGETS), metavar="SERVICE", help=targets)
    parser.add_argument("--address", default=None, help="host:port (default: the running stack's)")
    parser.add_argument("--dataset", type=Path, default=None, metavar="DIR", help="BEIR-style dataset folder")
    parser.add_argument("--split", default="test", help="queries of qrels/<split>.tsv (default test)")
    parser.add_argument("--queries", type=int, default=0, help="distinct queries used (0: all)")
    parser.add_argument("--seed", type=int, default=13, help="query order and random vectors")
    parser.add_argument("--collection", default=None, help="collection (default: the dataset folder's name)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=None, help="closed loop: N workers (default 8)")
    load.add_argument("--rate", type=float, default=None, help="open loop: requests per second")
    parser.add_argument("--max-outstanding", type=int, default=1000, help="open loop: most calls in flight")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds (default 30)")
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="seconds run first, not counted (default 5)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request deadline, seconds")
    parser.add_argument("--channels", type=int, default=1, help="gRPC channels (HTTP/2 connections) used")
    parser.add_argument(
        "--progress", type=float, default=5.0, help="seconds between progress lines (0: none)"
    )
    parser.add_argument("--top-k", type=int, default=10, help="results asked of search stages (default 10)")
    parser.add_argument(
        "--passages",
        type=int,
        default=None,
        help="passages per request (default: reranker 35, extractor 10, narrator 5, ask the server's)",
    )
    parser.add_argument("--batch", type=int, default=1, help="embedder: texts per request")
    parser.add_argument("--embed-kind", choices=("query", "passage"), default="query", help="embedder texts")
    parser.add_argument("--answer-mode", choices=ANSWER_MODES, default=None, help="ask/extractor/narrator")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default=None, help="gateway/planner")
    parser.add_argument("--rerank", action=argparse.BooleanOptionalAction, default=None, help="gateway")
    parser.add_argument("--random-vectors", action="store_true", help="index: random unit query vectors")
    parser.add_argument(
        "--dimension", type=int, default=None, help="index: vector size (default: the index's)"
    )
    parser.add_argument("--embedder-address", default=None, help="index: embedder for the query vectors")
    parser.add_argument("--health-service", default="", help="health: service name checked (default: server)")
    parser.add_argument("--json", action="store_true", help="the report as one JSON object")


def drive_options(args: argparse.Namespace) -> DriveOptions:
    concurrency = args.concurrency if args.concurrency is not None or args.rate is not None else 8
    return DriveOptions(
        concurrency=concurrency,
        rate=args.rate,
        max_outstanding=args.max_outstanding,
        duration_s=args.duration,
        warmup_s=args.warmup,
        timeout_s=args.timeout,
        channels=args.channels,
        progress_s=args.progress,
    )


def request_options(args: argparse.Namespace, target: Target) -> RequestOptions:
    passages = target.default_passages if args.passages is None else args.passages
    for value, name in ((args.top_k, "--top-k"), (args.batch, "--batch"), (passages, "--passages")):
        if value < 0 or (name == "--batch" and value < 1):
            raise ValueError(f"{name} must be >= {1 if name == '--batch' else 0}")
    if args.queries < 0:
        raise ValueError("--queries must be >= 0")
    collection = args.collection or (args.dataset.absolute().name if args.dataset else "default")
    return RequestOptions(
        collection=collection,
        top_k=args.top_k,
        passages=passages,
        batch=args.batch,
        embed_kind=args.embed_kind,
        answer_mode=args.answer_mode,
        strategy=args.strategy,
        rerank=args.rerank,
        health_service=args.health_service,
    )


async def prepare_requests(
    args: argparse.Namespace, service: str, state_dir: Path, opts: RequestOptions
) -> list[bytes]:
    """Every request of the run, serialised once."""
    target = TARGETS[service]
    if not target.needs_dataset:
        data = LoadData([], [], {}, [])
    elif args.dataset is None:
        raise InputError(f"loadtest {service} needs --dataset (e.g. ../shared/bench/scifact)")
    else:
        data = load_data(args.dataset, args.split, args.queries, args.seed)
    if service == "index":
        if args.random_vectors:
            address = args.address or resolve_address("index", state_dir)
            dimension = args.dimension or await index_dimension(address, opts.collection, args.timeout)
            data.vectors = random_unit_vectors(len(data.queries), dimension, args.seed)
        else:
            embedder = args.embedder_address or resolve_address("embedder", state_dir)
            data.vectors = await embed_queries(embedder, data.queries, args.timeout)
    return [message.SerializeToString() for message in target.build(data, opts)]


async def run_loadtest(args: argparse.Namespace, state_dir: Path) -> int:
    target = TARGETS[args.service]
    opts = drive_options(args)
    opts.validate()
    if args.address is None and not target.component:
        raise InputError(f"loadtest {args.service} needs --address")
    address = args.address or resolve_address(target.component, state_dir)
    requests = await prepare_requests(args, args.service, state_dir, request_options(args, target))
    if not args.json:
        print(
            f"loadtest {args.service}: {len(requests)} distinct requests against {address}",
            file=sys.stderr,
            flush=True,
        )
    report = await drive(address, target.method, requests, opts)
    report = {"service": args.service, **report, "distinct_requests": len(requests)}
    print(json.dumps(report, indent=2) if args.json else format_report(args.service, report))
    return 0 if report["ok"] else 1
