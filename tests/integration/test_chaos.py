"""The write path under chaos with production timings (see chaos.py for what is injected and
what is verified). CI runs a short schedule (RAGMESH_CHAOS_SECONDS, default 90 s); ``make
chaos`` runs ten minutes and writes the report to RAGMESH_CHAOS_REPORT."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator

import pytest

from ragmesh_cli.stack import Stack

from .chaos import ChaosConfig, run_chaos, write_report

pytestmark = pytest.mark.integration

CHAOS_SECONDS = float(os.environ.get("RAGMESH_CHAOS_SECONDS", "90"))
SEED = int(os.environ.get("RAGMESH_CHAOS_SEED", "11"))
# Closed, as shipped: API keys, mTLS with an identity per service, NATS and S3 with per-service
# credentials over TLS (RAGMESH_CHAOS_SECURE=0 runs the plain local stack instead).
SECURE = os.environ.get("RAGMESH_CHAOS_SECURE", "1") != "0"
# Only what the write path needs: the read path's stages would only share the two cores.
SERVICES = ["embedder", "index", "sparse", "ingestion", "worker"]
# Nothing shortened: lease, ack_wait, max_deliver, backoffs and breakers are the shipped
# defaults (libs/meshkit/settings/). Only the log level is set.
ENV = {"RAGMESH_LOG_LEVEL": "INFO"}


@pytest.fixture(scope="module")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("chaos"),
        workers=2,
        index_shards=2,
        services=SERVICES,
        extra_env=ENV,
        replicas={"index": 2, "sparse": 2},
        secure=SECURE,
    ) as stack:
        yield stack


def victims_of(stack: Stack) -> list[str]:
    kinds = {"worker", "index", "sparse", "embedder", "nats", "s3"}
    return [name for name in stack.names() if stack.component(name).kind in kinds]


@pytest.mark.timeout(int(CHAOS_SECONDS) + 1200)
async def test_write_path_survives_random_kills_with_production_timings(chaos_stack: Stack) -> None:
    config = ChaosConfig(duration_s=CHAOS_SECONDS, seed=SEED)
    collection = f"chaos-{uuid.uuid4().hex[:8]}"
    report = await run_chaos(chaos_stack, victims_of(chaos_stack), config, collection)
    path = os.environ.get("RAGMESH_CHAOS_REPORT") or str(chaos_stack.state_dir / "chaos-report.json")
    await asyncio.to_thread(write_report, report, path)
    print(
        json.dumps(
            {k: v for k, v in report.items() if k != "injected"} | {"kills": report["injected"]["by_kind"]},
            indent=2,
        )
    )
    assert report["injected"]["kills"] >= max(1, int(CHAOS_SECONDS // 15)), report["injected"]
    assert not report["injected"]["failed_restarts"], report["injected"]["failed_restarts"]
    if chaos_stack.secure:
        # Restarts, reconnects, redeliveries and the reconciler all stayed within each service's
        # NATS grants: the server saw no permission violation.
        violations = [
            line for line in chaos_stack.log_path("nats").read_text().splitlines() if "Violation" in line
        ]
        assert not violations, violations[:5]
