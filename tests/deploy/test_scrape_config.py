"""The Prometheus scrape jobs shipped for Kubernetes (deploy/prometheus/scrape-kubernetes.yml) fit
the manifests and the mesh's metrics ports, which are HTTPS with a required client certificate
under RAGMESH_SERVICE_AUTH=mtls: every gRPC pod's metrics port is scraped by one `ragmesh-<kind>`
job, over https, verifying the pod by its identity, with the scrape-only `prometheus`
certificate; each way back is a check_manifests.py finding; promtool accepts the file; and the
certificates `ragmesh certs new` and scraper_cert.py make pass such a scrape of a real metrics
server (and a scrape with another mesh identity's certificate does not)."""

from __future__ import annotations

import copy
import shutil
import socket
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshkit.rpc.metrics import serve_metrics
from meshkit.rpc.pki import PKIFiles, write_pki
from meshkit.rpc.tls import metrics_tls
from meshkit.settings import MeshSettings

from .loader import load_deploy_module
from .test_manifests import KUBECTL, Docs, render

ROOT = Path(__file__).resolve().parents[2]
SCRAPE = ROOT / "deploy/prometheus/scrape-kubernetes.yml"

check_manifests = load_deploy_module("check_manifests")
manifest_scrape = load_deploy_module("manifest_scrape")
scraper_cert = load_deploy_module("scraper_cert")
make_secrets = load_deploy_module("make_secrets")

# The local stack's kinds, which the rule tests' job names use: the workers are "worker".
KIND = {"ingestion-worker": "worker"}

Config = dict[str, Any]


@pytest.fixture(scope="module")
def shipped_docs() -> dict[str, Docs]:
    if not KUBECTL.exists():
        pytest.skip("kubectl not installed (make setup)")
    return {o: render(ROOT / "deploy/k8s/overlays" / o) for o in ("local", "gpu")}


@pytest.fixture
def scrape() -> Config:
    return manifest_scrape.load_scrape_config(SCRAPE)


def _jobs_of(config: Config, docs: Docs) -> dict[tuple[str, int], list[str]]:
    """(pod, container port) -> the jobs that scrape it, for every port of every pod."""
    rendered = check_manifests.Rendered(docs)
    found = {}
    for pod in rendered.pods:
        for target in manifest_scrape.pod_targets(pod, rendered.namespace):
            port = int(target["__meta_kubernetes_pod_container_port_number"])
            jobs = manifest_scrape.scraping_jobs(config, target)
            found[(pod.name, port)] = [j["job_name"] for j in jobs]
    return found


@pytest.mark.parametrize("overlay", ["local", "gpu"])
def test_each_stage_is_scraped_once_on_its_metrics_port_only(
    shipped_docs: dict[str, Docs], scrape: Config, overlay: str
) -> None:
    jobs = _jobs_of(scrape, shipped_docs[overlay])
    for identity in make_secrets.IDENTITIES:
        assert jobs[(identity, 9090)] == [f"ragmesh-{KIND.get(identity, identity)}"], identity
        assert jobs[(identity, 50051)] == [], identity  # the gRPC port is not an HTTP endpoint
    # NATS, MinIO and the LLM are not mesh services: their annotations serve other jobs.
    others = {
        job for (pod, _port), names in jobs.items() if pod not in make_secrets.IDENTITIES for job in names
    }
    assert others == set()


def test_every_job_scrapes_over_https_with_the_scraper_certificate(scrape: Config) -> None:
    for job in scrape["scrape_configs"]:
        tls = job["tls_config"]
        assert job["scheme"] == "https", job["job_name"]
        assert not tls.get("insecure_skip_verify"), job["job_name"]
        assert {Path(tls[f]).name for f in ("ca_file", "cert_file", "key_file")} == {
            "ca.crt",
            "tls.crt",
            "tls.key",
        }
        assert {Path(tls[f]).parent.name for f in ("ca_file", "cert_file", "key_file")} == {
            make_secrets.SCRAPER_SECRET
        }
        # The merge key (<<) carried the files into every job, each with its own server name.
        assert tls["server_name"] in make_secrets.IDENTITIES


def _job(config: Config, name: str) -> dict[str, Any]:
    job: dict[str, Any] = next(j for j in config["scrape_configs"] if j["job_name"] == name)
    return job


def _set_tls(config: Config, name: str, **fields: Any) -> None:
    # A new mapping: the YAML's anchors share objects between jobs, which must not change too.
    job = _job(config, name)
    job["tls_config"] = {k: v for k, v in {**job["tls_config"], **fields}.items() if v is not None}


def _http(config: Config) -> None:
    _job(config, "ragmesh-embedder")["scheme"] = "http"


def _skip_verify(config: Config) -> None:
    _set_tls(config, "ragmesh-gateway", insecure_skip_verify=True)


def _no_client_cert(config: Config) -> None:
    _set_tls(config, "ragmesh-worker", cert_file=None, key_file=None)


def _wrong_server_name(config: Config) -> None:
    _set_tls(config, "ragmesh-index", server_name="localhost")


def _job_dropped(config: Config) -> None:
    config["scrape_configs"] = [j for j in config["scrape_configs"] if j["job_name"] != "ragmesh-narrator"]


def _catch_all_http_job(config: Config) -> None:
    config["scrape_configs"].append(
        {
            "job_name": "kubernetes-pods",
            "kubernetes_sd_configs": [{"role": "pod"}],
            "relabel_configs": [
                {
                    "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                    "regex": "true",
                    "action": "keep",
                }
            ],
        }
    )


SCRAPE_MUTATIONS: dict[str, tuple[Callable[[Config], None], str]] = {
    "plain HTTP": (_http, "job ragmesh-embedder scrapes embedder:9090 over plain HTTP"),
    "no certificate check": (_skip_verify, "without verifying its certificate (insecure_skip_verify)"),
    "no client certificate": (
        _no_client_cert,
        "without tls.crt of Secret ragmesh-tls-prometheus as cert_file",
    ),
    "another server name": (_wrong_server_name, "verifying it as 'localhost', not its identity 'index'"),
    "a stage left out": (_job_dropped, "no job of the shipped scrape config scrapes narrator:9090"),
    "an annotation job in plaintext": (
        _catch_all_http_job,
        "job kubernetes-pods scrapes gateway:9090 over plain HTTP",
    ),
}


@pytest.mark.parametrize("mutation", sorted(SCRAPE_MUTATIONS))
def test_each_way_back_in_the_scrape_config_is_caught(
    shipped_docs: dict[str, Docs], scrape: Config, mutation: str
) -> None:
    change, expected = SCRAPE_MUTATIONS[mutation]
    assert check_manifests.check(copy.deepcopy(shipped_docs["gpu"]), scrape) == []
    broken = copy.deepcopy(scrape)
    change(broken)
    findings = check_manifests.check(copy.deepcopy(shipped_docs["gpu"]), broken)
    assert any(expected in f for f in findings), findings


def test_relabelling_is_evaluated_as_prometheus_does() -> None:
    target = {"a": "x-1", "b": "y"}
    keep = [{"source_labels": ["a", "b"], "regex": "x-.;y", "action": "keep"}]
    assert manifest_scrape.relabel(target, keep) == target
    # Anchored: a regex that matches part of the value does not keep it.
    assert manifest_scrape.relabel(target, [{"source_labels": ["a"], "regex": "x", "action": "keep"}]) is None
    assert manifest_scrape.relabel(target, [{"source_labels": ["b"], "regex": "y", "action": "drop"}]) is None
    moved = manifest_scrape.relabel(
        target, [{"source_labels": ["a"], "regex": "x-(.*)", "target_label": "n", "replacement": "n${1}"}]
    )
    assert moved == {**target, "n": "n1"}
    with pytest.raises(manifest_scrape.RelabelError, match="hashmod"):
        manifest_scrape.relabel(target, [{"action": "hashmod", "modulus": 2, "target_label": "h"}])


# ------------------------------------------------------------------------------- promtool


def _with_local_files(config: Config, directory: Path, static: bool) -> Config:
    """The config with its TLS files under ``directory`` (promtool opens them) and, for a
    Prometheus built without Kubernetes discovery (Debian's), a static target instead."""
    out = copy.deepcopy(config)
    for job in out["scrape_configs"]:
        tls = job["tls_config"]
        for field in ("ca_file", "cert_file", "key_file"):
            tls[field] = str(directory / Path(tls[field]).name)
        if static:
            del job["kubernetes_sd_configs"]
            job["static_configs"] = [{"targets": ["127.0.0.1:9090"]}]
    return out


def test_promtool_accepts_the_scrape_config(scrape: Config, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / name).write_text("")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(_with_local_files(scrape, tmp_path, static=False)))
    checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    if "field kubernetes_sd_configs not found" in checked.stdout + checked.stderr:
        config.write_text(yaml.safe_dump(_with_local_files(scrape, tmp_path, static=True)))
        checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# ------------------------------------------------------------------------------- the handshake


@pytest.fixture(scope="module")
def k8s_pki(tmp_path_factory: pytest.TempPathFactory) -> PKIFiles:
    """As the README makes it: `ragmesh certs new --namespace ragmesh`, then scraper_cert.py."""
    directory = tmp_path_factory.mktemp("k8s-pki") / "pki"
    files = write_pki(directory, namespace="ragmesh", days=1)
    scraper_cert.write_scraper_cert(directory, days=1)
    return files


@pytest.fixture(scope="module")
def index_metrics(k8s_pki: PKIFiles) -> Iterator[int]:
    """The index's metrics port, as its pod serves it (RAGMESH_SERVICE_AUTH=mtls, its own pair)."""
    settings = MeshSettings(
        service_auth="mtls",
        tls_cert_file=k8s_pki.cert("index"),
        tls_key_file=k8s_pki.key("index"),
        tls_ca_file=k8s_pki.ca_cert,
    )
    server = serve_metrics(0, "127.0.0.1", metrics_tls(settings))
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _scrape_as(job: Config, files: PKIFiles, identity: str, port: int) -> int:
    """The HTTP status of a scrape with the job's TLS settings, the Secret's files being
    ``identity``'s."""
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    context.load_cert_chain(files.cert(identity), files.key(identity))
    # Pods are scraped by IP: Prometheus checks the certificate against server_name instead.
    server_name = job["tls_config"]["server_name"]
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        status_line = tls.makefile("rb").readline()
    return int(status_line.split()[1])


def test_the_shipped_job_scrapes_a_pod_with_the_scraper_certificate(
    scrape: Config, k8s_pki: PKIFiles, index_metrics: int
) -> None:
    job = next(j for j in scrape["scrape_configs"] if j["job_name"] == "ragmesh-index")
    assert _scrape_as(job, k8s_pki, "prometheus", index_metrics) == 200
    # Another mesh identity's certificate in the Secret: the handshake passes, the scrape does not.
    assert _scrape_as(job, k8s_pki, "embedder", index_metrics) == 403
    # The embedder's job verifies the server as the embedder: the index's certificate is not that.
    embedder_job = next(j for j in scrape["scrape_configs"] if j["job_name"] == "ragmesh-embedder")
    with pytest.raises(ssl.SSLCertVerificationError):
        _scrape_as(embedder_job, k8s_pki, "prometheus", index_metrics)
