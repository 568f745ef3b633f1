"""The mesh PKI: a CA and one key and certificate per service identity (``ragmesh certs new``,
``ragmesh up --secure``).

Each identity's certificate names it twice: CN ``<identity>`` and the URI SAN
``spiffe://ragmesh/<identity>``, which meshkit.rpc.identity reads. It carries both TLS usages (a
service serves with the certificate it calls with) and the names it is dialled by: 127.0.0.1,
``localhost`` and the identity itself, plus Kubernetes Service names when a namespace is given.
``ops`` (the CLI, load tests) only calls, so it gets client usage alone. The infrastructure
servers (NATS, the object store) get server certificates without a mesh identity: they are
reached, never callers.

Keys are EC P-256, files are written 0600 in a 0700 directory, and nothing here logs or prints
key material.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshkit.rpc.identity import MESH_IDENTITIES, OPS, spiffe_id

CA_NAME = "ca"
CA_COMMON_NAME = "ragmesh mesh CA"
# Servers of the infrastructure and the DNS names their Kubernetes Services have.
INFRA_SERVERS: dict[str, tuple[str, ...]] = {"nats": ("nats",), "s3": ("s3", "minio")}
# Infrastructure servers that also dial each other with their certificate: NATS cluster routes
# are mutual TLS, so a NATS certificate without client usage cannot join its own cluster.
INFRA_PEERS = frozenset({"nats"})
LOOPBACK_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1",)
CLOCK_SKEW = datetime.timedelta(minutes=5)

Issued = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


class PKIError(ValueError):
    """A PKI that cannot be written or read; the message names the path, never key material."""


@dataclass(frozen=True)
class PKIFiles:
    """Where a mesh PKI lives: ``ca.crt``, ``ca.key`` and ``<name>.crt``/``<name>.key``."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.cert(CA_NAME)

    @property
    def ca_key(self) -> Path:
        return self.key(CA_NAME)

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def complete(self, names: Sequence[str]) -> bool:
        return all(self.cert(n).is_file() and self.key(n).is_file() for n in (CA_NAME, *names))


def kubernetes_names(service: str, namespace: str, cluster_domain: str = "cluster.local") -> list[str]:
    """The DNS names pods reach a Service (and a headless Service's pods) by."""
    svc = f"{service}.{namespace}.svc"
    return [f"{service}.{namespace}", svc, f"*.{svc}", f"{svc}.{cluster_domain}", f"*.{svc}.{cluster_domain}"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - CLOCK_SKEW).not_valid_after(now + datetime.timedelta(days=days))


def new_ca(days: int = 3650) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(CA_COMMON_NAME))
        .issuer_name(_name(CA_COMMON_NAME))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return _validity(builder, days).sign(key, hashes.SHA256()), key


def issue(
    ca: Issued,
    common_name: str,
    *,
    dns_names: Sequence[str] = (),
    uri: str | None = None,
    server: bool = True,
    client: bool = True,
    days: int = 365,
    loopback: bool = True,
    ips: Sequence[str] = (),
) -> Issued:
    """A leaf certificate signed by ``ca`` for ``dns_names`` and ``ips``, and for localhost and
    127.0.0.1 unless ``loopback`` is False (a pod's certificate names its Service)."""
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    local_names, local_ips = (LOOPBACK_NAMES, LOOPBACK_IPS) if loopback else ((), ())
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys([*local_names, *dns_names])]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys([*local_ips, *ips])]
    if uri is not None:
        names.append(x509.UniformResourceIdentifier(uri))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    return _validity(builder, days).sign(ca_key, hashes.SHA256()), key


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte (replacing any old file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_pair(files: PKIFiles, name: str, issued: Issued) -> None:
    cert, key = issued
    _write_private(
        files.key(name),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    _write_private(files.cert(name), cert.public_bytes(serialization.Encoding.PEM))


def write_pki(
    directory: Path,
    *,
    identities: Sequence[str] = MESH_IDENTITIES,
    infra: bool = True,
    namespace: str | None = None,
    cluster_domain: str = "cluster.local",
    extra_dns: Sequence[str] = (),
    days: int = 365,
    ca_days: int = 3650,
    force: bool = False,
) -> PKIFiles:
    """A new CA and a certificate for every identity (and the infrastructure servers) in
    ``directory``. Refuses to replace an existing CA unless ``force``: every certificate of the
    mesh would have to be replaced with it."""
    files = PKIFiles(Path(directory))
    if files.ca_key.exists() and not force:
        raise PKIError(
            f"{files.ca_key} exists: a new CA replaces every certificate of the mesh (use --force)"
        )
    files.directory.mkdir(parents=True, exist_ok=True)
    files.directory.chmod(0o700)
    ca = new_ca(ca_days)
    write_pair(files, CA_NAME, ca)

    def dns_for(service: str, names: Sequence[str]) -> list[str]:
        k8s = kubernetes_names(service, namespace, cluster_domain) if namespace else []
        return [*names, *k8s, *extra_dns]

    for identity in identities:
        client_only = identity == OPS
        issued = issue(
            ca,
            identity,
            dns_names=[] if client_only else dns_for(identity, [identity]),
            uri=spiffe_id(identity),
            server=not client_only,
            days=days,
        )
        write_pair(files, identity, issued)
    if infra:
        for server, names in INFRA_SERVERS.items():
            issued = issue(
                ca, server, dns_names=dns_for(names[-1], names), client=server in INFRA_PEERS, days=days
            )
            write_pair(files, server, issued)
    return files
