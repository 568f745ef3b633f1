"""The /metrics port under RAGMESH_SERVICE_AUTH=mtls (meshkit.rpc.metrics, meshkit.rpc.tls.metrics_tls),
through real sockets and a PKI made by meshkit.rpc.pki: HTTPS with the process's certificate that
requires a mesh client certificate; plaintext, TLS without a certificate and another CA's
certificate fail the handshake; a mesh certificate that is not a metrics reader gets 403; with
auth off it stays plaintext HTTP. Pre-fork workers serve theirs the same way (through run_service)."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import pytest

from meshkit.rpc.identity import MESH_IDENTITIES, OPS, allow, spiffe_id
from meshkit.rpc.metrics import MetricsTLS, serve_metrics, start_metrics_server
from meshkit.rpc.pki import Issued, PKIFiles, issue, new_ca, write_pair
from meshkit.rpc.tls import MESH_CERT_MISSING, METRICS_READERS, METRICS_SCRAPER, TLSConfigError, metrics_tls
from meshkit.settings import MeshSettings

ROOT = Path(__file__).resolve().parents[2]
PREFORK_SERVICE = Path(__file__).with_name("prefork_service.py")
FAMILY = "ragmesh_rpc_requests_total"


@dataclass(frozen=True)
class Pki:
    mesh: PKIFiles
    other: PKIFiles  # another CA, with an ops certificate of its own


def _write_identity(files: PKIFiles, ca: Issued, name: str, *, server: bool) -> None:
    # Shaped as meshkit.rpc.pki.write_pki makes them: the identity as URI SAN (and DNS name for a
    # server), localhost and 127.0.0.1.
    cert = issue(ca, name, dns_names=[name] if server else [], uri=spiffe_id(name), server=server, days=1)
    write_pair(files, name, cert)


def _make_pki(directory: Path) -> PKIFiles:
    files = PKIFiles(directory)
    directory.mkdir(parents=True)
    ca = new_ca(days=1)
    write_pair(files, "ca", ca)
    for name, server in (("embedder", True), ("gateway", True), (OPS, False), (METRICS_SCRAPER, False)):
        _write_identity(files, ca, name, server=server)
    return files


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("metrics-pki")
    return Pki(_make_pki(root / "mesh"), _make_pki(root / "other"))


def secure_fields(pki: Pki, identity: str = "embedder") -> dict[str, object]:
    return {
        "service_auth": "mtls",
        "tls_cert_file": pki.mesh.cert(identity),
        "tls_key_file": pki.mesh.key(identity),
        "tls_ca_file": pki.mesh.ca_cert,
    }


def secure_settings(pki: Pki, identity: str = "embedder") -> MeshSettings:
    return MeshSettings(**secure_fields(pki, identity))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def served(pki: Pki) -> Iterator[int]:
    """An embedder's /metrics port under service_auth=mtls."""
    tls = metrics_tls(secure_settings(pki))
    assert tls is not None
    server = serve_metrics(0, "127.0.0.1", tls)
    yield int(server.server_address[1])
    _stop(server)


def _stop(server: WSGIServer) -> None:
    server.shutdown()
    server.server_close()


def client_context(ca: Path, files: PKIFiles | None = None, identity: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if files is not None and identity is not None:
        context.load_cert_chain(files.cert(identity), files.key(identity))
    return context


def scrape(port: int, context: ssl.SSLContext | None, timeout: float = 5.0) -> tuple[int, str]:
    """GET /metrics over HTTPS (``context``) or plaintext HTTP (None): status and body."""
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
        if context is not None
        else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    )
    try:
        conn.request("GET", "/metrics")
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


def plaintext_reply(port: int) -> bytes:
    """What a plaintext HTTP request gets back, raw, until the server closes or resets the
    connection (a TLS server may answer with an alert first)."""
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------------------- mtls


@pytest.mark.parametrize("reader", sorted(METRICS_READERS))
def test_a_metrics_reader_certificate_gets_the_metrics(served: int, pki: Pki, reader: str) -> None:
    status, body = scrape(served, client_context(pki.mesh.ca_cert, pki.mesh, reader))
    assert status == 200
    assert f"# TYPE {FAMILY} counter" in body


def test_the_server_proves_its_own_identity(served: int, pki: Pki) -> None:
    context = client_context(pki.mesh.ca_cert, pki.mesh, OPS)
    with (
        socket.create_connection(("127.0.0.1", served), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="embedder") as tls,
    ):
        cert = tls.getpeercert()
    assert ("URI", spiffe_id("embedder")) in cert["subjectAltName"]
    # A client that trusts another CA does not trust this server.
    with pytest.raises(ssl.SSLCertVerificationError):
        scrape(served, client_context(pki.other.ca_cert, pki.other, OPS))


def test_plaintext_is_refused(served: int) -> None:
    reply = plaintext_reply(served)
    assert not reply.startswith(b"HTTP/") and FAMILY.encode() not in reply
    with pytest.raises(OSError):
        scrape(served, None)


def test_tls_without_a_client_certificate_is_refused(served: int, pki: Pki) -> None:
    # TLS 1.3: the client's side of the handshake may finish first; the server's refusal (an
    # alert, then the close) arrives on the first read.
    with pytest.raises(OSError):
        scrape(served, client_context(pki.mesh.ca_cert))


def test_a_certificate_from_another_ca_is_refused(served: int, pki: Pki) -> None:
    # It trusts the mesh CA (so the server checks out) but presents the other CA's ops certificate.
    with pytest.raises(OSError):
        scrape(served, client_context(pki.mesh.ca_cert, pki.other, OPS))


def test_a_mesh_certificate_of_another_identity_is_forbidden(served: int, pki: Pki) -> None:
    status, body = scrape(served, client_context(pki.mesh.ca_cert, pki.mesh, "gateway"))
    assert status == 403
    assert FAMILY not in body and "may read metrics" in body


def test_a_silent_client_does_not_hold_up_scrapes(served: int, pki: Pki) -> None:
    context = client_context(pki.mesh.ca_cert, pki.mesh, METRICS_SCRAPER)
    with socket.create_connection(("127.0.0.1", served), timeout=5):  # connects, never shakes hands
        started = time.monotonic()
        status, _body = scrape(served, context)
    assert status == 200 and time.monotonic() - started < 2.0


def test_a_half_finished_handshake_times_out(pki: Pki) -> None:
    tls = metrics_tls(secure_settings(pki))
    assert tls is not None
    quick = MetricsTLS(tls.context, tls.identity_of, tls.readers, timeout_s=0.3)
    server = serve_metrics(0, "127.0.0.1", quick)
    try:
        with socket.create_connection(("127.0.0.1", int(server.server_address[1])), timeout=5) as sock:
            assert sock.recv(1) == b""  # the server gave up on it and closed
    finally:
        _stop(server)


def test_the_scraper_identity_may_call_no_grpc_method() -> None:
    # Not a mesh service: no caller rule can name it, so its certificate reads metrics only.
    assert METRICS_SCRAPER not in MESH_IDENTITIES
    with pytest.raises(ValueError, match="unknown identities"):
        allow(METRICS_SCRAPER)


# ------------------------------------------------------------------------------- settings


def test_auth_off_stays_plaintext_http(pki: Pki) -> None:
    # A certificate set without service_auth=mtls changes nothing for /metrics.
    settings = MeshSettings(tls_cert_file=pki.mesh.cert("embedder"), tls_key_file=pki.mesh.key("embedder"))
    assert metrics_tls(settings) is None
    server = serve_metrics(0, "127.0.0.1", None)
    try:
        status, body = scrape(int(server.server_address[1]), None)
    finally:
        _stop(server)
    assert status == 200 and f"# TYPE {FAMILY} counter" in body


def test_start_metrics_server_binds_tls_where_asked(pki: Pki) -> None:
    port = _free_port()
    assert start_metrics_server(port, "127.0.0.1", metrics_tls(secure_settings(pki))) == port
    assert scrape(port, client_context(pki.mesh.ca_cert, pki.mesh, OPS))[0] == 200
    assert start_metrics_server(0, "127.0.0.1", metrics_tls(secure_settings(pki))) == 0  # disabled


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"tls_cert_file": None, "tls_key_file": None}, MESH_CERT_MISSING),
        ({"tls_ca_file": None}, "needs the mesh CA"),
        ({"tls_key_file": "missing.key"}, "cannot read the TLS key 'missing.key'"),
        ({"tls_client_ca_file": "missing-ca.pem"}, "cannot read the client CA bundle 'missing-ca.pem'"),
    ],
)
def test_bad_mtls_settings_fail_at_start(pki: Pki, fields: dict[str, object], problem: str) -> None:
    with pytest.raises(TLSConfigError, match=problem):
        metrics_tls(MeshSettings(**{**secure_fields(pki), **fields}))  # type: ignore[arg-type]


def test_a_key_that_is_not_the_certificates_fails_at_start(pki: Pki) -> None:
    fields = {**secure_fields(pki), "tls_key_file": pki.mesh.key("gateway")}
    with pytest.raises(TLSConfigError, match="are not a PEM key pair"):
        metrics_tls(MeshSettings(**fields))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- pre-fork workers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_port_pair() -> int:
    for _ in range(200):
        first = _free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", first + 1))
            except OSError:
                continue
        return first
    raise RuntimeError("no two consecutive free ports")


def _scrape_when_up(port: int, context: ssl.SSLContext, timeout: float = 30.0) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(port, context)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_prefork_workers_serve_their_metrics_over_mtls(pki: Pki) -> None:
    metrics = _free_port_pair()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMESH_")}
    env |= {
        "RAGMESH_LOG_FORMAT": "text",
        "RAGMESH_SHUTDOWN_GRACE_S": "1",
        "RAGMESH_WORKERS": "2",
        "RAGMESH_PORT": str(_free_port()),
        "RAGMESH_METRICS_PORT": str(metrics),
        "RAGMESH_SERVICE_AUTH": "mtls",
        "RAGMESH_TLS_CERT_FILE": str(pki.mesh.cert("embedder")),
        "RAGMESH_TLS_KEY_FILE": str(pki.mesh.key("embedder")),
        "RAGMESH_TLS_CA_FILE": str(pki.mesh.ca_cert),
    }
    group = subprocess.Popen(
        [sys.executable, str(PREFORK_SERVICE)], env=env, cwd=ROOT, start_new_session=True
    )
    try:
        context = client_context(pki.mesh.ca_cert, pki.mesh, METRICS_SCRAPER)
        for worker in range(2):
            status, body = _scrape_when_up(metrics + worker, context)
            assert status == 200 and f"# TYPE {FAMILY} counter" in body
            assert not plaintext_reply(metrics + worker).startswith(b"HTTP/")
    finally:
        os.killpg(group.pid, signal.SIGKILL)
        group.wait(10)
