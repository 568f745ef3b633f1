"""SeaweedFS's own ports in a secure stack: closed to everyone but SeaweedFS itself.

``weed mini`` is one process, but its parts (master, volume server, filer, S3 gateway, admin)
talk to each other over their own HTTP and gRPC ports, and each of those ports would otherwise
serve anyone: the filer's HTTP port hands out and replaces objects, ``weed shell`` administers
the cluster over the gRPC ports, none of it behind the S3 keys. Only the S3 API is meant for the
mesh, so in a secure stack:

- every internal gRPC port (master, volume, filer, S3, admin, worker) and every internal HTTP
  port (master, volume, filer, admin) is mutual TLS against a CA of its own, made for this one
  process: without its certificate there is no TLS handshake. No mesh service holds that CA or
  certificate, so a compromised mesh certificate does not open the object store's back rooms;
- on top of that, the filer and the volume server check JWTs signed with keys only SeaweedFS
  holds, for reads and for writes (the S3 gateway signs them), so even a request that reaches
  them through a local socket is refused without one;
- the S3 port keeps HTTPS with the mesh's S3 certificate and the per-service S3 keys.

The CA, certificate and JWT keys are made afresh every time SeaweedFS starts (nothing but the
process itself uses them, so nothing has to be rotated or renewed), 0600 in a 0700 folder, and
SeaweedFS reads them from ``security.toml`` in that folder (``weed -config_dir``).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from meshkit.rpc.pki import PKIFiles, issue, new_ca, write_pair
from ragmesh_cli import procutil

SECURITY_FILE = "security.toml"
CERT_NAME = "seaweedfs"
# The parts of weed mini that serve gRPC, and those that serve HTTP besides the S3 port.
GRPC_PARTS = ("master", "volume", "filer", "s3", "admin", "worker")
HTTPS_PARTS = ("master", "volume", "filer", "admin")
# Filer and volume JWTs for writes and for reads (security.toml sections).
JWT_SECTIONS = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
# SeaweedFS's default: a token signed for one request.
JWT_LIFETIME_S = 10


def _quoted(value: str) -> str:
    """A TOML basic string (JSON's escapes are valid TOML ones)."""
    return json.dumps(value)


def _value(value: str | bool | int) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int) else _quoted(value)


def _section(name: str, values: dict[str, str | bool | int]) -> list[str]:
    return [f"[{name}]", *(f"{key} = {_value(value)}" for key, value in values.items()), ""]


def security_toml(pki: PKIFiles, jwt_keys: dict[str, str]) -> str:
    """SeaweedFS's security.toml: mTLS on every internal port, JWTs on the filer and volumes."""
    cert, key, ca = str(pki.cert(CERT_NAME)), str(pki.key(CERT_NAME)), str(pki.ca_cert)
    lines = ["# Written by ragmesh up --secure at every start of SeaweedFS; do not edit.", ""]
    for section in JWT_SECTIONS:
        lines += _section(section, {"key": jwt_keys[section], "expires_after_seconds": JWT_LIFETIME_S})
    # No unauthenticated UI or directory listings on the volume server and the filer.
    lines += _section("access", {"ui": False})
    lines += _section("filer.expose_directory_metadata", {"enabled": False})
    lines += _section("grpc", {"ca": ca})
    for part in GRPC_PARTS:
        lines += _section(f"grpc.{part}", {"cert": cert, "key": key, "allowed_commonNames": CERT_NAME})
    lines += _section("grpc.client", {"cert": cert, "key": key})
    lines += _section("https.client", {"enabled": True, "cert": cert, "key": key, "ca": ca})
    for part in HTTPS_PARTS:
        # A CA here makes the server require and verify a client certificate.
        lines += _section(f"https.{part}", {"cert": cert, "key": key, "ca": ca})
    return "\n".join(lines)


def prepare(directory: Path) -> Path:
    """A fresh CA, certificate and JWT keys for one start of SeaweedFS, and the security.toml
    that uses them, in ``directory`` (0700). Returns the folder to pass as ``-config_dir``."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    pki = PKIFiles(directory)
    ca = new_ca()
    write_pair(pki, "ca", ca)
    # Server and client usage: every part both serves and dials the others.
    write_pair(pki, CERT_NAME, issue(ca, CERT_NAME, dns_names=[CERT_NAME]))
    jwt_keys = {section: secrets.token_urlsafe(32) for section in JWT_SECTIONS}
    procutil.write_text_atomic(directory / SECURITY_FILE, security_toml(pki, jwt_keys), mode=0o600)
    return directory
