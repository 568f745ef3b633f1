"""What a secure local stack (``ragmesh up --secure``, ``Stack(secure=True)``) is made of, kept
in ``<state_dir>/secure`` (0700, every file 0600) and created on first use:

- ``pki/``: the mesh CA and a certificate per identity (meshkit.pki) and for NATS and S3;
- ``credentials.json``: each service's NATS password and S3 key, and the plaintext API keys of
  the stack (``ops`` for the CLI, plus the tenants it was started with);
- ``api-keys.json``: the keys file of the gateway and the ingestion API (digests only).

``apply_env`` turns a process's environment into the one of its identity: its certificate,
service_auth=mtls, its NATS user and its S3 key, and nothing of anyone else's. ``client_profile``
gives the CLI the ``ops`` identity of a running secure stack, so ``ragmesh ingest/search/ask/
status`` work unchanged on it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshkit.auth import key_entry, new_api_key
from meshkit.identity import (
    EMBEDDER,
    EXTRACTOR,
    GATEWAY,
    INDEX,
    INGESTION,
    INGESTION_WORKER,
    MESH_IDENTITIES,
    NARRATOR,
    OPS,
    PLANNER,
    RERANKER,
    SPARSE,
)
from meshkit.pki import INFRA_SERVERS, PKIFiles, write_pki
from ragmesh_cli import procutil
from ragmesh_cli.natsconf import USER_GRANTS, ServerTLS

SECURE_DIR = "secure"
CREDENTIALS_FILE = "credentials.json"
API_KEYS_FILE = "api-keys.json"
# Every certificate carries this name, so one RAGMESH_TLS_SERVER_NAME fits every address (a
# replica list has no single host to check).
SERVER_NAME = "localhost"
OPS_KEY = "ops"

# The identity each kind of stack process runs as. The LLM server has none: llama.cpp speaks plain
# HTTP on loopback (this build has no TLS) and takes a bearer key, which only the answer stages hold.
IDENTITY_OF_KIND: dict[str, str] = {
    "gateway": GATEWAY,
    "ingestion": INGESTION,
    "worker": INGESTION_WORKER,
    "embedder": EMBEDDER,
    "index": INDEX,
    "sparse": SPARSE,
    "planner": PLANNER,
    "reranker": RERANKER,
    "extractor": EXTRACTOR,
    "narrator": NARRATOR,
}
PUBLIC_IDENTITIES = (GATEWAY, INGESTION)
# The identities that call the LLM server.
LLM_CLIENTS = (PLANNER, EXTRACTOR, NARRATOR)
LLM_SERVER_KIND = "llm"

DOCUMENTS, SNAPSHOTS, MODELS = "ragmesh-documents", "ragmesh-snapshots", "ragmesh-models"
BUCKETS = (DOCUMENTS, SNAPSHOTS, MODELS)
# Who may do what in the object store (SeaweedFS actions per bucket): the ingestion API writes
# documents, the workers read and delete them, index and sparse keep snapshots, the reranker
# reads models. SeaweedFS 4.48 grants per bucket, not per prefix, so index and sparse share the
# snapshots bucket (MinIO policies in Kubernetes narrow each to its prefix).
S3_GRANTS: dict[str, tuple[tuple[str, str], ...]] = {
    INGESTION: (("Read", DOCUMENTS), ("Write", DOCUMENTS), ("List", DOCUMENTS)),
    INGESTION_WORKER: (("Read", DOCUMENTS), ("Write", DOCUMENTS), ("List", DOCUMENTS)),
    INDEX: (("Read", SNAPSHOTS), ("Write", SNAPSHOTS), ("List", SNAPSHOTS)),
    SPARSE: (("Read", SNAPSHOTS), ("Write", SNAPSHOTS), ("List", SNAPSHOTS)),
    RERANKER: (("Read", MODELS), ("List", MODELS)),
}
S3_ADMIN_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")

# Variables apply_env owns: whatever the caller's environment had for them is replaced or dropped.
_OWNED = (
    "RAGMESH_SERVICE_AUTH",
    "RAGMESH_TLS_CERT_FILE",
    "RAGMESH_TLS_KEY_FILE",
    "RAGMESH_TLS_CLIENT_CA_FILE",
    "RAGMESH_TLS_CA_FILE",
    "RAGMESH_TLS_CLIENT_CERT_FILE",
    "RAGMESH_TLS_CLIENT_KEY_FILE",
    "RAGMESH_TLS_SERVER_NAME",
    "RAGMESH_API_KEYS_FILE",
    "RAGMESH_API_KEY",
    "RAGMESH_NATS_USER",
    "RAGMESH_NATS_PASSWORD",
    "RAGMESH_S3_ACCESS_KEY",
    "RAGMESH_S3_SECRET_KEY",
    "RAGMESH_S3_SECURE",
    "RAGMESH_LLM_API_KEY",
    "RAGMESH_LLM_SERVER_API_KEY",
)

# Tenant name -> (collections it may read, collections it may write).
Tenants = Mapping[str, tuple[Sequence[str], Sequence[str]]]


@dataclass(frozen=True)
class S3Key:
    access_key: str
    secret_key: str


class SecureMaterial:
    """The secrets and files of one secure stack."""

    def __init__(self, state_dir: Path, tenants: Tenants | None = None) -> None:
        self.root = Path(state_dir) / SECURE_DIR
        self.pki = PKIFiles(self.root / "pki")
        self.tenants = dict(tenants or {})
        self._secrets: dict[str, Any] | None = None

    # ------------------------------------------------------------------ creation

    def prepare(self) -> None:
        """Create whatever is missing (idempotent; existing keys and certificates are kept)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        if not self.pki.complete([*MESH_IDENTITIES, *INFRA_SERVERS]):
            write_pki(self.pki.directory, force=True)
        secrets_ = self._load_secrets()
        changed = False
        for user in USER_GRANTS:
            changed |= _ensure(secrets_["nats"], user, lambda: secrets.token_urlsafe(24))
        for identity in [OPS, *S3_GRANTS]:
            changed |= _ensure(secrets_["s3"], identity, _new_s3_key)
        for name in [OPS_KEY, *self.tenants]:
            changed |= _ensure(secrets_["api_keys"], name, new_api_key)
        changed |= _ensure(secrets_["llm"], "api_key", lambda: secrets.token_urlsafe(32))
        # A stack restarted without its tenants (ragmesh up on a running one) keeps their grants.
        for name, (read, write) in self.tenants.items():
            grant = {"read": list(read), "write": list(write)}
            changed |= secrets_["grants"].get(name) != grant
            secrets_["grants"][name] = grant
        if changed:
            procutil.write_json_atomic(self.root / CREDENTIALS_FILE, secrets_, mode=0o600)
        self._write_keys_file()

    def _load_secrets(self) -> dict[str, Any]:
        if self._secrets is None:
            path = self.root / CREDENTIALS_FILE
            loaded: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
            for section in ("nats", "s3", "api_keys", "grants", "llm"):
                loaded.setdefault(section, {})
            self._secrets = loaded
        return self._secrets

    def _write_keys_file(self) -> None:
        recorded = self._load_secrets()
        keys = recorded["api_keys"]
        grants = {OPS_KEY: (["*"], ["*"])}
        grants.update({n: (g["read"], g["write"]) for n, g in sorted(recorded["grants"].items())})
        entries = [key_entry(name, keys[name], read, write, None) for name, (read, write) in grants.items()]
        procutil.write_json_atomic(self.keys_file, {"keys": entries}, mode=0o600)

    # ------------------------------------------------------------------ reading

    @property
    def keys_file(self) -> Path:
        return self.root / API_KEYS_FILE

    def api_key(self, name: str = OPS_KEY) -> str:
        key: str = self._load_secrets()["api_keys"][name]
        return key

    def llm_api_key(self) -> str:
        key: str = self._load_secrets()["llm"]["api_key"]
        return key

    def nats_passwords(self) -> dict[str, str]:
        return dict(self._load_secrets()["nats"])

    def s3_key(self, identity: str) -> S3Key:
        entry = self._load_secrets()["s3"][identity]
        return S3Key(entry["access_key"], entry["secret_key"])

    def server_tls(self, server: str) -> ServerTLS:
        return ServerTLS(self.pki.cert(server), self.pki.key(server), self.pki.ca_cert)

    def s3_config(self) -> dict[str, Any]:
        """SeaweedFS's identities: ops administers, each service reaches only its buckets."""
        identities = []
        for identity in [OPS, *S3_GRANTS]:
            key = self.s3_key(identity)
            grants = S3_GRANTS.get(identity)
            actions = list(S3_ADMIN_ACTIONS) if grants is None else [f"{a}:{b}" for a, b in grants]
            identities.append(
                {
                    "name": identity,
                    "credentials": [{"accessKey": key.access_key, "secretKey": key.secret_key}],
                    "actions": actions,
                }
            )
        return {"identities": identities}

    # ------------------------------------------------------------------ environments

    @staticmethod
    def strip_env(env: MutableMapping[str, str]) -> None:
        """Drop every credential and TLS variable (a process that holds no identity)."""
        for name in _OWNED:
            env.pop(name, None)

    def apply_server_env(self, env: MutableMapping[str, str], kind: str) -> None:
        """The environment of a process without a mesh identity (NATS, S3, the LLM server):
        no credential but the LLM server's own key."""
        self.strip_env(env)
        if kind == LLM_SERVER_KIND:
            env["RAGMESH_LLM_SERVER_API_KEY"] = self.llm_api_key()

    def apply_env(self, env: MutableMapping[str, str], identity: str, nats_address: str | None) -> None:
        """Make ``env`` the environment of ``identity``: its certificate (service_auth=mtls for
        a service; ops calls without serving), its API keys file or key, NATS user, S3 key."""
        self.strip_env(env)
        env["RAGMESH_TLS_CA_FILE"] = str(self.pki.ca_cert)
        env["RAGMESH_TLS_SERVER_NAME"] = SERVER_NAME
        if identity == OPS:
            env["RAGMESH_TLS_CLIENT_CERT_FILE"] = str(self.pki.cert(OPS))
            env["RAGMESH_TLS_CLIENT_KEY_FILE"] = str(self.pki.key(OPS))
            env["RAGMESH_API_KEY"] = self.api_key(OPS_KEY)
        else:
            env["RAGMESH_SERVICE_AUTH"] = "mtls"
            env["RAGMESH_TLS_CERT_FILE"] = str(self.pki.cert(identity))
            env["RAGMESH_TLS_KEY_FILE"] = str(self.pki.key(identity))
        if identity in PUBLIC_IDENTITIES:
            env["RAGMESH_API_KEYS_FILE"] = str(self.keys_file)
        if identity in LLM_CLIENTS:
            env["RAGMESH_LLM_API_KEY"] = self.llm_api_key()
        if nats_address is not None:
            env["RAGMESH_NATS_URL"] = f"tls://{nats_address}"
        passwords = self.nats_passwords()
        if identity in passwords:
            env["RAGMESH_NATS_USER"] = identity
            env["RAGMESH_NATS_PASSWORD"] = passwords[identity]
        env["RAGMESH_S3_SECURE"] = "true"
        if identity in self._load_secrets()["s3"]:
            key = self.s3_key(identity)
            env["RAGMESH_S3_ACCESS_KEY"] = key.access_key
            env["RAGMESH_S3_SECRET_KEY"] = key.secret_key


def _new_s3_key() -> dict[str, str]:
    return {"access_key": "rm" + secrets.token_hex(9).upper(), "secret_key": secrets.token_urlsafe(30)}


def _ensure(section: dict[str, Any], name: str, make: Any) -> bool:
    if name in section:
        return False
    section[name] = make()
    return True


def client_profile(state_dir: Path) -> dict[str, Any] | None:
    """The ``ops`` settings (CA, client certificate, API key) of the secure stack recorded in
    ``state_dir``, as MeshSettings fields; None when there is none."""
    root = Path(state_dir) / SECURE_DIR
    pki = PKIFiles(root / "pki")
    if not (root / CREDENTIALS_FILE).is_file() or not pki.complete([OPS]):
        return None
    material = SecureMaterial(state_dir)
    return {
        "tls_ca_file": pki.ca_cert,
        "tls_client_cert_file": pki.cert(OPS),
        "tls_client_key_file": pki.key(OPS),
        "tls_server_name": SERVER_NAME,
        "api_key": material.api_key(OPS_KEY),
    }
