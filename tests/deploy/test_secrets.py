"""deploy/k8s/make_secrets.py makes exactly the Secrets the rendered manifests use (names and keys),
refuses certificates the mesh could not use, and keeps credentials across runs; the bootstrap's
object-store step (base/s3/users.py) gives each service its own user and only its bucket."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .loader import load_deploy_module
from .pki import TestCA

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".venv/bin/kubectl"

make_secrets = load_deploy_module("make_secrets")
check_manifests = load_deploy_module("check_manifests")
scraper_cert = load_deploy_module("scraper_cert")
users = load_deploy_module("base/s3/users")


def k8s_names(service: str) -> list[str]:
    """The names `ragmesh certs new --namespace ragmesh` gives a certificate (meshkit.rpc.pki)."""
    svc = f"{service}.ragmesh.svc"
    return [
        service,
        "localhost",
        f"{service}.ragmesh",
        svc,
        f"*.{svc}",
        f"{svc}.cluster.local",
        f"*.{svc}.cluster.local",
    ]


def good_pki(directory: Path) -> TestCA:
    """A PKI shaped as `ragmesh certs new --dir D --namespace ragmesh` writes it."""
    ca = TestCA(directory)
    for identity in make_secrets.IDENTITIES:
        ca.issue(identity, k8s_names(identity))
    ca.issue("nats", k8s_names("nats"), ips=())
    ca.issue("s3", ["s3", *k8s_names("minio")], ips=())
    scraper_cert.write_scraper_cert(directory, days=1)  # Prometheus's, beside them
    return ca


@pytest.fixture
def api_keys(tmp_path: Path) -> Path:
    path = tmp_path / "api-keys.json"
    path.write_text(
        json.dumps({"keys": [{"name": "ops", "sha256": "0" * 64, "read": ["*"], "write": ["*"]}]})
    )
    return path


def load(path: Path) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def test_makes_every_secret_the_manifests_use(tmp_path: Path, api_keys: Path) -> None:
    good_pki(tmp_path / "pki")
    out = tmp_path / "out"
    target = make_secrets.build(tmp_path / "pki", api_keys, out, "ragmesh")
    made = load(target)
    assert target.stat().st_mode & 0o777 == 0o600
    assert (out / "credentials.env").stat().st_mode & 0o777 == 0o600
    if not KUBECTL.exists():
        pytest.skip("kubectl not installed (make setup)")
    for overlay in ("local", "gpu"):
        rendered = subprocess.run(
            [str(KUBECTL), "kustomize", str(ROOT / "deploy/k8s/overlays" / overlay)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        docs = check_manifests.Rendered(yaml.safe_load_all(rendered))
        for pod in docs.pods:
            for name, key, _how in check_manifests._secret_refs(pod):
                assert name in made, f"{overlay}: {pod.name} needs Secret {name}"
                assert made[name]["metadata"]["namespace"] == "ragmesh"
                if key is not None:
                    assert key in made[name]["data"], f"{overlay}: {pod.name} needs {name}/{key}"
    tls = made["ragmesh-tls-index"]
    assert tls["type"] == "kubernetes.io/tls" and set(tls["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    # Prometheus's scrape certificate goes to Prometheus's namespace, where it is mounted.
    scraper = made["ragmesh-tls-prometheus"]
    assert scraper["metadata"]["namespace"] == "monitoring" and scraper["type"] == "kubernetes.io/tls"
    assert set(scraper["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert scraper["data"]["ca.crt"] == tls["data"]["ca.crt"]
    nats = made["ragmesh-nats-ingestion-worker"]["data"]
    assert base64.b64decode(nats["RAGMESH_NATS_USER"]) == b"ingestion-worker"  # the nats.conf user
    keys = {
        name: base64.b64decode(d["data"]["RAGMESH_S3_ACCESS_KEY"])
        for name, d in made.items()
        if "RAGMESH_S3_ACCESS_KEY" in d["data"]
    }
    assert len(set(keys.values())) == len(keys), "two services share an S3 user"
    assert all(3 <= len(k) <= 20 for k in keys.values()), "MinIO access keys are 3-20 characters"


def test_credentials_are_kept_across_runs(tmp_path: Path, api_keys: Path) -> None:
    good_pki(tmp_path / "pki")
    first = load(make_secrets.build(tmp_path / "pki", api_keys, tmp_path / "out", "ragmesh"))
    second = load(make_secrets.build(tmp_path / "pki", api_keys, tmp_path / "out", "ragmesh"))
    assert first == second
    # Deleting a line rotates just that credential.
    creds = tmp_path / "out" / "credentials.env"
    creds.write_text(
        "\n".join(
            line for line in creds.read_text().splitlines() if not line.startswith("NATS_PASSWORD_INDEX=")
        )
    )
    third = load(make_secrets.build(tmp_path / "pki", api_keys, tmp_path / "out", "ragmesh"))
    assert third["ragmesh-nats-index"] != first["ragmesh-nats-index"]
    assert third["ragmesh-nats-sparse"] == first["ragmesh-nats-sparse"]


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("missing-name", r"index certificate does not name index-0\.index\.ragmesh\.svc, index-1"),
        ("other-ca", "the index certificate is not signed by ca.crt"),
        ("wrong-key", "the index key is not the key of its certificate"),
        ("no-identity", "lacks the URI SAN spiffe://ragmesh/index"),
        (
            "nats-route-name",
            r"nats certificate does not name nats-1\.nats\.ragmesh\.svc\.cluster\.local, nats-2",
        ),
        ("no-own-name", "the ingestion-worker certificate does not name ingestion-worker"),
        ("no-scraper", r"no .*prometheus\.crt: make Prometheus's scrape certificate with .*scraper_cert\.py"),
        (
            "scraper-is-another-identity",
            "prometheus certificate lacks the URI SAN spiffe://ragmesh/prometheus",
        ),
    ],
)
def test_refuses_certificates_the_mesh_cannot_use(
    tmp_path: Path, api_keys: Path, breakage: str, message: str
) -> None:
    ca = good_pki(tmp_path / "pki")
    if breakage == "missing-name":
        ca.issue("index", ["index", "index.ragmesh.svc"])  # no name for its pods
    elif breakage == "other-ca":
        other = TestCA(tmp_path / "other").issue("index", k8s_names("index"))
        shutil.copy(other.cert, ca.dir / "index.crt")
        shutil.copy(other.key, ca.dir / "index.key")
    elif breakage == "wrong-key":
        shutil.copy(ca.dir / "sparse.key", ca.dir / "index.key")
    elif breakage == "no-identity":
        ca.issue("index-bad", k8s_names("index"))
        shutil.copy(ca.dir / "index-bad.crt", ca.dir / "index.crt")
        shutil.copy(ca.dir / "index-bad.key", ca.dir / "index.key")
    elif breakage == "nats-route-name":
        ca.issue("nats", ["nats-0.nats.ragmesh.svc.cluster.local", "*.nats.ragmesh.svc"], ips=())
    elif breakage == "no-own-name":
        ca.issue("ingestion-worker", ["localhost"])  # Prometheus verifies it as ingestion-worker
    elif breakage == "no-scraper":
        (ca.dir / "prometheus.crt").unlink()
    elif breakage == "scraper-is-another-identity":
        # ops' certificate (or any other) in the monitoring namespace: not the scrape-only identity.
        shutil.copy(ca.dir / "gateway.crt", ca.dir / "prometheus.crt")
        shutil.copy(ca.dir / "gateway.key", ca.dir / "prometheus.key")
    with pytest.raises(make_secrets.SecretsError, match=message):
        make_secrets.build(tmp_path / "pki", api_keys, tmp_path / "out", "ragmesh")


def test_the_scraper_secret_goes_where_prometheus_runs(tmp_path: Path, api_keys: Path) -> None:
    good_pki(tmp_path / "pki")
    target = make_secrets.build(tmp_path / "pki", api_keys, tmp_path / "out", "ragmesh", (), "observability")
    made = load(target)
    assert made["ragmesh-tls-prometheus"]["metadata"]["namespace"] == "observability"
    assert {d["metadata"]["namespace"] for n, d in made.items() if n != "ragmesh-tls-prometheus"} == {
        "ragmesh"
    }


def test_the_gateway_certificate_must_carry_its_public_name(tmp_path: Path, api_keys: Path) -> None:
    good_pki(tmp_path / "pki")
    with pytest.raises(make_secrets.SecretsError, match=r"does not name api\.example\.com"):
        make_secrets.build(tmp_path / "pki", api_keys, tmp_path / "out", "ragmesh", ["api.example.com"])


# ---------------------------------------------------------------------------- MinIO users


class FakeAdmin:
    def __init__(self, attach_error: Exception | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.attach_error = attach_error

    def policy_add(self, policy_name: str, policy_file: Any = None, policy: Any = None) -> str:
        self.calls.append(("policy_add", (policy_name, policy)))
        return ""

    def user_add(self, access_key: str, secret_key: str) -> str:
        self.calls.append(("user_add", (access_key, secret_key)))
        return ""

    def attach_policy(self, policies: list[str], user: str | None = None, group: str | None = None) -> str:
        self.calls.append(("attach_policy", (policies, user)))
        if self.attach_error:
            raise self.attach_error
        return ""


def _env() -> dict[str, str]:
    env = {}
    for service in users.SERVICES:
        var = service.upper().replace("-", "_")
        env[f"S3_ACCESS_KEY_{var}"] = f"key-{service}"[:20]
        env[f"S3_SECRET_KEY_{var}"] = f"secret-{service}-12345"
    return env


def test_each_service_gets_its_user_and_policy() -> None:
    admin = FakeAdmin()
    env = _env()
    for service in users.SERVICES:
        assert users.ensure_user(admin, service, env) == f"ragmesh-{service}"
    attached = {user: policies for name, (policies, user) in admin.calls if name == "attach_policy"}
    assert attached == {
        env[f"S3_ACCESS_KEY_{s.upper().replace('-', '_')}"]: [f"ragmesh-{s}"] for s in users.SERVICES
    }
    # The users make_secrets.py makes are the ones this step creates.
    assert set(users.SERVICES) == set(make_secrets.S3_USERS)


def test_an_attached_policy_is_fine_other_errors_are_not() -> None:
    env = _env()
    already = RuntimeError("admin request failed; Status: 400, Body: XMinioAdminPolicyChangeAlreadyApplied")
    users.ensure_user(FakeAdmin(already), "index", env)
    with pytest.raises(RuntimeError, match="AccessDenied"):
        users.ensure_user(FakeAdmin(RuntimeError("AccessDenied")), "index", env)
    with pytest.raises(users.SetupError, match="S3_SECRET_KEY_INDEX"):
        users.ensure_user(FakeAdmin(), "index", {"S3_ACCESS_KEY_INDEX": "k"})


# Which bucket (and prefix) each service may touch, and how (team.md).
GRANTS = {
    "ingestion": ("ragmesh-documents/", {"s3:PutObject"}),
    "ingestion-worker": ("ragmesh-documents/", {"s3:GetObject", "s3:DeleteObject"}),
    "index": ("ragmesh-snapshots/index/", {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}),
    "sparse": ("ragmesh-snapshots/sparse/", {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}),
    "reranker": ("ragmesh-models/reranker/", {"s3:GetObject"}),
    "llm": ("ragmesh-models/llm/", {"s3:GetObject"}),
    "bootstrap": ("", set()),
}
MULTIPART = {"s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"}
BUCKET_LEVEL = {"s3:ListBucket", "s3:GetBucketLocation", "s3:CreateBucket"}


@pytest.mark.parametrize("service", sorted(GRANTS))
def test_policies_grant_only_the_services_bucket(service: str) -> None:
    policy = users.load_policy(service)
    prefix, object_actions = GRANTS[service]
    bucket = prefix.split("/")[0]
    seen_object_actions: set[str] = set()
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        actions = set(statement["Action"])
        for resource in statement["Resource"]:
            assert resource.startswith("arn:aws:s3:::")
            path = resource.removeprefix("arn:aws:s3:::")
            if "/" in path:  # objects: only under the service's prefix, only its actions
                assert path == f"{prefix}*", resource
                assert actions <= object_actions | MULTIPART, actions
                seen_object_actions |= actions
            else:  # the bucket itself: listing, location, creating it
                assert actions <= BUCKET_LEVEL
                assert service == "bootstrap" or path == bucket, resource
                if service in ("reranker", "llm", "bootstrap"):
                    assert "s3:CreateBucket" not in actions
    assert object_actions <= seen_object_actions
