"""The NATS configuration that Kubernetes runs (deploy/k8s/base/nats.conf) as a local
three-server JetStream cluster on 127.0.0.1 (test_nats_conf): the servers, their configuration
changed only where a host, port or path must differ from a pod's, and connections as one user
that record the permission violations the server reports."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js import JetStreamContext

from meshkit.settings import IngestionSettings

from .pki import TestCA

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "deploy/k8s/base/nats.conf"
NATS_SERVER = shutil.which("nats-server", path=str(ROOT / ".venv/bin")) or shutil.which("nats-server")
USERS = ("ingestion", "ingestion-worker", "index", "sparse", "bootstrap", "gateway")
PASSWORDS = {u: f"pw-{u}-{os.getpid()}" for u in USERS}
SERVERS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    client: int
    routes: int
    monitor: int
    store: Path
    conf: Path
    proc: subprocess.Popen[bytes] | None = None

    def healthy(self) -> bool:
        # The full check: JetStream up and the cluster's meta leader elected.
        url = f"http://127.0.0.1:{self.monitor}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False


def local_conf(text: str, server: Server, all_servers: list[Server], tls_dir: Path) -> str:
    """The shipped file with a pod's hosts, ports and paths swapped for this machine's."""
    text = text.replace("/etc/nats/tls/", f"{tls_dir}/")
    text = text.replace("/var/run/nats/", f"{server.store}-")
    text = re.sub(r"(?m)^(\s*store_dir:) /data$", rf"\1 {server.store}", text)
    text = re.sub(r"(?m)^port: 4222$", f"port: {server.client}\nhost: 127.0.0.1", text)
    text = re.sub(r"(?m)^http_port: 8222$", f"http: 127.0.0.1:{server.monitor}", text)
    text = re.sub(r"(?m)^(\s*)port: 6222$", rf"\1port: {server.routes}\n\1host: 127.0.0.1", text)
    text = text.replace("max_file_store: 8GB", "max_file_store: 256MB")
    for i, other in enumerate(all_servers):
        text = text.replace(
            f"nats-route://nats-{i}.nats.ragmesh.svc.cluster.local:6222",
            f"nats-route://localhost:{other.routes}",
        )
    assert "nats-route://nats-" not in text and f"store_dir: {server.store}" in text, (
        "a pod-only value is left"
    )
    return text


@contextlib.contextmanager
def running_cluster(base: Path, pki: TestCA) -> Iterator[list[Server]]:
    """The shipped nats.conf as SERVERS local servers under ``base``, healthy, stopped after."""
    tls_dir = base / "tls"
    tls_dir.mkdir()
    issued = pki.issue("nats", ["nats", "localhost"])
    shutil.copy(issued.cert, tls_dir / "tls.crt")
    shutil.copy(issued.key, tls_dir / "tls.key")
    shutil.copy(pki.ca_file, tls_dir / "ca.crt")
    servers = [
        Server(
            f"nats-{i}", free_port(), free_port(), free_port(), base / f"data-{i}", base / f"nats-{i}.conf"
        )
        for i in range(SERVERS)
    ]
    shipped = CONF.read_text()
    env = {**os.environ, **{f"NATS_PASSWORD_{u.upper().replace('-', '_')}": p for u, p in PASSWORDS.items()}}
    for server in servers:
        server.conf.write_text(local_conf(shipped, server, servers, tls_dir))
        log = (base / f"{server.name}.log").open("wb")
        server.proc = subprocess.Popen(
            [str(NATS_SERVER), "--config", str(server.conf)],
            env={**env, "POD_NAME": server.name},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not all(s.healthy() for s in servers):
        for s in servers:
            if s.proc is not None and s.proc.poll() is not None:
                pytest.fail(f"{s.name} exited: {(base / f'{s.name}.log').read_text()[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail("the NATS cluster did not become healthy in 60 s")
        time.sleep(0.2)
    try:
        yield servers
    finally:
        for s in servers:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.terminate()
                s.proc.wait(timeout=15)


def tls_context(pki: TestCA) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca_file))


class Client:
    """A connection as one user, with the permission violations the server reported to it."""

    def __init__(self, nc: nats.NATS, violations: list[str]) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=10)
        self.quick = nc.jetstream(timeout=2)  # for calls expected to be refused (no reply comes)
        self.violations = violations

    async def refused(self, call: Awaitable[object], subject: str) -> bool:
        """True when the server refused `call` for lack of permission on `subject` (it drops the
        request and reports a permissions violation; the caller's request then times out)."""
        try:
            await call
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.APIError):
            pass
        else:
            return False
        for _ in range(50):
            # The server's message has the subject lower-cased.
            if any(subject.lower() in v.lower() for v in self.violations):
                return True
            await asyncio.sleep(0.05)
        return False


async def connect(
    servers: list[Server], pki: TestCA, user: str | None, password: str | None = None
) -> Client:
    urls = [f"tls://localhost:{s.client}" for s in servers if s.proc is not None and s.proc.poll() is None]
    # Each user's replies come on its own inbox prefix, as meshkit.storage.natsconn sets it up.
    creds = (
        {"user": user, "password": password or PASSWORDS[user], "inbox_prefix": f"_INBOX_{user}"}
        if user
        else {}
    )
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            violations.append(str(exc))

    nc = await nats.connect(
        servers=urls,
        tls=tls_context(pki),
        allow_reconnect=False,
        connect_timeout=5,
        error_cb=on_error,
        **creds,
    )
    return Client(nc, violations)


async def placed_on_every_server(js: JetStreamContext, stream: str) -> None:
    """Wait (bounded) until `stream` has a leader and a current follower on every other server."""
    deadline = time.monotonic() + 20
    while True:
        info = await js.stream_info(stream)
        assert info.config.num_replicas == SERVERS, stream
        peers = [p for p in (info.cluster.replicas or []) if p.current] if info.cluster else []
        if info.cluster is not None and info.cluster.leader and len(peers) == SERVERS - 1:
            return
        assert time.monotonic() < deadline, f"{stream} is not on {SERVERS} servers: {info.cluster}"
        await asyncio.sleep(0.2)


def ingestion_settings() -> IngestionSettings:
    return IngestionSettings(nats_stream_replicas=SERVERS)
