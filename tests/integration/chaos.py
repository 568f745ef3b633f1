"""Chaos for the write path: documents submitted, edited, deleted and re-submitted while a fault
injector SIGKILLs a random process of the mesh on a schedule, with production timings (lease,
ack_wait, max_deliver as shipped). When the schedule ends and every document has settled, the
verifier checks the invariants the write path promises:

- every document is in its last submitted version (or deleted) in every store and every replica:
  the same chunk ids, computed here independently from the submitted bytes with the worker's own
  normalisation and chunking, the same fences across replicas of a shard;
- nothing is left in a non-final state, nothing accepted is lost;
- no chunk id is held twice (checked directly on every replica's listing);
- the dead-letter stream holds exactly the poison documents that were injected, once each.

``test_chaos.py`` runs a short schedule in CI; ``make chaos`` runs ten minutes of it. This module
runs one schedule; the workload, the fault injector and the verifier are ``chaos_workload``,
``chaos_faults`` and ``chaos_verify``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from meshkit.settings import IngestionSettings
from ragmesh_cli.stack import Stack

from .chaos_faults import FaultInjector
from .chaos_verify import Verifier
from .chaos_workload import Workload
from .meshclients import Mesh


@dataclass
class ChaosConfig:
    duration_s: float
    documents: int = 40
    poison: int = 3
    seed: int = 0
    settle_timeout_s: float = 600.0


async def run_chaos(
    stack: Stack, victims: Sequence[str], config: ChaosConfig, collection: str
) -> dict[str, Any]:
    """The workload and the fault injector side by side for ``duration_s``, then settle and verify.
    Returns the report (raises Violation when an invariant does not hold)."""
    rng = random.Random(config.seed)
    mesh = Mesh(stack)
    workload = Workload(mesh.ingestion, collection, rng, config.documents, config.poison)
    injector = FaultInjector(stack, victims, random.Random(config.seed + 1))
    stop = asyncio.Event()
    started = time.monotonic()
    tasks = [asyncio.create_task(workload.run(stop)), asyncio.create_task(injector.run(stop))]
    try:
        await asyncio.sleep(config.duration_s)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    chaos_s = round(time.monotonic() - started, 1)
    verifier = Verifier(mesh, workload, IngestionSettings())
    try:
        settle_s = await verifier.settle(config.settle_timeout_s)
        checks = await verifier.verify()
    finally:
        await mesh.close()
    return {
        "seed": config.seed,
        "secure": stack.secure,
        "chaos_seconds": chaos_s,
        "settle_seconds": settle_s,
        "operations": {
            "submitted": workload.log.submitted,
            "unchanged": workload.log.unchanged,
            "deleted": workload.log.deleted,
            "poison": len(workload.poison_ids),
            "retried_calls": workload.log.retried_calls,
            "errors_by_code": dict(workload.log.by_code),
        },
        "injected": injector.summary(),
        "verified": checks,
    }


def write_report(report: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
