"""Make every Secret the manifests refer to, as one YAML file to `kubectl apply -f`.

    python deploy/k8s/make_secrets.py --pki PKI_DIR --api-keys api-keys.json --out OUT_DIR
    kubectl apply -f OUT_DIR/secrets.yaml

The manifests ship no Secret, not even a placeholder (a pod whose Secret is missing does not
start). This writes them:

* ``ragmesh-tls-<name>`` (type kubernetes.io/tls: tls.crt, tls.key, ca.crt), one per mesh
  identity and for the NATS and MinIO servers, from PKI_DIR (``ca.crt``, ``<name>.crt``,
  ``<name>.key``, MinIO's as ``s3.crt``/``s3.key``: what ``ragmesh certs new --dir PKI_DIR
  --namespace ragmesh`` writes;
  cert-manager can make the same Secrets instead, README). Each certificate is checked first:
  signed by ca.crt, the identity's URI SAN, and the DNS names the mesh dials it by.
* ``ragmesh-tls-prometheus``, the same shape, in Prometheus's namespace (``--monitoring-namespace``,
  default ``monitoring``): the scrape-only identity Prometheus reads the mesh's /metrics ports
  with (``prometheus.crt``/``.key``: deploy/k8s/scraper_cert.py; client usage only).
* ``ragmesh-nats-<user>``, ``ragmesh-s3-<user>``, ``ragmesh-s3-root``, ``ragmesh-llm``: random
  credentials, generated once into OUT_DIR/credentials.env and reused on later runs (so running
  this again does not rotate anything; delete a line to rotate that credential).
* ``ragmesh-api-keys`` (api-keys.json): the keys file you made with ``ragmesh keys new``.

OUT_DIR's files hold secrets: they are written 0600; keep them out of git.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG_ENV = HERE / "base" / "config.env"

# Mesh identities (team names): one certificate each, URI SAN spiffe://ragmesh/<identity>.
IDENTITIES = (
    "gateway",
    "ingestion",
    "ingestion-worker",
    "embedder",
    "index",
    "sparse",
    "planner",
    "reranker",
    "extractor",
    "narrator",
)
# Servers that are not mesh identities but serve TLS from the mesh CA: the names each is dialled
# by (NATS: by clients, RAGMESH_NATS_URL, and by its peers, nats.conf's routes).
SERVER_NAMES: dict[str, tuple[str, ...]] = {
    "nats": (
        *(f"nats-{n}.nats.ragmesh.svc" for n in range(3)),
        *(f"nats-{n}.nats.ragmesh.svc.cluster.local" for n in range(3)),
    ),
    "minio": ("minio",),
}
# The PKI's file name of a server, where `ragmesh certs new` names it otherwise (meshkit.rpc.pki).
PKI_FILE = {"minio": "s3"}
# The scrape-only identity (meshkit.rpc.tls.METRICS_SCRAPER): Prometheus's client certificate for the
# mesh's /metrics ports, in Prometheus's namespace rather than the mesh's.
SCRAPER = "prometheus"
SCRAPER_SECRET = f"ragmesh-tls-{SCRAPER}"
MONITORING_NAMESPACE = "monitoring"
NATS_USERS = ("ingestion", "ingestion-worker", "index", "sparse", "bootstrap", "gateway")
S3_USERS = ("ingestion", "ingestion-worker", "index", "sparse", "reranker", "llm", "bootstrap")
TLS_KEYS = ("tls.crt", "tls.key", "ca.crt")


@dataclass(frozen=True)
class SecretSpec:
    name: str
    keys: tuple[str, ...]
    type: str = "Opaque"
    # In Prometheus's namespace (the scraper's certificate), not the mesh's.
    monitoring: bool = False


def catalogue() -> list[SecretSpec]:
    """Every Secret the manifests may refer to, with its keys (check_manifests.py holds the
    rendered manifests to exactly this)."""
    specs = [
        SecretSpec(f"ragmesh-tls-{n}", TLS_KEYS, "kubernetes.io/tls") for n in (*IDENTITIES, *SERVER_NAMES)
    ]
    specs += [
        SecretSpec(f"ragmesh-nats-{u}", ("RAGMESH_NATS_USER", "RAGMESH_NATS_PASSWORD")) for u in NATS_USERS
    ]
    specs += [
        SecretSpec(f"ragmesh-s3-{u}", ("RAGMESH_S3_ACCESS_KEY", "RAGMESH_S3_SECRET_KEY")) for u in S3_USERS
    ]
    specs.append(SecretSpec(SCRAPER_SECRET, TLS_KEYS, "kubernetes.io/tls", monitoring=True))
    specs += [
        SecretSpec("ragmesh-s3-root", ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD")),
        SecretSpec("ragmesh-llm", ("RAGMESH_LLM_API_KEY",)),
        SecretSpec("ragmesh-api-keys", ("api-keys.json",)),
    ]
    return specs


class SecretsError(RuntimeError):
    pass


# ---------------------------------------------------------------------------- certificates


def dialled_hosts(config_env: Path = CONFIG_ENV) -> dict[str, set[str]]:
    """identity -> the host names the mesh dials it by (the *_ADDRESS(ES) settings of config.env)."""
    hosts: dict[str, set[str]] = {}
    for line in config_env.read_text().splitlines():
        m = re.fullmatch(r"RAGMESH_([A-Z]+)_ADDRESS(?:ES)?=(.*)", line.strip())
        if not m:
            continue
        identity = m.group(1).lower()
        for address in re.split(r"[,|]", m.group(2)):
            if address.strip():
                hosts.setdefault(identity, set()).add(address.strip().rsplit(":", 1)[0])
    return hosts


def name_matches(pattern: str, host: str) -> bool:
    """RFC 6125 matching as gRPC and Python do it: exact, or `*.` standing for one left label."""
    pattern, host = pattern.lower(), host.lower()
    if pattern.startswith("*."):
        head, _, rest = host.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == host


def check_certificate(
    name: str, cert_pem: bytes, key_pem: bytes, ca_pem: bytes, hosts: Iterable[str]
) -> None:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise SecretsError(f"the {name} certificate is not signed by ca.crt ({type(exc).__name__})") from exc
    key = serialization.load_pem_private_key(key_pem, password=None)
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.PEM, public) != cert.public_key().public_bytes(
        serialization.Encoding.PEM, public
    ):
        raise SecretsError(f"the {name} key is not the key of its certificate")
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound as exc:
        raise SecretsError(f"the {name} certificate has no subject alternative names") from exc
    if name in (*IDENTITIES, SCRAPER) and f"spiffe://ragmesh/{name}" not in san.get_values_for_type(
        x509.UniformResourceIdentifier
    ):
        raise SecretsError(f"the {name} certificate lacks the URI SAN spiffe://ragmesh/{name}")
    dns = san.get_values_for_type(x509.DNSName)
    missing = sorted(h for h in hosts if not any(name_matches(d, h) for d in dns))
    if missing:
        raise SecretsError(
            f"the {name} certificate does not name {', '.join(missing)} (it is dialled by these)"
        )
    try:
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return  # no restriction: valid for both
    if name == SCRAPER:
        if x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
            raise SecretsError(f"the {name} certificate must allow clientAuth (it scrapes)")
        return
    # One certificate serves and calls (the mesh), or serves and routes (NATS).
    wanted = {x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH}
    if name != "minio" and not wanted <= usages:
        raise SecretsError(f"the {name} certificate must allow both serverAuth and clientAuth")


def tls_secrets(pki: Path, gateway_names: Iterable[str]) -> dict[str, dict[str, bytes]]:
    ca = _read(pki / "ca.crt")
    hosts = dialled_hosts()
    hosts.setdefault("gateway", set()).update(gateway_names)
    out: dict[str, dict[str, bytes]] = {}
    for name in (*IDENTITIES, *SERVER_NAMES):
        stem = PKI_FILE.get(name, name)
        cert, key = _read(pki / f"{stem}.crt"), _read(pki / f"{stem}.key")
        wanted = set(SERVER_NAMES.get(name, ())) | hosts.get(name, set())
        if name in IDENTITIES:
            # Prometheus scrapes pods by IP and verifies each by its identity (server_name in
            # deploy/prometheus/scrape-kubernetes.yml).
            wanted.add(name)
        check_certificate(name, cert, key, ca, wanted)
        out[f"ragmesh-tls-{name}"] = {"tls.crt": cert, "tls.key": key, "ca.crt": ca}
    out[SCRAPER_SECRET] = scraper_secret(pki, ca)
    return out


def scraper_secret(pki: Path, ca: bytes) -> dict[str, bytes]:
    """Prometheus's client certificate; `ragmesh certs new` does not make it (it is not a mesh
    service), scraper_cert.py does."""
    if not (pki / f"{SCRAPER}.crt").exists():
        raise SecretsError(
            f"no {pki / f'{SCRAPER}.crt'}: make Prometheus's scrape certificate with "
            f"`.venv/bin/python deploy/k8s/scraper_cert.py --pki {pki}`"
        )
    cert, key = _read(pki / f"{SCRAPER}.crt"), _read(pki / f"{SCRAPER}.key")
    check_certificate(SCRAPER, cert, key, ca, ())
    return {"tls.crt": cert, "tls.key": key, "ca.crt": ca}


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SecretsError(f"cannot read {path}: {exc.strerror}") from exc


# ---------------------------------------------------------------------------- credentials


def _token(nbytes: int = 24) -> str:
    return secrets.token_urlsafe(nbytes)


def wanted_credentials() -> dict[str, str]:
    """credential name -> a fresh value (used only for names not in credentials.env yet)."""
    creds = {f"NATS_PASSWORD_{_var(u)}": _token() for u in NATS_USERS}
    for user in S3_USERS:
        # MinIO access keys: 3-20 characters; the name says whose it is in MinIO's logs.
        creds[f"S3_ACCESS_KEY_{_var(user)}"] = f"rm-{user[:8]}-{secrets.token_hex(4)}"
        creds[f"S3_SECRET_KEY_{_var(user)}"] = _token()
    creds["MINIO_ROOT_USER"] = f"rm-root-{secrets.token_hex(4)}"
    creds["MINIO_ROOT_PASSWORD"] = _token(32)
    creds["RAGMESH_LLM_API_KEY"] = _token(32)
    return creds


def _var(name: str) -> str:
    return name.upper().replace("-", "_")


def load_or_create_credentials(path: Path) -> dict[str, str]:
    existing: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                existing[key.strip()] = value.strip()
    creds = {**wanted_credentials(), **existing}
    if creds != existing:
        lines = ["# ragmesh's generated credentials (make_secrets.py): keep out of git."]
        lines += [f"{k}={v}" for k, v in sorted(creds.items())]
        _write_private(path, "\n".join(lines) + "\n")
    return creds


def credential_secrets(creds: Mapping[str, str]) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for user in NATS_USERS:
        out[f"ragmesh-nats-{user}"] = {
            "RAGMESH_NATS_USER": user.encode(),
            "RAGMESH_NATS_PASSWORD": creds[f"NATS_PASSWORD_{_var(user)}"].encode(),
        }
    for user in S3_USERS:
        out[f"ragmesh-s3-{user}"] = {
            "RAGMESH_S3_ACCESS_KEY": creds[f"S3_ACCESS_KEY_{_var(user)}"].encode(),
            "RAGMESH_S3_SECRET_KEY": creds[f"S3_SECRET_KEY_{_var(user)}"].encode(),
        }
    out["ragmesh-s3-root"] = {
        "MINIO_ROOT_USER": creds["MINIO_ROOT_USER"].encode(),
        "MINIO_ROOT_PASSWORD": creds["MINIO_ROOT_PASSWORD"].encode(),
    }
    out["ragmesh-llm"] = {"RAGMESH_LLM_API_KEY": creds["RAGMESH_LLM_API_KEY"].encode()}
    return out


def api_keys_secret(path: Path) -> dict[str, dict[str, bytes]]:
    raw = _read(path)
    try:
        keys = json.loads(raw)
    except ValueError as exc:
        raise SecretsError(f"{path} is not JSON") from exc
    if not isinstance(keys, dict) or not keys.get("keys"):
        raise SecretsError(f"{path} has no keys: make them with `ragmesh keys new` (docs/SECURITY.md)")
    return {"ragmesh-api-keys": {"api-keys.json": raw}}


# ---------------------------------------------------------------------------- output


def render(
    all_secrets: Mapping[str, Mapping[str, bytes]],
    namespace: str,
    monitoring_namespace: str = MONITORING_NAMESPACE,
) -> str:
    """Secret manifests as YAML (JSON documents are YAML; no YAML library needed)."""
    specs = {spec.name: spec for spec in catalogue()}
    docs = []
    for name in sorted(all_secrets):
        manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": monitoring_namespace if specs[name].monitoring else namespace,
                "labels": {"app.kubernetes.io/part-of": "ragmesh"},
            },
            "type": specs[name].type,
            "data": {k: base64.b64encode(v).decode() for k, v in sorted(all_secrets[name].items())},
        }
        docs.append(json.dumps(manifest, indent=2))
    return "---\n" + "\n---\n".join(docs) + "\n"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)


def build(
    pki: Path,
    api_keys: Path,
    out: Path,
    namespace: str,
    gateway_names: Iterable[str] = (),
    monitoring_namespace: str = MONITORING_NAMESPACE,
) -> Path:
    all_secrets = {
        **tls_secrets(pki, gateway_names),
        **credential_secrets(load_or_create_credentials(out / "credentials.env")),
        **api_keys_secret(api_keys),
    }
    expected = {spec.name for spec in catalogue()}
    if set(all_secrets) != expected:  # the catalogue and the builders must agree
        raise SecretsError(f"internal: made {sorted(set(all_secrets) ^ expected)} unlike the catalogue")
    target = out / "secrets.yaml"
    _write_private(target, render(all_secrets, namespace, monitoring_namespace))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pki", type=Path, required=True, help="ca.crt, <name>.crt and <name>.key of every name"
    )
    parser.add_argument("--api-keys", type=Path, required=True, help="the API keys file (ragmesh keys new)")
    parser.add_argument("--out", type=Path, required=True, help="where secrets.yaml and credentials.env go")
    parser.add_argument("--namespace", default="ragmesh")
    parser.add_argument(
        "--monitoring-namespace",
        default=MONITORING_NAMESPACE,
        help="where Prometheus runs: its scrape certificate's Secret goes there (default monitoring)",
    )
    parser.add_argument(
        "--gateway-name",
        action="append",
        default=[],
        help="public DNS name the gateway's certificate must also carry (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        target = build(
            args.pki, args.api_keys, args.out, args.namespace, args.gateway_name, args.monitoring_namespace
        )
    except SecretsError as exc:
        print(f"make_secrets: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {target} ({len(catalogue())} Secrets): kubectl apply -f {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
