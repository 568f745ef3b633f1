"""docker/healthcheck.py, the gRPC pods' exec probe, against a real gRPC server that requires a
mesh client certificate (as every ragmesh server does with RAGMESH_SERVICE_AUTH=mtls), run as the
kubelet runs it: a process in the container with the container's environment."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .pki import Issued, TestCA

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "docker" / "healthcheck.py"
SERVICE = "ragmesh.index.v1.IndexService"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def index_cert(pki: TestCA) -> Issued:
    # Named only as Kubernetes dials it: no 127.0.0.1, no localhost.
    return pki.issue("index", ["index-0.index", "*.index"], ips=())


@pytest.fixture
async def mtls_server(pki: TestCA, index_cert: Issued) -> AsyncIterator[tuple[int, health.HealthServicer]]:
    server = aio.server()
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials(
        [(index_cert.key.read_bytes(), index_cert.cert.read_bytes())],
        root_certificates=pki.ca_file.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        yield port, servicer
    finally:
        await server.stop(None)


async def probe(port: int, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the probe in a thread: the server under test shares this event loop."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGMESH_TLS_")}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(HEALTHCHECK), "--port", str(port), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def pod_env(pki: TestCA, cert: Issued) -> dict[str, str]:
    """What base/mesh-tls.env gives a pod: one certificate to serve and to call."""
    return {
        "RAGMESH_TLS_CERT_FILE": str(cert.cert),
        "RAGMESH_TLS_KEY_FILE": str(cert.key),
        "RAGMESH_TLS_CA_FILE": str(pki.ca_file),
        "RAGMESH_TLS_CLIENT_CA_FILE": str(pki.ca_file),
        "RAGMESH_TLS_CLIENT_CERT_FILE": str(cert.cert),
        "RAGMESH_TLS_CLIENT_KEY_FILE": str(cert.key),
    }


async def test_probe_passes_mtls_with_the_pods_own_certificate(
    mtls_server: tuple[int, health.HealthServicer], pki: TestCA, index_cert: Issued
) -> None:
    port, servicer = mtls_server
    servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    env = pod_env(pki, index_cert)
    ok = await probe(port, env, SERVICE)
    assert ok.returncode == 0, ok.stderr
    assert (await probe(port, env)).returncode == 0  # the liveness form: the whole server

    servicer.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    not_serving = await probe(port, env, SERVICE)
    assert not_serving.returncode == 1 and "NOT_SERVING" in not_serving.stderr


async def test_probe_fails_without_a_mesh_certificate(
    mtls_server: tuple[int, health.HealthServicer], pki: TestCA, index_cert: Issued
) -> None:
    port, servicer = mtls_server
    servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    # What kubelet's native gRPC probe amounts to: plaintext, no certificate.
    assert (await probe(port, {}, SERVICE)).returncode == 1
    # TLS but no client certificate: the server refuses the handshake.
    env = pod_env(pki, index_cert)
    del env["RAGMESH_TLS_CLIENT_CERT_FILE"], env["RAGMESH_TLS_CLIENT_KEY_FILE"]
    assert (await probe(port, env, SERVICE)).returncode == 1
    # A certificate from another CA.
    stranger = TestCA(pki.dir / "stranger")
    foreign = stranger.issue("index", ["index-0.index"], ips=())
    assert (await probe(port, pod_env(stranger, foreign), SERVICE)).returncode == 1
