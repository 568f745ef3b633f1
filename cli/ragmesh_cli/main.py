"""``ragmesh``: run the local mesh and operate it (ingest, search, eval, delete, dead letters,
status, config).

Addresses come from ``<state_dir>/stack.json`` (written by ``ragmesh up``); a RAGMESH_*_ADDRESS
variable overrides them, so the same commands work against a remote deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc

from ragmesh_cli import (
    answer_eval,
    ask,
    calibrate,
    certs,
    evaluation,
    keys,
    loadtest,
    mcp_server,
    reindex,
    search,
)
from ragmesh_cli.addresses import resolve_address
from ragmesh_cli.channels import ingestion_client, use_api_key, use_state_dir
from ragmesh_cli.config import cmd_config
from ragmesh_cli.documents import InputError
from ragmesh_cli.folder_sync import add_folder_arguments
from ragmesh_cli.stack import (
    ALL_SERVICES,
    ProcessStatus,
    Stack,
    StackError,
    parse_counts,
    parse_workers,
    read_state,
    stack_is_running,
)
from ragmesh_cli.state import DEFAULT_STATE_DIR, state_dir_of
from ragmesh_cli.tables import calibration_dict, calibration_text, format_table, shorten
from ragmesh_client import AsyncClient, CollectionStatus, DeadLetter, RagmeshError

RPC_TIMEOUT_S = 60.0
T = TypeVar("T")


# ---------------------------------------------------------------------------- helpers


def process_table(statuses: Sequence[ProcessStatus]) -> str:
    rows = [(s.name, s.pid or "-", "yes" if s.alive else "no", s.port, s.health) for s in statuses]
    return format_table(["COMPONENT", "PID", "ALIVE", "PORT", "HEALTH"], rows)


def _call_ingestion(state_dir: Path, call: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """One call of the ingestion API through ragmesh_client, with the CLI's key and TLS."""

    async def with_client() -> T:
        async with ingestion_client(resolve_address("ingestion", state_dir)) as client:
            return await call(client)

    return asyncio.run(with_client())


# ---------------------------------------------------------------------------- stack commands


def cmd_up(args: argparse.Namespace) -> int:
    state_dir = state_dir_of(args)
    # A running stack keeps its shape unless told otherwise; a stopped one starts with the defaults.
    recorded = read_state(state_dir) or {}
    if not stack_is_running(recorded):
        recorded = {}
    services = (
        args.services.split(",")
        if args.services is not None
        else recorded.get("services", list(ALL_SERVICES))
    )
    ingest_workers, processes = (None, None) if args.workers is None else parse_workers(args.workers)
    replicas = None if args.replicas is None else parse_counts(args.replicas, "--replicas")
    stack = Stack(
        state_dir,
        workers=ingest_workers if ingest_workers is not None else recorded.get("workers", 1),
        index_shards=args.index_shards if args.index_shards is not None else recorded.get("index_shards", 1),
        sparse_shards=args.sparse_shards
        if args.sparse_shards is not None
        else recorded.get("sparse_shards", 1),
        services=[s.strip() for s in services if s.strip()],
        health_timeout_s=args.health_timeout,
        replicas=replicas if replicas is not None else recorded.get("replicas", {}),
        processes=processes if processes is not None else recorded.get("processes", {}),
        secure=args.secure or bool(recorded.get("secure")),
        # Every service appends its spans to the one file (meshkit.rpc.tracing).
        extra_env={"RAGMESH_TRACE_FILE": str(args.trace_file.absolute())} if args.trace_file else None,
    )
    print(f"starting the stack in {state_dir} ...", file=sys.stderr)
    print(stack.up())
    print(process_table(stack.status()))
    print(_security_note(stack), file=sys.stderr)
    return 0


def _security_note(stack: Stack) -> str:
    if not stack.secure:
        return (
            "open stack: plaintext, no API keys, no service identities (loopback only); "
            "'ragmesh down' then 'ragmesh up --secure' for keys, mTLS and per-service credentials"
        )
    secure_dir = stack.state_dir / "secure"
    return (
        f"secure stack: API keys, mTLS between services, NATS and S3 credentials per service, a key "
        f"for the LLM server; the CLI "
        f"uses the ops identity from {secure_dir} (CA pki/ca.crt, keys file api-keys.json)"
    )


def cmd_down(args: argparse.Namespace) -> int:
    state_dir = state_dir_of(args)
    if read_state(state_dir) is None:
        print(f"no stack recorded in {state_dir}")
        return 0
    stopped = Stack.load(state_dir).down()
    print(f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped else ""))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state_dir = state_dir_of(args)
    statuses = Stack.load(state_dir).status() if read_state(state_dir) is not None else []
    counts: CollectionStatus | None = None
    if args.collection:
        collection = args.collection
        counts = _call_ingestion(
            state_dir, lambda client: client.collection_status(collection, timeout=RPC_TIMEOUT_S)
        )
    if args.json:
        out: dict[str, Any] = {"state_dir": str(state_dir), "processes": [s.to_dict() for s in statuses]}
        if counts is not None:
            out["collection"] = counts.collection or args.collection
            out.update({k: int(getattr(counts, k)) for k in _COUNT_FIELDS})
            out["calibration"] = calibration_dict(counts.calibration)
        print(json.dumps(out, indent=2))
        return 0
    print(process_table(statuses) if statuses else f"no local stack recorded in {state_dir}")
    if counts is not None:
        print()
        print(f"collection {args.collection!r}")
        print(format_table(["STATE", "COUNT"], [(k, getattr(counts, k)) for k in _COUNT_FIELDS]))
        print(calibration_text(counts.calibration, indexed=counts.indexed))
    return 0


_COUNT_FIELDS = ("indexed", "queued", "processing", "failed", "deleting", "chunks")


# ---------------------------------------------------------------------------- data commands


def cmd_ingest(args: argparse.Namespace) -> int:
    from ragmesh_cli.ingest import FolderOptions, run_ingest

    address = resolve_address("ingestion", state_dir_of(args))
    return asyncio.run(
        run_ingest(
            address,
            args.collection,
            [Path(p) for p in args.paths],
            wait=args.wait,
            timeout_s=args.timeout,
            max_in_flight=args.in_flight,
            options=FolderOptions(args.max_file_bytes, args.sync, args.dry_run, args.strict),
        )
    )


def cmd_search(args: argparse.Namespace) -> int:
    return asyncio.run(search.run_search(args, resolve_address("gateway", state_dir_of(args))))


def cmd_ask(args: argparse.Namespace) -> int:
    return asyncio.run(ask.run_ask(args, resolve_address("gateway", state_dir_of(args))))


def cmd_mcp(args: argparse.Namespace) -> int:
    state_dir = state_dir_of(args)
    gateway, ingestion = resolve_address("gateway", state_dir), resolve_address("ingestion", state_dir)
    return mcp_server.run_mcp(args, gateway, ingestion)


def cmd_loadtest(args: argparse.Namespace) -> int:
    return asyncio.run(loadtest.run_loadtest(args, state_dir_of(args)))


def cmd_eval(args: argparse.Namespace) -> int:
    if args.compare:
        return evaluation.run_compare(args)
    state_dir = state_dir_of(args)
    if args.answers:
        return asyncio.run(
            answer_eval.run_answer_eval(
                args, resolve_address("gateway", state_dir), resolve_address("ingestion", state_dir)
            )
        )
    return asyncio.run(
        evaluation.run_eval(
            args, resolve_address("gateway", state_dir), resolve_address("ingestion", state_dir)
        )
    )


def cmd_build_reranker(args: argparse.Namespace) -> int:
    import importlib.util

    from ragmesh_cli.rerankerbuild import build

    if importlib.util.find_spec("torch") is None:
        raise InputError(
            "the build needs torch: pip install -r requirements-build.txt (or: make reranker-model)"
        )
    return build.run_build(args)


def cmd_delete(args: argparse.Namespace) -> int:
    collection, doc_ids = args.collection, args.doc_ids
    queued = _call_ingestion(
        state_dir_of(args), lambda client: client.delete(collection, doc_ids, timeout=RPC_TIMEOUT_S)
    )
    print(f"queued {queued} deletions in collection {args.collection!r}")
    return 0


def _dead_letter_dict(item: DeadLetter) -> dict[str, Any]:
    # UTC as ...Z, as the CLI has always printed it.
    failed_at = item.failed_at.replace(tzinfo=None).isoformat() + "Z" if item.failed_at else ""
    return {
        "sequence": item.sequence,
        "collection": item.collection,
        "doc_id": item.doc_id,
        "attempts": item.attempts,
        "reason": item.reason,
        "failed_at": failed_at,
    }


def cmd_dlq_list(args: argparse.Namespace) -> int:
    collection, limit = args.collection or "", args.limit
    page = _call_ingestion(
        state_dir_of(args),
        lambda client: client.dead_letters(collection, limit=limit, timeout=RPC_TIMEOUT_S),
    )
    items = [_dead_letter_dict(d) for d in page.dead_letters]
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    if not items:
        print("no dead letters")
        return 0
    rows = [
        (
            d["sequence"],
            d["collection"],
            d["doc_id"],
            d["attempts"],
            shorten(d["reason"], 60),
            d["failed_at"],
        )
        for d in items
    ]
    print(format_table(["SEQ", "COLLECTION", "DOC ID", "ATTEMPTS", "REASON", "TIME"], rows))
    return 0


async def _replay_all(client: AsyncClient, collection: str, sequences: list[int]) -> tuple[int, int]:
    replayed = superseded = 0
    after = 0
    while True:
        batch = await client.replay_dead_letters(
            collection, sequences=sequences, after_sequence=after, timeout=RPC_TIMEOUT_S
        )
        replayed += batch.replayed
        superseded += batch.superseded
        after = batch.next_after_sequence
        if sequences or not after:
            return replayed, superseded


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    """One call for explicit sequences; else batch after batch (the API handles a bounded
    number per call) until the cursor reaches the end."""
    collection, sequences = args.collection or "", list(args.seq or [])
    replayed, superseded = _call_ingestion(
        state_dir_of(args), lambda client: _replay_all(client, collection, sequences)
    )
    print(f"replayed {replayed} dead letters; dropped {superseded} superseded by newer versions")
    return 0


# ---------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        default=argparse.SUPPRESS,
        help=f"stack state directory (default: $RAGMESH_STATE_DIR or ./{DEFAULT_STATE_DIR})",
    )
    common.add_argument(
        "--api-key",
        default=argparse.SUPPRESS,
        help="API key for the gateway and ingestion API (default: $RAGMESH_API_KEY, which keeps it out "
        "of the process list)",
    )
    parser = argparse.ArgumentParser(prog="ragmesh", description=__doc__, parents=[common])
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", parents=[common], help="start the local mesh (idempotent)")
    up.add_argument(
        "--workers",
        default=None,
        metavar="N|KIND=N,...",
        help="N: ingestion workers (default 1); KIND=N,...: worker processes sharing the port of a "
        "stateless service, e.g. gateway=2,embedder=2 (worker=N: ingestion workers)",
    )
    up.add_argument(
        "--replicas",
        default=None,
        metavar="KIND=N,...",
        help="replicas, each on its own port, balanced round-robin by their callers, e.g. "
        "reranker=2,embedder=2; index=2 runs every index shard twice and sparse=2 the sparse store, "
        "replicas kept identical by their replicated log in NATS",
    )
    up.add_argument("--index-shards", type=int, default=None, help="index shards (default 1)")
    up.add_argument(
        "--sparse-shards", type=int, default=None, help="sparse (BM25 + exact) shards (default 1)"
    )
    up.add_argument("--services", default=None, help=f"comma separated subset of {','.join(ALL_SERVICES)}")
    up.add_argument(
        "--health-timeout", type=float, default=60.0, help="seconds each process gets to be healthy"
    )
    up.add_argument(
        "--secure",
        action="store_true",
        help="API keys, mTLS with an identity per service, NATS and S3 over TLS with per-service "
        "credentials (docs/SECURITY.md); a running secure stack stays secure",
    )
    up.add_argument(
        "--trace-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="every service appends its trace spans to PATH as JSON lines (docs/OBSERVABILITY.md)",
    )
    up.set_defaults(func=cmd_up)

    sub.add_parser("down", parents=[common], help="stop the local mesh").set_defaults(func=cmd_down)

    status = sub.add_parser("status", parents=[common], help="processes and, with --collection, its counts")
    status.add_argument("--collection", default=None)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    ingest = sub.add_parser(
        "ingest", parents=[common], help="submit files, folders or BEIR corpus.jsonl(.gz)"
    )
    ingest.add_argument("paths", nargs="+", metavar="PATH")
    ingest.add_argument("--collection", default="default")
    ingest.add_argument("--wait", action="store_true", help="wait until indexed; fail if any document failed")
    ingest.add_argument("--timeout", type=float, default=1800.0, help="seconds --wait waits (default 1800)")
    ingest.add_argument("--in-flight", type=int, default=4, help="concurrent IngestDocuments requests")
    add_folder_arguments(ingest)
    ingest.set_defaults(func=cmd_ingest)

    search_parser = sub.add_parser("search", parents=[common], help="search a collection through the gateway")
    search.add_arguments(search_parser)
    search_parser.set_defaults(func=cmd_search)

    ask_parser = sub.add_parser(
        "ask", parents=[common], help="a cited answer from a collection, streamed as it is written"
    )
    ask.add_arguments(ask_parser)
    ask_parser.set_defaults(func=cmd_ask)

    mcp_server.add_parser(sub, common, cmd_mcp)

    eval_parser = sub.add_parser(
        "eval", parents=[common], help="retrieval quality on a BEIR dataset, or compare two saved runs"
    )
    evaluation.add_arguments(eval_parser)
    answer_eval.add_arguments(eval_parser)
    eval_parser.set_defaults(func=cmd_eval)

    loadtest_parser = sub.add_parser(
        "loadtest", parents=[common], help="drive one stage (or the gateway) with load; throughput, latency"
    )
    loadtest.add_arguments(loadtest_parser)
    loadtest_parser.set_defaults(func=cmd_loadtest)

    delete = sub.add_parser("delete", parents=[common], help="delete documents from a collection")
    delete.add_argument("doc_ids", nargs="+", metavar="DOC_ID")
    delete.add_argument("--collection", required=True)
    delete.set_defaults(func=cmd_delete)

    dlq = sub.add_parser("dlq", parents=[common], help="dead-lettered ingest events")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    dlq_list = dlq_sub.add_parser("list", parents=[common], help="list dead letters")
    dlq_list.add_argument("--collection", default=None)
    dlq_list.add_argument("--limit", type=int, default=100)
    dlq_list.add_argument("--json", action="store_true")
    dlq_list.set_defaults(func=cmd_dlq_list)
    replay = dlq_sub.add_parser("replay", parents=[common], help="put dead letters back on the ingest stream")
    replay.add_argument("--collection", default=None)
    replay.add_argument("--seq", type=int, nargs="+", default=None, help="dead-letter sequence numbers")
    replay.set_defaults(func=cmd_dlq_replay)

    models = sub.add_parser("models", parents=[common], help="build the models ragmesh ships")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    build_reranker = models_sub.add_parser(
        "build-reranker",
        parents=[common],
        help="train the default cross-encoder (needs torch: pip install -r requirements-build.txt)",
    )
    from ragmesh_cli.rerankerbuild.arguments import add_arguments as add_build_arguments

    add_build_arguments(build_reranker)
    build_reranker.set_defaults(func=cmd_build_reranker)

    reindex.add_parser(sub, common)
    calibrate.add_parser(sub, common)

    config = sub.add_parser("config", parents=[common], help="every RAGMESH_* setting with its default")
    config.add_argument("--json", action="store_true")
    config.add_argument(
        "--calibration",
        action="store_true",
        help="print the models' calibration in force (RAGMESH_GATEWAY_MODEL_CALIBRATION_FILE), as JSON",
    )
    config.set_defaults(func=cmd_config)

    keys.add_parser(sub, common)

    certs_parser = sub.add_parser("certs", parents=[common], help="mesh certificates (docs/SECURITY.md)")
    certs_sub = certs_parser.add_subparsers(dest="certs_command", required=True)
    certs_new = certs_sub.add_parser(
        "new", parents=[common], help="a mesh CA and a key + certificate per service identity"
    )
    certs.add_arguments(certs_new)
    certs_new.set_defaults(func=certs.run_new)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    finally:
        # The key and the secure stack's TLS are this command's: a program that runs several
        # commands in one process (the tests, an embedding tool) must not carry one's into the next.
        use_api_key(None)
        use_state_dir(None)


def _run(args: argparse.Namespace) -> int:
    use_api_key(getattr(args, "api_key", None))
    try:
        use_state_dir(state_dir_of(args))
        code: int = args.func(args)
    except grpc.RpcError as exc:
        code_name = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        print(f"error: {code_name}: {details}", file=sys.stderr)
        return 1
    except RagmeshError as exc:
        print(f"error: {exc.code.name}: {exc.message}", file=sys.stderr)
        return 1
    except (StackError, InputError, RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into e.g. `head`: stop quietly, and keep the interpreter's final flush silent.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
