"""meshkit.rpc.tls through real servers: TLS accepts TLS clients and refuses plaintext, mTLS refuses
clients without a certificate; Downstream and check_health follow the settings; bad settings
fail at start with the path, never the PEM."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc import aio

from meshkit.rpc.client import ClientPolicy, Downstream, DownstreamError, check_health
from meshkit.rpc.tls import ClientTLS, TLSConfigError, open_channel, server_credentials, server_mode
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc

REQUEST = embedder_pb2.EmbedRequest(texts=["hi"])


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def _issue(
    directory: Path,
    stem: str,
    subject: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    signer_cert, signer_key = issuer if issuer is not None else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(signer_cert.subject if signer_cert is not None else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    cert = builder.sign(signer_key, hashes.SHA256())
    (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(directory / f"{stem}.key", key)
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("tls")
    ca = _issue(d, "ca", "ragmesh test CA", None, ca=True)
    _issue(d, "server", "gateway", ca, server=True)
    _issue(d, "client", "cli", ca)
    _issue(d, "other-ca", "someone else's CA", None, ca=True)
    return Certs(
        d / "ca.pem",
        d / "server.pem",
        d / "server.key",
        d / "client.pem",
        d / "client.key",
        d / "other-ca.pem",
    )


def server_tls(certs: Certs, mtls: bool = False) -> dict[str, Any]:
    settings: dict[str, Any] = {"tls_cert_file": certs.server_cert, "tls_key_file": certs.server_key}
    if mtls:
        settings["tls_client_ca_file"] = certs.ca
    return settings


async def embed(address: str, tls: ClientTLS | None) -> str:
    async with open_channel(address, tls=tls) as channel:
        reply = await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(REQUEST, timeout=3)
    return reply.model


async def refused(address: str, tls: ClientTLS | None) -> grpc.StatusCode:
    with pytest.raises(aio.AioRpcError) as err:
        await embed(address, tls)
    return err.value.code()


async def test_tls_server_accepts_tls_and_refuses_plaintext(start_fake: Any, certs: Certs) -> None:
    served = await start_fake(**server_tls(certs))
    assert await embed(served.address, ClientTLS(certs.ca)) == "hi"
    assert await refused(served.address, None) == grpc.StatusCode.UNAVAILABLE
    # A client that trusts another CA does not trust this server.
    assert await refused(served.address, ClientTLS(certs.other_ca)) == grpc.StatusCode.UNAVAILABLE
    assert await check_health(served.address, tls=ClientTLS(certs.ca)) == "SERVING"
    assert await check_health(served.address) == "UNREACHABLE"


async def test_mtls_server_refuses_clients_without_a_certificate(start_fake: Any, certs: Certs) -> None:
    served = await start_fake(**server_tls(certs, mtls=True))
    with_cert = ClientTLS(certs.ca, certs.client_cert, certs.client_key)
    assert await embed(served.address, with_cert) == "hi"
    assert await refused(served.address, ClientTLS(certs.ca)) == grpc.StatusCode.UNAVAILABLE
    assert await refused(served.address, None) == grpc.StatusCode.UNAVAILABLE


async def test_downstream_speaks_tls_from_settings(start_fake: Any, certs: Certs) -> None:
    served = await start_fake(**server_tls(certs, mtls=True))
    settings = MeshSettings(
        tls_ca_file=certs.ca,
        tls_client_cert_file=certs.client_cert,
        tls_client_key_file=certs.client_key,
        tls_server_name="localhost",
        client_retry_attempts=1,
    )
    policy = ClientPolicy.from_settings(settings)
    assert policy.tls == ClientTLS(certs.ca, certs.client_cert, certs.client_key, "localhost")
    client = Downstream("tls-fake", served.address, embedder_pb2_grpc.EmbedderServiceStub, policy)
    try:
        reply = await client.call(client.stub.Embed, REQUEST, timeout=3)
        assert reply.model == "hi"
    finally:
        await client.close()
    plain = Downstream("plain-fake", served.address, embedder_pb2_grpc.EmbedderServiceStub, ClientPolicy())
    try:
        with pytest.raises(DownstreamError) as err:
            await plain.call(plain.stub.Embed, REQUEST, timeout=3)
        assert err.value.reason == "unavailable"
    finally:
        await plain.close()


def test_settings_without_tls_mean_plaintext() -> None:
    settings = MeshSettings()
    assert server_credentials(settings) is None and server_mode(settings) == "plaintext"
    assert ClientTLS.from_settings(settings) is None
    assert ClientPolicy.from_settings(settings).tls is None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"tls_cert_file": "c.pem"}, "must be set together"),
        ({"tls_client_ca_file": "ca.pem"}, "needs RAGMESH_TLS_CERT_FILE"),
        (
            {"tls_cert_file": "missing.pem", "tls_key_file": "missing.key"},
            "cannot read the TLS key 'missing.key'",
        ),
    ],
)
def test_bad_server_settings_fail_clearly(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(TLSConfigError, match=problem):
        server_credentials(MeshSettings(**fields))


def test_bad_client_settings_fail_clearly(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match="needs RAGMESH_TLS_CA_FILE"):
        ClientTLS.from_settings(
            MeshSettings(tls_client_cert_file=certs.client_cert, tls_client_key_file=certs.client_key)
        )
    with pytest.raises(TLSConfigError, match="must be set together"):
        ClientTLS.from_settings(MeshSettings(tls_ca_file=certs.ca, tls_client_cert_file=certs.client_cert))
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    with pytest.raises(TLSConfigError, match="is empty"):
        ClientTLS(empty).credentials()


async def test_key_material_stays_out_of_errors(start_fake: Any, certs: Certs) -> None:
    # A certificate given as the key: gRPC refuses it; the message names no PEM content.
    pem = certs.server_key.read_text()
    with pytest.raises(RuntimeError) as err:
        await start_fake(tls_cert_file=certs.server_cert, tls_key_file=certs.client_cert)
    assert pem.splitlines()[1] not in str(err.value)
    assert server_mode(MeshSettings(**server_tls(certs, mtls=True))) == "mtls"
