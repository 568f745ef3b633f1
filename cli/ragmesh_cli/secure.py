"""What a secure local stack (``ragmesh up --secure``, ``Stack(secure=True)``) is made of, kept
in ``<state_dir>/secure`` (0700, every file 0600) and created on first use:

- ``pki/``: the mesh CA and a certificate per identity (meshkit.rpc.pki) and for NATS and S3;
- ``credentials.json``: each service's NATS password and S3 key, and the plaintext API keys the
  stack minted (``ops`` for the CLI, plus the tenants it was started with);
- ``api-keys.json``: the keys file of the gateway and the ingestion API (digests only), which
  they reload while running (meshkit.rpc.keyreload).

The keys file belongs to the operator as much as to the stack. ``prepare`` (every ``ragmesh up``
that starts something) only makes sure that ``ops`` and the tenants the stack is started with
(``Stack(api_keys=...)``) are in it, and leaves every other entry as it is: keys added with
``ragmesh keys add`` stay, and a key revoked with ``ragmesh keys revoke`` stays out unless the
stack is started with that tenant again, which then gets a new key (``revoke`` forgets the old
one). An entry whose name the stack asks for but that holds another key than the stack's is the
operator's: it is kept, and the stack has no plaintext for it.

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

from meshkit.rpc.auth import ALL, KeysFileError, digest_of, key_entry, new_api_key
from meshkit.rpc.identity import (
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
from meshkit.rpc.keysfile import Entry, LockedKeysFile
from meshkit.rpc.pki import INFRA_SERVERS, PKIFiles, write_pki
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
        """Create whatever is missing (idempotent; existing keys and certificates are kept), and
        make sure the keys file holds ``ops`` and this stack's tenants (see the module's doc)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        if not self.pki.complete([*MESH_IDENTITIES, *INFRA_SERVERS]):
            write_pki(self.pki.directory, force=True)
        # The keys file's lock also covers credentials.json, which 'ragmesh keys revoke' edits.
        with LockedKeysFile(self.keys_file) as keys_file:
            secrets_ = self._load_secrets(fresh=True)
            changed = _ensure_service_secrets(secrets_)
            changed |= self._ensure_stack_keys(keys_file, secrets_["api_keys"])
            # Credentials first: a key in the keys file whose plaintext was lost would be useless.
            if changed:
                self._save_secrets(secrets_)
            keys_file.save()

    def _stack_grants(self) -> dict[str, tuple[list[str], list[str]]]:
        grants = {OPS_KEY: ([ALL], [ALL])}
        grants.update({name: (list(read), list(write)) for name, (read, write) in self.tenants.items()})
        return grants

    def _ensure_stack_keys(self, keys_file: LockedKeysFile, recorded: dict[str, str]) -> bool:
        """Put ``ops`` and this stack's tenants in the keys file; True when a key was minted."""
        minted = False
        for name, (read, write) in self._stack_grants().items():
            existing = keys_file.entry(name)
            if existing is None:
                # First start, or revoked since and asked for again: a new key either way, never
                # the one that was revoked.
                recorded[name] = new_api_key()
                keys_file.add(key_entry(name, recorded[name], read, write, None))
                minted = True
            elif name != OPS_KEY and self._is_own(existing, recorded.get(name)):
                # The stack's own tenant, started again: its grants as given now.
                existing["read"], existing["write"] = read, write
            # Otherwise the entry is the operator's (another key under this name) or ops as it
            # is: left alone.
        return minted

    @staticmethod
    def _is_own(entry: Entry, key: str | None) -> bool:
        return key is not None and str(entry.get("sha256", "")).lower() == digest_of(key)

    def revoke(self, name: str) -> Entry:
        """Take key ``name`` out of the keys file and forget the stack's plaintext of it, so a
        later start with that tenant mints a new key instead of reviving this one."""
        if name == OPS_KEY:
            raise KeysFileError(
                f"{OPS_KEY!r} is the local stack's operator key (the CLI's): 'ragmesh up' puts it back, "
                "so it is not revoked here"
            )
        with LockedKeysFile(self.keys_file) as keys_file:
            removed = keys_file.remove(name)
            keys_file.save()
            secrets_ = self._load_secrets(fresh=True)
            forgotten = secrets_["api_keys"].pop(name, None) is not None
            forgotten |= secrets_.get("grants", {}).pop(name, None) is not None  # older stacks'
            if forgotten:
                self._save_secrets(secrets_)
        return removed

    def add_key(self, entry: Entry) -> None:
        """Add an operator's key (its entry: the digest, never the key) to the keys file."""
        if entry["name"] == OPS_KEY:
            raise KeysFileError(f"{OPS_KEY!r} is reserved for the local stack's operator key")
        with LockedKeysFile(self.keys_file) as keys_file:
            keys_file.add(entry)
            keys_file.save()

    def exists(self) -> bool:
        """Whether a secure stack was ever prepared in this state dir."""
        return (self.root / CREDENTIALS_FILE).is_file()

    def _load_secrets(self, fresh: bool = False) -> dict[str, Any]:
        if self._secrets is None or fresh:
            path = self.root / CREDENTIALS_FILE
            loaded: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
            for section in ("nats", "s3", "api_keys", "llm"):
                loaded.setdefault(section, {})
            self._secrets = loaded
        return self._secrets

    def _save_secrets(self, secrets_: dict[str, Any]) -> None:
        procutil.write_json_atomic(self.root / CREDENTIALS_FILE, secrets_, mode=0o600)

    # ------------------------------------------------------------------ reading

    @property
    def keys_file(self) -> Path:
        return self.root / API_KEYS_FILE

    def api_key(self, name: str = OPS_KEY) -> str:
        """The plaintext of a key the stack minted (``ops``, a tenant it was started with)."""
        try:
            key: str = self._load_secrets()["api_keys"][name]
        except KeyError:
            raise LookupError(
                f"the stack holds no API key named {name!r}: it mints only ops and the tenants it is "
                "started with ('ragmesh keys add' prints a key once and stores only its digest)"
            ) from None
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


def _ensure_service_secrets(secrets_: dict[str, Any]) -> bool:
    """Each service's NATS password and S3 key, and the LLM key; True when one was made."""
    changed = False
    for user in USER_GRANTS:
        changed |= _ensure(secrets_["nats"], user, lambda: secrets.token_urlsafe(24))
    for identity in [OPS, *S3_GRANTS]:
        changed |= _ensure(secrets_["s3"], identity, _new_s3_key)
    changed |= _ensure(secrets_["llm"], "api_key", lambda: secrets.token_urlsafe(32))
    return changed


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
