"""Service identities through real mTLS servers (RAGMESH_SERVICE_AUTH=mtls): the caller's identity
comes from its verified certificate, each method admits only its callers, a method without a rule
admits nobody, health and reflection stay open, public services take API keys without a
certificate, and a process refuses to start with a hole in it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from meshkit.core.errors import ServiceError
from meshkit.rpc.auth import READ, Rule, key_entry
from meshkit.rpc.client import ClientPolicy, Downstream, check_health
from meshkit.rpc.identity import (
    EMBEDDER,
    GATEWAY,
    IdentityGuard,
    allow,
    certificate_identity,
    check_declaration,
    identity_of_uri,
    peer_identity,
)
from meshkit.rpc.pki import PKIFiles, issue, write_pki
from meshkit.rpc.tls import ClientTLS, TLSConfigError, open_channel
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc

REQUEST = embedder_pb2.EmbedRequest(texts=["hi"])
CALLERS = {"Embed": allow(GATEWAY)}
EMBEDDER_SERVICE = "ragmesh.embedder.v1.EmbedderService"


@dataclass(frozen=True)
class Mesh:
    pki: PKIFiles
    # A certificate from the mesh CA that names no identity, and one from another CA.
    anonymous: tuple[Path, Path]
    foreign: tuple[Path, Path]

    def client(self, identity: str) -> ClientTLS:
        return ClientTLS(self.pki.ca_cert, self.pki.cert(identity), self.pki.key(identity), "localhost")

    def server(self, identity: str, **more: Any) -> dict[str, Any]:
        return {
            "service_auth": "mtls",
            "tls_ca_file": self.pki.ca_cert,
            "tls_cert_file": self.pki.cert(identity),
            "tls_key_file": self.pki.key(identity),
            **more,
        }


def _write(path: Path, issued: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]) -> Path:
    cert, key = issued
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Mesh:
    root = tmp_path_factory.mktemp("mesh")
    pki = write_pki(root / "pki")
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = (x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()), ca_key)
    anonymous = _write(root / "anonymous.crt", issue(ca, "anonymous"))
    foreign_ca = write_pki(root / "foreign", identities=[GATEWAY], infra=False)
    return Mesh(
        pki,
        (anonymous, anonymous.with_suffix(".key")),
        (foreign_ca.cert(GATEWAY), foreign_ca.key(GATEWAY)),
    )


async def embed(address: str, tls: ClientTLS | None, method: str = "Embed") -> grpc.StatusCode:
    async with open_channel(address, tls=tls) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        try:
            if method == "Embed":
                await stub.Embed(REQUEST, timeout=3)
            else:
                await stub.GetModelInfo(embedder_pb2.GetModelInfoRequest(), timeout=3)
        except aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def details(address: str, tls: ClientTLS) -> str:
    async with open_channel(address, tls=tls) as channel:
        with pytest.raises(aio.AioRpcError) as err:
            await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(REQUEST, timeout=3)
    return err.value.details() or ""


# ------------------------------------------------------------------ pure functions


def test_identity_comes_only_from_a_single_ragmesh_uri() -> None:
    assert identity_of_uri("spiffe://ragmesh/ingestion-worker") == "ingestion-worker"
    for other in ("spiffe://other/gateway", "https://ragmesh/gateway", "spiffe://ragmesh/Gate way", ""):
        assert identity_of_uri(other) is None
    assert peer_identity({"peer_uri": [b"spiffe://ragmesh/gateway"]}) == "gateway"
    assert peer_identity({"peer_uri": [b"https://example.com", b"spiffe://ragmesh/ops"]}) == "ops"
    # Two identities in one certificate: neither is believed.
    assert peer_identity({"peer_uri": [b"spiffe://ragmesh/gateway", b"spiffe://ragmesh/ops"]}) is None
    assert peer_identity({"x509_common_name": [b"gateway"]}) is None  # a CN alone is not an identity
    assert peer_identity({}) is None


def test_allow_refuses_names_outside_the_mesh() -> None:
    with pytest.raises(ValueError, match="unknown identities"):
        allow(GATEWAY, "gatewy")


def test_guard_fails_closed() -> None:
    guard = IdentityGuard("svc", {"Embed": allow(GATEWAY)})
    gateway = {"peer_uri": [b"spiffe://ragmesh/gateway"]}
    assert guard.check("Embed", gateway) == GATEWAY
    cases = [
        ("Embed", {}, grpc.StatusCode.UNAUTHENTICATED, "needs a mesh client certificate"),
        (
            "Embed",
            {"peer_uri": [b"spiffe://ragmesh/embedder"]},
            grpc.StatusCode.PERMISSION_DENIED,
            "'embedder'",
        ),
        ("GetModelInfo", gateway, grpc.StatusCode.PERMISSION_DENIED, "no rule"),
    ]
    for method, context, code, fragment in cases:
        with pytest.raises(ServiceError) as err:
            guard.check(method, context)
        assert err.value.code == code and fragment in err.value.message and method in err.value.message


def test_declarations_are_checked_against_the_contract() -> None:
    problems = check_declaration("svc", {"Embed": allow(GATEWAY), "Gone": allow(GATEWAY)}, ["Embed", "New"])
    assert problems == ["svc.New has no caller rule", "svc has a rule for Gone, which its contract lacks"]


# ------------------------------------------------------------------ through real servers


async def test_each_method_admits_only_its_callers(start_fake: Any, mesh: Mesh) -> None:
    served = await start_fake(callers=CALLERS, **mesh.server(EMBEDDER))
    assert await embed(served.address, mesh.client(GATEWAY)) == grpc.StatusCode.OK
    assert await embed(served.address, mesh.client("ops")) == grpc.StatusCode.PERMISSION_DENIED
    assert "identity 'ops' may not call" in await details(served.address, mesh.client("ops"))
    # GetModelInfo has no rule: nobody may call it, whatever certificate they hold.
    assert (
        await embed(served.address, mesh.client(GATEWAY), "GetModelInfo") == grpc.StatusCode.PERMISSION_DENIED
    )
    assert served.fake.calls == 1


async def test_callers_without_a_mesh_identity_are_refused(start_fake: Any, mesh: Mesh) -> None:
    served = await start_fake(callers=CALLERS, **mesh.server(EMBEDDER))
    # No certificate, plaintext, or another CA's certificate: no connection at all.
    assert await embed(served.address, ClientTLS(mesh.pki.ca_cert, server_name="localhost")) == (
        grpc.StatusCode.UNAVAILABLE
    )
    assert await embed(served.address, None) == grpc.StatusCode.UNAVAILABLE
    foreign = ClientTLS(mesh.pki.ca_cert, *mesh.foreign, "localhost")
    assert await embed(served.address, foreign) == grpc.StatusCode.UNAVAILABLE
    # The mesh CA's certificate without a spiffe://ragmesh/ identity: connected, not admitted.
    anonymous = ClientTLS(mesh.pki.ca_cert, *mesh.anonymous, "localhost")
    assert await embed(served.address, anonymous) == grpc.StatusCode.UNAUTHENTICATED
    assert served.fake.calls == 0


async def test_health_and_reflection_stay_open_to_any_mesh_identity(start_fake: Any, mesh: Mesh) -> None:
    served = await start_fake(callers={}, **mesh.server(EMBEDDER))
    anonymous = ClientTLS(mesh.pki.ca_cert, *mesh.anonymous, "localhost")
    assert await check_health(served.address, tls=anonymous) == "SERVING"
    async with open_channel(served.address, tls=mesh.client(EMBEDDER)) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        replies = [reply async for reply in stub.ServerReflectionInfo(iter([request]), timeout=3)]
    assert EMBEDDER_SERVICE in {s.name for s in replies[0].list_services_response.service}


async def test_the_health_port_answers_probes_without_a_certificate(start_fake: Any, mesh: Mesh) -> None:
    from ragmesh_cli.procutil import free_ports

    (health_port,) = free_ports(1)
    await start_fake(callers=CALLERS, health_port=health_port, **mesh.server(EMBEDDER))
    probe = f"127.0.0.1:{health_port}"
    assert await check_health(probe) == "SERVING"
    # It serves health only: the service's methods are not there.
    assert await embed(probe, None) == grpc.StatusCode.UNIMPLEMENTED
    async with aio.insecure_channel(probe) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=EMBEDDER_SERVICE), timeout=3
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_downstream_presents_the_process_certificate(start_fake: Any, mesh: Mesh) -> None:
    served = await start_fake(callers=CALLERS, **mesh.server(EMBEDDER))
    for caller, ok in ((GATEWAY, True), (EMBEDDER, False)):
        settings = MeshSettings(**mesh.server(caller), tls_server_name="localhost", client_retry_attempts=1)
        client = Downstream(
            "fake",
            served.address,
            embedder_pb2_grpc.EmbedderServiceStub,
            ClientPolicy.from_settings(settings),
        )
        try:
            if ok:
                assert (await client.call(client.stub.Embed, REQUEST, timeout=3)).model == "hi"
            else:
                with pytest.raises(Exception, match="may not call"):
                    await client.call(client.stub.Embed, REQUEST, timeout=3)
        finally:
            await client.close()


async def test_a_public_service_takes_api_keys_without_a_certificate(
    start_fake: Any, mesh: Mesh, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [key_entry("app", "rmk_app-key", ["docs"], [], None)]}))
    served = await start_fake(
        name=GATEWAY,
        access={"Embed": Rule(READ, lambda r: "docs")},
        **mesh.server(GATEWAY, api_keys_file=keys),
    )
    plain_tls = ClientTLS(mesh.pki.ca_cert, server_name="localhost")
    async with open_channel(served.address, tls=plain_tls) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        reply = await stub.Embed(REQUEST, metadata=(("authorization", "Bearer rmk_app-key"),), timeout=3)
        assert reply.model == "hi"
        with pytest.raises(aio.AioRpcError) as err:
            await stub.Embed(REQUEST, timeout=3)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # TLS all the same: plaintext gets nowhere.
    assert await embed(served.address, None) == grpc.StatusCode.UNAVAILABLE


async def test_no_process_starts_with_a_hole(start_fake: Any, mesh: Mesh) -> None:
    # A public service without API keys would be open to anyone.
    with pytest.raises(TLSConfigError, match="needs API keys"):
        await start_fake(name=GATEWAY, access={"Embed": Rule(READ, lambda r: "docs")}, **mesh.server(GATEWAY))
    # A service holding another identity's certificate would be let in where that one is.
    with pytest.raises(TLSConfigError, match="given the certificate of 'gateway'"):
        await start_fake(name=EMBEDDER, callers=CALLERS, **mesh.server(GATEWAY))
    # No certificate at all, or one that names no identity.
    with pytest.raises(TLSConfigError, match="needs this service's certificate"):
        await start_fake(callers=CALLERS, service_auth="mtls", tls_ca_file=mesh.pki.ca_cert)
    with pytest.raises(TLSConfigError, match="names no spiffe"):
        await start_fake(
            callers=CALLERS,
            service_auth="mtls",
            tls_ca_file=mesh.pki.ca_cert,
            tls_cert_file=mesh.anonymous[0],
            tls_key_file=mesh.anonymous[1],
        )


def test_certificate_identity_reads_the_pki(mesh: Mesh) -> None:
    assert certificate_identity(mesh.pki.cert(GATEWAY).read_bytes()) == GATEWAY
    assert certificate_identity(mesh.anonymous[0].read_bytes()) is None
