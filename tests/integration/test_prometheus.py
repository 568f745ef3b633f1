"""A real Prometheus server (Debian's ``prometheus``) on 127.0.0.1 scrapes the local stack's
/metrics ports (as ``ragmesh up`` records them in stack.json) and evaluates the shipped rules
(deploy/prometheus/ragmesh-rules.yml) against them:

- every service process is a healthy target, and the series the rules use are there;
- every rule group loads and evaluates without error, and the recording rules produce series
  from the stack's own traffic (a search through the gateway);
- killing a process makes RagmeshTargetDown go pending for exactly that process;
- the scrape jobs shipped for Kubernetes (deploy/prometheus/scrape-kubernetes.yml) scrape a
  metrics port served as a pod serves it (RAGMESH_SERVICE_AUTH=mtls: HTTPS requiring a mesh
  client certificate) with the scraper's certificate, and fail without one or with another
  identity's. (The local stack above is a plain one: its ports are plaintext HTTP.)
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib.util
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

from meshkit.rpc.metrics import serve_metrics
from meshkit.rpc.pki import PKIFiles, write_pki
from meshkit.rpc.tls import metrics_tls
from meshkit.settings import MeshSettings
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
K8S_SCRAPE = ROOT / "deploy/prometheus/scrape-kubernetes.yml"
SCRAPER_CERT = ROOT / "deploy/k8s/scraper_cert.py"
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


@contextlib.contextmanager
def running_prometheus(state_dir: Path, config: dict[str, Any]) -> Iterator[Prometheus]:
    """A Prometheus on 127.0.0.1 with ``config``, its data and log in ``state_dir``."""
    path = state_dir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = procutil.free_ports(1)[0]
    argv = [
        "prometheus",
        f"--config.file={path}",
        f"--storage.tsdb.path={state_dir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (state_dir / "prometheus.log").open("wb") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        prometheus = Prometheus(port)
        prometheus.wait_for("prometheus ready", lambda: _ready(prometheus), timeout=30)
        yield prometheus
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def scraped_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Prometheus]]:
    state_dir = tmp_path_factory.mktemp("scraped")
    with (
        Stack(state_dir, workers=1, services=SERVICES, index_shards=2) as stack,
        running_prometheus(state_dir, scrape_config(stack, RULES)) as prometheus,
    ):
        yield stack, prometheus


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


# ------------------------------------------------------------------------------- Kubernetes' jobs


def _write_scraper_cert(pki: Path) -> None:
    # deploy/k8s/scraper_cert.py is a script, run as a file (as the README has it).
    spec = importlib.util.spec_from_file_location("ragmesh_scraper_cert", SCRAPER_CERT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_scraper_cert(pki, days=1)


def _local_job(job: dict[str, Any], name: str, port: int, files: dict[str, Path | None]) -> dict[str, Any]:
    """A shipped job aimed at 127.0.0.1:port instead of discovered pods (the relabelling keeps
    pods by their Kubernetes labels, so it goes too), its Secret's files replaced by ``files``
    (None: left out)."""
    local = copy.deepcopy(job)
    local["job_name"] = name
    del local["kubernetes_sd_configs"], local["relabel_configs"]
    local["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
    tls = dict(local["tls_config"])
    for field, path in files.items():
        if path is None:
            del tls[field]
        else:
            tls[field] = str(path)
    local["tls_config"] = tls
    return local


@pytest.fixture(scope="module")
def pod_like_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PKIFiles, int]]:
    """An index's metrics port as its pod serves it, with the README's PKI (``ragmesh certs new
    --namespace ragmesh``, then scraper_cert.py)."""
    pki = write_pki(tmp_path_factory.mktemp("k8s") / "pki", namespace="ragmesh", days=1)
    _write_scraper_cert(pki.directory)
    settings = MeshSettings(
        service_auth="mtls",
        tls_cert_file=pki.cert("index"),
        tls_key_file=pki.key("index"),
        tls_ca_file=pki.ca_cert,
    )
    server = serve_metrics(0, "127.0.0.1", metrics_tls(settings))
    try:
        yield pki, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_the_kubernetes_scrape_job_scrapes_mtls_metrics_with_the_scraper_certificate(
    pod_like_metrics: tuple[PKIFiles, int], tmp_path: Path
) -> None:
    pki, port = pod_like_metrics
    shipped = yaml.safe_load(K8S_SCRAPE.read_text(encoding="utf-8"))["scrape_configs"]
    job = next(j for j in shipped if j["job_name"] == "ragmesh-index")
    ca = {"ca_file": pki.ca_cert}
    jobs = [
        _local_job(
            job,
            "ragmesh-index",
            port,
            {**ca, "cert_file": pki.cert("prometheus"), "key_file": pki.key("prometheus")},
        ),
        _local_job(job, "no-client-cert", port, {**ca, "cert_file": None, "key_file": None}),
        _local_job(
            job,
            "another-identity",
            port,
            {**ca, "cert_file": pki.cert("embedder"), "key_file": pki.key("embedder")},
        ),
    ]
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}
    with running_prometheus(tmp_path, config) as prometheus:

        def settled() -> dict[str, dict[str, Any]]:
            targets = {t["labels"]["job"]: t for t in prometheus.get("/api/v1/targets")["activeTargets"]}
            return (
                targets
                if len(targets) == 3 and all(t["health"] != "unknown" for t in targets.values())
                else {}
            )

        targets = prometheus.wait_for("every target scraped once", settled, timeout=30)
        assert targets["ragmesh-index"]["health"] == "up", targets["ragmesh-index"]["lastError"]
        assert targets["ragmesh-index"]["scrapeUrl"].startswith("https://")
        # The scrape read this process's registry (prometheus_client's own families are in it).
        assert prometheus.wait_for(
            "scraped series", lambda: prometheus.query('python_info{job="ragmesh-index"}')
        )
        # Refused at the handshake: "remote error: tls: certificate required", or, when the
        # server's alert loses the race with the request Prometheus writes, a reset connection.
        assert targets["no-client-cert"]["health"] == "down"
        refusal = targets["no-client-cert"]["lastError"]
        assert "tls" in refusal or "connection reset" in refusal, refusal
        assert targets["another-identity"]["health"] == "down"
        assert "403" in targets["another-identity"]["lastError"]
