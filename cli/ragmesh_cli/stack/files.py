"""The files the stack writes for its infrastructure before starting it: the S3 credentials
(generated once, 0600), SeaweedFS's identities config, the NATS server config, and the command
lines that use them."""

from __future__ import annotations

import json
import secrets
import ssl
from pathlib import Path
from typing import Any

from meshkit.storage.natsconn import inbox_prefix
from ragmesh_cli import procutil
from ragmesh_cli.natsconf import nats_config, write_nats_config
from ragmesh_cli.procutil import LOOPBACK
from ragmesh_cli.secure import SecureMaterial
from ragmesh_cli.stack import objectstore_security
from ragmesh_cli.stack.spec import Component

CREDENTIALS_FILE = "s3-credentials.json"
S3_CONFIG_FILE = "s3-config.json"
NATS_CONFIG_FILE = "nats.conf"
S3_DATA_DIR = "s3"
# Under the secure material's folder: SeaweedFS's own CA, certificate, JWT keys, security.toml.
OBJECTSTORE_SECURITY_DIR = "seaweedfs"


def s3_credentials(state_dir: Path) -> dict[str, str]:
    """The S3 identity of this stack, generated on first use and kept 0600 in the state dir."""
    path = state_dir / CREDENTIALS_FILE
    if path.exists():
        creds: dict[str, str] = json.loads(path.read_text())
        return creds
    creds = {"access_key": "rm" + secrets.token_hex(9).upper(), "secret_key": secrets.token_urlsafe(30)}
    procutil.write_json_atomic(path, creds, mode=0o600)
    return creds


def write_s3_config(state_dir: Path, creds: dict[str, str], material: SecureMaterial | None) -> Path:
    """SeaweedFS's identities: one per service (secure stack) or the stack's one admin key."""
    path = state_dir / S3_CONFIG_FILE
    if material is not None:
        procutil.write_json_atomic(path, material.s3_config(), mode=0o600)
        return path
    config = {
        "identities": [
            {
                "name": "ragmesh",
                "credentials": [{"accessKey": creds["access_key"], "secretKey": creds["secret_key"]}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    procutil.write_json_atomic(path, config, mode=0o600)
    return path


def nats_argv(state_dir: Path, comp: Component, material: SecureMaterial | None) -> list[str]:
    """nats-server with the stack's generated config (data dir, TLS and users when secure)."""
    data = state_dir / "nats"
    data.mkdir(parents=True, exist_ok=True)
    config = nats_config(
        comp.port,
        # A secure stack opens no monitoring port: NATS cannot put credentials on it, and it
        # lists connections, subjects and streams; readiness asks the server as ops instead.
        None if material is not None else comp.ports["monitor"],
        data,
        tls=material.server_tls("nats") if material is not None else None,
        passwords=material.nats_passwords() if material is not None else None,
    )
    path = write_nats_config(state_dir / NATS_CONFIG_FILE, config)
    return [procutil.find_binary("nats-server"), "-c", str(path)]


def nats_login(material: SecureMaterial, address: str, user: str) -> dict[str, Any]:
    """nats.connect's options for ``user`` of a secure stack: TLS verified against the mesh CA,
    the user's password and reply inbox."""
    return {
        "servers": [f"tls://{address}"],
        "user": user,
        "password": material.nats_passwords()[user],
        "inbox_prefix": inbox_prefix(user),
        "tls": ssl.create_default_context(cafile=str(material.pki.ca_cert)),
    }


def weed_argv(state_dir: Path, comp: Component, material: SecureMaterial | None) -> list[str]:
    """``weed mini`` on the component's ports, with the S3 identities config (and HTTPS when secure)."""
    data = state_dir / S3_DATA_DIR
    data.mkdir(parents=True, exist_ok=True)
    config = write_s3_config(state_dir, s3_credentials(state_dir), material)
    p = comp.ports
    argv = [procutil.find_binary("weed")]
    if material is not None:
        # Its internal ports: mTLS and JWTs with keys of this start alone (objectstore_security).
        argv.append(f"-config_dir={objectstore_security.prepare(material.root / OBJECTSTORE_SECURITY_DIR)}")
    argv += [
        "mini",
        f"-dir={data}",
        f"-ip={LOOPBACK}",
        f"-ip.bind={LOOPBACK}",
        f"-s3.port={p['main']}",
        f"-s3.port.grpc={p['main_grpc']}",
        f"-s3.config={config}",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
        f"-master.port={p['master']}",
        f"-master.port.grpc={p['master_grpc']}",
        f"-volume.port={p['volume']}",
        f"-volume.port.grpc={p['volume_grpc']}",
        f"-filer.port={p['filer']}",
        f"-filer.port.grpc={p['filer_grpc']}",
        f"-admin.port={p['admin']}",
        f"-admin.port.grpc={p['admin_grpc']}",
    ]
    if material is not None:
        # HTTPS on the S3 port itself: a plaintext client gets no answer it could use.
        tls = material.server_tls("s3")
        argv += [f"-s3.cert.file={tls.cert_file}", f"-s3.key.file={tls.key_file}"]
    # Keep weed's unix sockets with the stack rather than in /tmp (sun_path max is 108 bytes).
    if len(str(data)) < 80:
        argv += [f"-s3.localSocket={data}/s3.sock", f"-filer.localSocket={data}/filer.sock"]
    return argv
