"""``ragmesh reindex --collection C``: re-embed a collection into a new generation with the
embedder that serves now, and switch its readers to it when complete.

The work happens in the mesh (the ingestion API's ``ReindexCollection`` submits each document's
stored bytes to the new generation; the ingestion workers embed and index them); this command
drives it, one bounded step per call, and prints a progress line per step. Searches keep
answering from the old generation until the switch. Interrupted (Ctrl-C, a crash, a lost
connection), it is resumed by running the same command again: the reindex's state is the
collection record in NATS, not this process.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any, TextIO

import grpc

from meshkit.collections import physical_name
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli.addresses import resolve_address
from ragmesh_cli.channels import open_channel
from ragmesh_cli.state import state_dir_of

PHASES = {
    ingestion_pb2.REINDEX_PHASE_BUILDING: "building",
    ingestion_pb2.REINDEX_PHASE_RETIRING: "retiring",
    ingestion_pb2.REINDEX_PHASE_DONE: "done",
}
STEP_TIMEOUT_S = 60.0
# Transient failures of one step (the API restarting, NATS failing over) are retried this long.
RETRY_WINDOW_S = 120.0
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "reindex",
        parents=[common],
        help="re-embed a collection into a new generation and switch readers to it when complete",
    )
    parser.add_argument("--collection", required=True)
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between progress steps (default 2)"
    )
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="give up waiting after this many seconds (0: never)"
    )
    parser.set_defaults(func=run)


def progress_line(reply: ingestion_pb2.ReindexCollectionResponse, elapsed_s: float) -> str:
    phase = PHASES.get(reply.phase, "unknown")
    head = f"[{elapsed_s:6.0f}s] {reply.collection}: {phase}"
    if reply.phase == ingestion_pb2.REINDEX_PHASE_BUILDING:
        model = f" with {reply.building_model}" if reply.building_model else ""
        return (
            f"{head} generation {reply.other_generation}{model}: {reply.indexed}/{reply.documents} indexed, "
            f"{reply.pending} waiting, {reply.failed} failed; generation {reply.serving_generation} serves"
        )
    if reply.phase == ingestion_pb2.REINDEX_PHASE_RETIRING:
        return (
            f"{head}: generation {reply.serving_generation} ({reply.serving_model}) serves; "
            f"deleting generation {reply.other_generation} ({reply.retiring} documents left)"
        )
    return f"{head}: generation {reply.serving_generation} ({reply.serving_model}) serves"


async def _step(
    stub: ingestion_pb2_grpc.IngestionServiceStub, collection: str, start: bool
) -> ingestion_pb2.ReindexCollectionResponse:
    deadline = time.monotonic() + RETRY_WINDOW_S
    while True:
        try:
            request = ingestion_pb2.ReindexCollectionRequest(collection=collection, start=start)
            reply: ingestion_pb2.ReindexCollectionResponse = await stub.ReindexCollection(
                request, timeout=STEP_TIMEOUT_S
            )
            return reply
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRYABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


async def reindex(
    address: str, collection: str, interval_s: float, timeout_s: float, out: TextIO = sys.stdout
) -> int:
    """Drive the reindex to its end; 0 when done, 1 when ``timeout_s`` passed first."""
    started = time.monotonic()
    last = ""
    async with open_channel(address) as channel:
        stub = ingestion_pb2_grpc.IngestionServiceStub(channel)
        reply = await _step(stub, collection, start=True)
        while True:
            line = progress_line(reply, time.monotonic() - started)
            if line.split("] ", 1)[1] != last:  # one line per change, not per poll
                print(line, file=out, flush=True)
                last = line.split("] ", 1)[1]
            if reply.phase == ingestion_pb2.REINDEX_PHASE_DONE:
                return 0
            if reply.failed and not reply.pending:
                generation = physical_name(reply.collection, reply.other_generation)
                print(
                    f"{reply.failed} documents failed in the new generation: see `ragmesh dlq list "
                    f"--collection {generation}`, replay them once the cause is fixed; the switch waits "
                    "for them",
                    file=out,
                    flush=True,
                )
            if timeout_s and time.monotonic() - started > timeout_s:
                print(
                    f"not complete after {timeout_s:g}s; run the same command again to resume",
                    file=out,
                    flush=True,
                )
                return 1
            await asyncio.sleep(interval_s)
            reply = await _step(stub, collection, start=False)


def run(args: argparse.Namespace) -> int:
    address = resolve_address("ingestion", state_dir_of(args))
    return asyncio.run(reindex(address, args.collection, args.interval, args.timeout))
