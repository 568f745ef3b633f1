"""A real Prometheus server (Debian's ``prometheus``) on 127.0.0.1 scrapes the local stack's
/metrics ports (as ``ragmesh up`` records them in stack.json) and evaluates the shipped rules
(deploy/prometheus/ragmesh-rules.yml) against them:

- every service process is a healthy target, and the series the rules use are there;
- every rule group loads and evaluates without error, and the recording rules produce series
  from the stack's own traffic (a search through the gateway);
- killing a process makes RagmeshTargetDown go pending for exactly that process.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ragmesh.gateway.v1 import gateway_pb2 as gw
from ragmesh.gateway.v1 import gateway_pb2_grpc
from ragmesh_cli import procutil
from ragmesh_cli.stack import Stack

from .meshclients import Mesh

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed (apt-get install prometheus)"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/ragmesh-rules.yml"
SERVICES = ["embedder", "index", "sparse", "planner", "reranker", "ingestion", "gateway", "worker"]
COLLECTION = "scraped"


def scrape_config(stack: Stack, rules: Path) -> dict[str, Any]:
    """One job per service kind (``ragmesh-<kind>``), a target per process's metrics port."""
    jobs: dict[str, list[str]] = {}
    for comp in stack.components.values():
        if "metrics" in comp.ports:
            jobs.setdefault(f"ragmesh-{comp.kind}", []).append(f"127.0.0.1:{comp.ports['metrics']}")
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": sorted(targets)}]}
            for job, targets in sorted(jobs.items())
        ],
    }


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query", query=expr)["result"])

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(0.5)
        raise AssertionError(f"{what}: not after {timeout}s (last: {last})")


@pytest.fixture(scope="module")
def scraped_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Prometheus]]:
    state_dir = tmp_path_factory.mktemp("scraped")
    with Stack(state_dir, workers=1, services=SERVICES, index_shards=2) as stack:
        config = state_dir / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(stack, RULES)), encoding="utf-8")
        port = procutil.free_ports(1)[0]
        argv = [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={state_dir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        with (state_dir / "prometheus.log").open("wb") as log:
            server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            prometheus = Prometheus(port)
            prometheus.wait_for("prometheus ready", lambda: _ready(prometheus), timeout=30)
            yield stack, prometheus
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _ready(prometheus: Prometheus) -> bool:
    try:
        with urllib.request.urlopen(f"{prometheus.base}/-/ready", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def test_every_service_process_is_a_healthy_target(scraped_stack: tuple[Stack, Prometheus]) -> None:
    stack, prometheus = scraped_stack
    processes = [c for c in stack.components.values() if "metrics" in c.ports]
    assert len(processes) == len(SERVICES) + 1  # two index shards

    def all_up() -> list[dict[str, Any]]:
        targets = prometheus.get("/api/v1/targets")["activeTargets"]
        healthy = [t for t in targets if t["health"] == "up"]
        return targets if len(healthy) == len(processes) == len(targets) else []

    prometheus.wait_for("every target up", all_up)
    up = prometheus.query('up{job=~"ragmesh-.*"} == 1')
    assert {r["metric"]["job"] for r in up} == {f"ragmesh-{kind}" for kind in SERVICES}
    # A family without labels is there from the start (labelled ones appear with their first use).
    workers = prometheus.query("ragmesh_ingest_worker_in_flight")
    assert [w["metric"]["job"] for w in workers] == ["ragmesh-worker"]


def test_the_shipped_rules_evaluate_against_the_live_stack(scraped_stack: tuple[Stack, Prometheus]) -> None:
    stack, prometheus = scraped_stack
    shipped = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    # A counter appears with its first use: scraped once before more traffic, so rate() sees it grow.
    _search_through_the_gateway(stack, searches=1)
    searches = 'ragmesh_rpc_requests_total{job="ragmesh-gateway",service="gateway",method="Search",code="OK"}'
    prometheus.wait_for("the gateway's Search counter scraped", lambda: prometheus.query(searches))
    _search_through_the_gateway(stack, searches=3)

    def evaluated() -> list[dict[str, Any]]:
        groups = prometheus.get("/api/v1/rules")["groups"]
        # A group not evaluated yet reports the zero time (year 1).
        done = all(not g["lastEvaluation"].startswith("0001") for g in groups)
        return groups if done and len(groups) == len(shipped) else []

    groups = prometheus.wait_for("every rule group evaluated", evaluated)
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == sum(len(g["rules"]) for g in shipped)
    broken = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not broken, broken
    # The recording rules turn the stack's own traffic into series: the gateway's Search calls.
    rate = prometheus.wait_for(
        "recorded Search rate",
        lambda: prometheus.query('ragmesh:rpc_requests:rate5m{service="gateway",method="Search"} > 0'),
    )
    assert rate[0]["metric"]["service"] == "gateway"
    stages = prometheus.wait_for(
        "recorded stage p95", lambda: prometheus.query("ragmesh:gateway_stage_seconds:p95_5m >= 0")
    )
    assert {"embed", "dense"} <= {s["metric"]["stage"] for s in stages}
    # A healthy stack fires nothing.
    firing = [a for a in prometheus.get("/api/v1/alerts")["alerts"] if a["state"] == "firing"]
    assert not firing, firing


def test_a_killed_process_puts_target_down_pending_for_it(scraped_stack: tuple[Stack, Prometheus]) -> None:
    stack, prometheus = scraped_stack
    victim = stack.component("reranker")
    instance = f"127.0.0.1:{victim.ports['metrics']}"
    stack.kill("reranker")
    try:

        def pending() -> list[dict[str, Any]]:
            alerts = prometheus.get("/api/v1/alerts")["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "RagmeshTargetDown"]

        alerts = prometheus.wait_for("RagmeshTargetDown pending", pending, timeout=30)
        assert [(a["labels"]["job"], a["labels"]["instance"]) for a in alerts] == [
            ("ragmesh-reranker", instance)
        ]
        assert alerts[0]["state"] == "pending"  # its 'for: 2m' has not passed yet
        assert alerts[0]["labels"]["severity"] == "page"
    finally:
        stack.start("reranker")


def _search_through_the_gateway(stack: Stack, searches: int) -> None:
    async def search() -> None:
        mesh = Mesh(stack)
        try:
            await mesh.ingest_indexed(
                COLLECTION, [("scrape.md", "# Scraping\n\nPrometheus scrapes every port.")]
            )
            gateway = gateway_pb2_grpc.GatewayServiceStub(mesh.channel("gateway"))
            for _ in range(searches):
                found = await gateway.Search(
                    gw.SearchRequest(collection=COLLECTION, query="scrapes"), timeout=30
                )
                assert found.results
        finally:
            await mesh.close()

    asyncio.run(search())
