"""TLS for the mesh: servers listen with TLS when given a certificate (and require client
certificates when given a client CA: mTLS); clients verify servers against a CA bundle and
present a certificate of their own when given one.

With ``RAGMESH_SERVICE_AUTH=mtls`` the mesh's shape is fixed rather than pieced together: every
server serves TLS with its own certificate; an internal server requires a client certificate
signed by the mesh CA (``tls_client_ca_file``, default ``tls_ca_file``), while a public one (the
gateway, the ingestion API: API keys) asks for none, since gRPC Python can require a client
certificate or not ask for one, nothing in between; and every client presents the process's own
certificate (``tls_client_cert_file``, default ``tls_cert_file``). meshkit.rpc.identity reads the
caller's identity from the verified certificate.

Only file paths travel through settings and logs; the PEM bytes are read when a port is bound or
a channel opened and go nowhere but to gRPC.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from meshkit.rpc.identity import OPS, certificate_identity
from meshkit.rpc.metrics import MetricsTLS
from meshkit.settings import MeshSettings


class TLSConfigError(ValueError):
    """TLS settings that cannot work (half a key pair, an unreadable file)."""


MESH_CERT_MISSING = (
    "RAGMESH_SERVICE_AUTH=mtls needs this service's certificate: "
    "RAGMESH_TLS_CERT_FILE and RAGMESH_TLS_KEY_FILE"
)


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"cannot read the {what} {str(path)!r}: {exc.strerror or exc}") from exc
    if not data.strip():
        raise TLSConfigError(f"the {what} {str(path)!r} is empty")
    return data


def _pair(cert: Path | None, key: Path | None, names: str) -> tuple[Path, Path] | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise TLSConfigError(f"{names} must be set together")
    return cert, key


# ------------------------------------------------------------------------------- server side


def _mesh_server_credentials(settings: MeshSettings, public: bool) -> grpc.ServerCredentials:
    pair = _pair(
        settings.tls_cert_file, settings.tls_key_file, "RAGMESH_TLS_CERT_FILE and RAGMESH_TLS_KEY_FILE"
    )
    if pair is None:
        raise TLSConfigError(MESH_CERT_MISSING)
    cert, key = pair
    own = [(_read(key, "TLS key"), _read(cert, "TLS certificate"))]
    if public:
        return grpc.ssl_server_credentials(own)
    client_ca = settings.tls_client_ca_file or settings.tls_ca_file
    if client_ca is None:
        raise TLSConfigError("RAGMESH_SERVICE_AUTH=mtls needs the mesh CA: RAGMESH_TLS_CA_FILE")
    return grpc.ssl_server_credentials(
        own, root_certificates=_read(client_ca, "client CA bundle"), require_client_auth=True
    )


def server_credentials(settings: MeshSettings, public: bool = False) -> grpc.ServerCredentials | None:
    """TLS credentials for the server's port, or None for plaintext (no certificate set).
    ``public``: a service whose callers authenticate with API keys (no client certificate
    asked for under service_auth=mtls)."""
    if settings.service_auth == "mtls":
        return _mesh_server_credentials(settings, public)
    pair = _pair(
        settings.tls_cert_file, settings.tls_key_file, "RAGMESH_TLS_CERT_FILE and RAGMESH_TLS_KEY_FILE"
    )
    if pair is None:
        if settings.tls_client_ca_file is not None:
            raise TLSConfigError(
                "RAGMESH_TLS_CLIENT_CA_FILE needs RAGMESH_TLS_CERT_FILE/KEY_FILE (mTLS is TLS)"
            )
        return None
    cert, key = pair
    client_ca = settings.tls_client_ca_file
    return grpc.ssl_server_credentials(
        [(_read(key, "TLS key"), _read(cert, "TLS certificate"))],
        root_certificates=_read(client_ca, "client CA bundle") if client_ca is not None else None,
        require_client_auth=client_ca is not None,
    )


def server_mode(settings: MeshSettings, public: bool = False) -> str:
    """How the server's port is protected, for the start-up log: plaintext, tls or mtls."""
    if settings.service_auth == "mtls":
        return "tls" if public else "mtls"
    if settings.tls_cert_file is None:
        return "plaintext"
    return "mtls" if settings.tls_client_ca_file is not None else "tls"


def bind(server: aio.Server, address: str, settings: MeshSettings, public: bool = False) -> int:
    """Add the listening port, with TLS when configured; returns the bound port (0: failed)."""
    credentials = server_credentials(settings, public)
    if credentials is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, credentials)


# ------------------------------------------------------------------------------- /metrics

# A scrape-only identity: its certificate reads metrics and calls nothing (no gRPC method admits
# it), so a monitoring system need not hold ops, which may call every method of the mesh.
METRICS_SCRAPER = "prometheus"
METRICS_READERS = frozenset({OPS, METRICS_SCRAPER})


def _mesh_client_ca(settings: MeshSettings) -> Path:
    client_ca = settings.tls_client_ca_file or settings.tls_ca_file
    if client_ca is None:
        raise TLSConfigError("RAGMESH_SERVICE_AUTH=mtls needs the mesh CA: RAGMESH_TLS_CA_FILE")
    return client_ca


def _metrics_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    # Read through _read first: a missing or empty file is named, as for the gRPC port.
    for path, what in ((cert, "TLS certificate"), (key, "TLS key"), (client_ca, "client CA bundle")):
        _read(path, what)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError:
        raise TLSConfigError(
            f"the TLS certificate {str(cert)!r} and key {str(key)!r} are not a PEM key pair"
        ) from None
    try:
        context.load_verify_locations(cafile=client_ca)
    except ssl.SSLError:
        raise TLSConfigError(f"the client CA bundle {str(client_ca)!r} holds no PEM certificate") from None
    return context


def der_identity(der: bytes) -> str | None:
    """The mesh identity of a DER certificate (as ssl hands over a verified peer's)."""
    return certificate_identity(ssl.DER_cert_to_PEM_cert(der).encode("ascii"))


def metrics_tls(settings: MeshSettings) -> MetricsTLS | None:
    """How the /metrics port is protected: None (plaintext HTTP) with service_auth off; under
    mtls, HTTPS with the process's own certificate that requires a client certificate from the
    mesh CA (a caller without one fails the handshake) naming one of METRICS_READERS."""
    if settings.service_auth != "mtls":
        return None
    pair = _pair(
        settings.tls_cert_file, settings.tls_key_file, "RAGMESH_TLS_CERT_FILE and RAGMESH_TLS_KEY_FILE"
    )
    if pair is None:
        raise TLSConfigError(MESH_CERT_MISSING)
    context = _metrics_context(*pair, _mesh_client_ca(settings))
    return MetricsTLS(context, der_identity, METRICS_READERS)


# ------------------------------------------------------------------------------- client side


@dataclass(frozen=True)
class ClientTLS:
    """How a client reaches TLS servers: the CA that signs them, and its own certificate for
    servers that require one."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str = ""

    @classmethod
    def from_settings(cls, settings: MeshSettings) -> ClientTLS | None:
        """None when the client speaks plaintext (no CA bundle set)."""
        pair = _pair(
            settings.tls_client_cert_file,
            settings.tls_client_key_file,
            "RAGMESH_TLS_CLIENT_CERT_FILE and RAGMESH_TLS_CLIENT_KEY_FILE",
        )
        if settings.service_auth == "mtls":
            if settings.tls_ca_file is None:
                raise TLSConfigError("RAGMESH_SERVICE_AUTH=mtls needs the mesh CA: RAGMESH_TLS_CA_FILE")
            # One certificate per service: the one it serves with is the one it calls with.
            pair = pair or _pair(
                settings.tls_cert_file,
                settings.tls_key_file,
                "RAGMESH_TLS_CERT_FILE and RAGMESH_TLS_KEY_FILE",
            )
        if settings.tls_ca_file is None:
            if pair is not None:
                raise TLSConfigError("a client certificate needs RAGMESH_TLS_CA_FILE (mTLS is TLS)")
            return None
        cert, key = pair if pair is not None else (None, None)
        return cls(settings.tls_ca_file, cert, key, settings.tls_server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        own = (
            (_read(self.key_file, "client TLS key"), _read(self.cert_file, "client TLS certificate"))
            if self.cert_file is not None and self.key_file is not None
            else (None, None)
        )
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "CA bundle"), private_key=own[0], certificate_chain=own[1]
        )

    def options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def own_identity(settings: MeshSettings) -> str | None:
    """The mesh identity named by this process's certificate (None when it names none)."""
    if settings.tls_cert_file is None:
        raise TLSConfigError(MESH_CERT_MISSING)
    try:
        return certificate_identity(_read(settings.tls_cert_file, "TLS certificate"))
    except ValueError as exc:
        if isinstance(exc, TLSConfigError):
            raise
        raise TLSConfigError(
            f"the TLS certificate {str(settings.tls_cert_file)!r} is not a PEM certificate"
        ) from None


def open_channel(
    target: str,
    options: Sequence[tuple[str, Any]] = (),
    tls: ClientTLS | None = None,
    interceptors: Sequence[aio.ClientInterceptor] | None = None,
) -> aio.Channel:
    """A channel to ``target``: TLS when ``tls`` is given, plaintext otherwise."""
    if tls is None:
        return aio.insecure_channel(target, options=list(options), interceptors=interceptors)
    return aio.secure_channel(
        target, tls.credentials(), options=[*options, *tls.options()], interceptors=interceptors
    )
