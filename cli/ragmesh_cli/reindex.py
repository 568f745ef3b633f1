"""``ragmesh reindex --collection C``: re-embed a collection into a new generation with the
embedder that serves now, and switch its readers to it when complete.

The work happens in the mesh (the ingestion API's ``ReindexCollection`` submits each document's
stored bytes to the new generation; the ingestion workers embed and index them); this command
drives it through ragmesh_client's ``reindex`` (one bounded step per call, a step failing on
the way tried again) and prints a progress line per change. Searches keep answering from the
old generation until the switch. Interrupted (Ctrl-C, a crash, a lost connection), it is
resumed by running the same command again: the reindex's state is the collection record in
NATS, not this process.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any, TextIO

from meshkit.domain.collections import physical_name
from ragmesh_cli.addresses import resolve_address
from ragmesh_cli.channels import ingestion_client
from ragmesh_cli.state import state_dir_of
from ragmesh_client import ReindexProgress

STEP_TIMEOUT_S = 60.0
# Transient failures of one step (the API restarting, NATS failing over) are retried this long.
RETRY_WINDOW_S = 120.0


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


def progress_line(progress: ReindexProgress, elapsed_s: float) -> str:
    head = f"[{elapsed_s:6.0f}s] {progress.collection}: {progress.phase}"
    if progress.phase == "building":
        model = f" with {progress.building_model}" if progress.building_model else ""
        return (
            f"{head} generation {progress.other_generation}{model}: {progress.indexed}/{progress.documents} "
            f"indexed, {progress.pending} waiting, {progress.failed} failed; generation "
            f"{progress.serving_generation} serves"
        )
    if progress.phase == "retiring":
        return (
            f"{head}: generation {progress.serving_generation} ({progress.serving_model}) serves; "
            f"deleting generation {progress.other_generation} ({progress.retiring} documents left)"
        )
    return f"{head}: generation {progress.serving_generation} ({progress.serving_model}) serves"


class _Printer:
    """The progress callback: one line per change of progress (not per poll), and what to do
    about documents that failed in the new generation."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.started = time.monotonic()
        self.last = ""

    def __call__(self, progress: ReindexProgress) -> None:
        line = progress_line(progress, time.monotonic() - self.started)
        if line.split("] ", 1)[1] != self.last:
            print(line, file=self.out, flush=True)
            self.last = line.split("] ", 1)[1]
        if progress.stuck_on_failures:
            generation = physical_name(progress.collection, progress.other_generation)
            print(
                f"{progress.failed} documents failed in the new generation: see `ragmesh dlq list "
                f"--collection {generation}`, replay them once the cause is fixed; the switch waits "
                "for them",
                file=self.out,
                flush=True,
            )


async def reindex(
    address: str, collection: str, interval_s: float, timeout_s: float, out: TextIO = sys.stdout
) -> int:
    """Drive the reindex to its end; 0 when done, 1 when ``timeout_s`` passed first."""
    async with ingestion_client(address) as client:
        try:
            await client.reindex(
                collection,
                on_progress=_Printer(out),
                interval_s=interval_s,
                timeout=timeout_s or None,
                step_timeout=STEP_TIMEOUT_S,
                step_retry_s=RETRY_WINDOW_S,
            )
        except TimeoutError:
            print(
                f"not complete after {timeout_s:g}s; run the same command again to resume",
                file=out,
                flush=True,
            )
            return 1
    return 0


def run(args: argparse.Namespace) -> int:
    address = resolve_address("ingestion", state_dir_of(args))
    return asyncio.run(reindex(address, args.collection, args.interval, args.timeout))
