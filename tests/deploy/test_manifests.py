"""The Kubernetes manifests are closed by default: deploy/k8s/check_manifests.py passes on both
shipped overlays, fails on the manifests before this work (each finding of the issue), and fails
on each way back to them (a mutation of the shipped render per finding)."""

from __future__ import annotations

import copy
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
import yaml

from .loader import load_deploy_module

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".venv/bin/kubectl"
# The commit before this work: the manifests the issue describes.
OLD_MANIFESTS = "ba365d8"

check_manifests = load_deploy_module("check_manifests")

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed (make setup)")

Docs = list[dict[str, Any]]


def render(overlay: Path) -> Docs:
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(overlay)], check=True, capture_output=True, text=True
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def shipped() -> dict[str, Docs]:
    return {o: render(ROOT / "deploy/k8s/overlays" / o) for o in ("local", "gpu")}


def test_shipped_overlays_are_closed(shipped: dict[str, Docs]) -> None:
    for overlay, docs in shipped.items():
        assert check_manifests.check(docs) == [], overlay


@pytest.fixture(scope="module")
def old(tmp_path_factory: pytest.TempPathFactory) -> Docs:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git not available")
    archive = subprocess.run(
        [git, "-C", str(ROOT), "archive", OLD_MANIFESTS, "deploy/k8s"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        pytest.skip(f"commit {OLD_MANIFESTS} is not in this clone")
    target = tmp_path_factory.mktemp("old")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(target, filter="data")
    return render(target / "deploy/k8s/overlays/gpu")


def test_the_old_manifests_fail_on_every_finding_of_the_issue(old: Docs) -> None:
    findings = check_manifests.check(old)
    expected = [
        # The GPU overlay published the gateway with no keys and no TLS.
        "edge: Service gateway publishes gateway, needing no API key",
        "edge: Service gateway publishes gateway, serving without TLS",
        # The NetworkPolicy admitted every ragmesh pod (e.g. the embedder reading sparse)...
        "network: embedder may connect to sparse:50051, outside the call graph",
        # ... including the LLM pod, whose egress was open.
        "network: llm may connect out to the internet:443",
        "network: pod llm is not isolated for egress (no policy selects it)",
        # docs/SECURITY.md promised mTLS between services; the manifests set none up.
        "identity: index runs without RAGMESH_SERVICE_AUTH=mtls",
        # NATS and the object store had no per-service credentials (MinIO's root everywhere).
        "credentials: index gets MinIO's root user",
        "nats: nats.conf has no users (authorization)",
        # NATS ran without replicas.
        "nats: 1 server(s); a JetStream cluster needs 3 to survive losing one",
        "nats: nats.conf has no explicit JetStream sync_interval",
    ]
    for finding in expected:
        assert finding in findings


def _workload(docs: Docs, name: str) -> dict[str, Any]:
    return next(
        d for d in docs if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == name
    )


def _container(docs: Docs, name: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = _workload(docs, name)["spec"]["template"]["spec"]["containers"]
    return containers[0]


def _no_api_keys(docs: Docs) -> None:
    c = _container(docs, "gateway")
    c["env"] = [e for e in c["env"] if e["name"] != "RAGMESH_API_KEYS_FILE"]


def _no_mesh_tls(docs: Docs) -> None:
    c = _container(docs, "gateway")
    c["envFrom"] = [
        e
        for e in c["envFrom"]
        if not e.get("configMapRef", {}).get("name", "").startswith("ragmesh-mesh-tls")
    ]


def _allow_internal(docs: Docs) -> None:
    docs.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "allow-ragmesh-internal", "namespace": "ragmesh"},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "ragmesh"}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [
                    {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "ragmesh"}}}]}
                ],
                "egress": [
                    {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "ragmesh"}}}]}
                ],
            },
        }
    )


def _llm_egress_open(docs: Docs) -> None:
    docs.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "llm-download", "namespace": "ragmesh"},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "llm"}},
                "policyTypes": ["Egress"],
                "egress": [{"ports": [{"port": 443, "protocol": "TCP"}]}],
            },
        }
    )


def _named_port_backdoor(docs: Docs) -> None:
    """Sparse out to any pod's port, and any pod in to the embedder's, named not numbered."""
    docs.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "sparse-debug", "namespace": "ragmesh"},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "sparse"}},
                "policyTypes": ["Egress"],
                "egress": [{"ports": [{"port": "grpc"}]}],
            },
        }
    )
    docs.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "embedder-debug", "namespace": "ragmesh"},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "embedder"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": "grpc"}]}],
            },
        }
    )


def _grpc_probe(docs: Docs) -> None:
    _container(docs, "index")["readinessProbe"] = {"grpc": {"port": 50051}}


def _plaintext_health_port(docs: Docs) -> None:
    _container(docs, "embedder").setdefault("env", []).append(
        {"name": "RAGMESH_HEALTH_PORT", "value": "8086"}
    )


def _no_identity_volume(docs: Docs) -> None:
    spec = _workload(docs, "sparse")["spec"]["template"]["spec"]
    for v in spec["volumes"]:
        if v["name"] == "mesh-tls":
            v["secret"]["secretName"] = "ragmesh-tls-gateway"  # someone else's identity


def _root_s3_user(docs: Docs) -> None:
    _container(docs, "index")["envFrom"].append({"secretRef": {"name": "ragmesh-s3-root"}})


def _other_service_nats_user(docs: Docs) -> None:
    _container(docs, "index")["envFrom"].append({"secretRef": {"name": "ragmesh-nats-ingestion"}})


def _placeholder_secret(docs: Docs) -> None:
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "ragmesh-s3-index", "namespace": "ragmesh"},
            "stringData": {"RAGMESH_S3_SECRET_KEY": "replace-me-secret"},
        }
    )


def _one_nats(docs: Docs) -> None:
    _workload(docs, "nats")["spec"]["replicas"] = 1


def _nats_open(docs: Docs) -> None:
    for d in docs:
        if d["kind"] == "ConfigMap" and "nats.conf" in (d.get("data") or {}):
            conf = d["data"]["nats.conf"]
            d["data"]["nats.conf"] = conf[: conf.index("authorization {")]


def _plain_nats(docs: Docs) -> None:
    for d in docs:
        if d["kind"] == "ConfigMap" and "RAGMESH_NATS_URL" in (d.get("data") or {}):
            d["data"]["RAGMESH_NATS_URL"] = "nats://nats:4222"
            d["data"]["RAGMESH_NATS_STREAM_REPLICAS"] = "1"


def _metrics_annotated_http(docs: Docs) -> None:
    annotations = _workload(docs, "embedder")["spec"]["template"]["metadata"]["annotations"]
    del annotations["prometheus.io/scheme"]


def _scraper_key_in_a_pod(docs: Docs) -> None:
    spec = _workload(docs, "gateway")["spec"]["template"]["spec"]
    spec["volumes"].append({"name": "scrape", "secret": {"secretName": "ragmesh-tls-prometheus"}})


def _metrics_open_in_namespace(docs: Docs) -> None:
    """Every pod of the namespace to every metrics port, both ways (egress is denied too)."""
    docs.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "metrics-debug", "namespace": "ragmesh"},
            "spec": {
                "podSelector": {},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": 9090}]}],
                "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": 9090}]}],
            },
        }
    )


MUTATIONS: dict[str, tuple[Callable[[Docs], None], str]] = {
    "published gateway without keys": (_no_api_keys, "needing no API key"),
    "published gateway without TLS": (_no_mesh_tls, "serving without TLS"),
    "every ragmesh pod reaches every other": (_allow_internal, "embedder may connect to nats:4222"),
    "the LLM may download": (_llm_egress_open, "llm may connect out to the internet:443"),
    "a named-port backdoor": (_named_port_backdoor, "sparse may connect to embedder:50051"),
    "a kubelet gRPC probe": (_grpc_probe, "index's readinessProbe is a kubelet gRPC probe"),
    "another identity's certificate": (_no_identity_volume, "not in its own Secret ragmesh-tls-sparse"),
    "a plaintext health port": (_plaintext_health_port, "embedder opens a plaintext health port"),
    "MinIO's root user in a service": (_root_s3_user, "index gets MinIO's root user"),
    "another service's NATS user": (_other_service_nats_user, "index logs in as another service"),
    "a committed placeholder Secret": (_placeholder_secret, "holds a placeholder value"),
    "one NATS server": (_one_nats, "nats: 1 server(s)"),
    "NATS without users": (_nats_open, "no users (authorization)"),
    "NATS in plaintext, unreplicated streams": (_plain_nats, "RAGMESH_NATS_URL is not tls://"),
    "metrics annotated as plain HTTP": (
        _metrics_annotated_http,
        "embedder is annotated for scraping over plain",
    ),
    "Prometheus's key in a pod": (_scraper_key_in_a_pod, "gateway mounts another identity's key"),
    "metrics open to the namespace": (
        _metrics_open_in_namespace,
        "an unlabelled pod of the namespace may connect to embedder:9090",
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_way_back_is_caught(shipped: dict[str, Docs], mutation: str) -> None:
    change, expected = MUTATIONS[mutation]
    docs = copy.deepcopy(shipped["gpu"])
    change(docs)
    findings = check_manifests.check(docs)
    assert any(expected in f for f in findings), findings
