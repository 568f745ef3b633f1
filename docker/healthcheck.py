"""Container health check: exit 0 when this container's server says it is serving, 1 otherwise.

    python /app/docker/healthcheck.py                  # gRPC health of "" (the whole server)
    python /app/docker/healthcheck.py ragmesh.embedder.v1.EmbedderService
    python /app/docker/healthcheck.py --http /health   # HTTP servers (the llama.cpp LLM server)

grpc_health_probe is not installable from PyPI, so the images carry this instead. It asks
127.0.0.1 on RAGMESH_PORT, the port every ragmesh process serves on; a short deadline keeps a
hung server from hanging the check.

With mesh TLS on (RAGMESH_TLS_CA_FILE set, as in Kubernetes where RAGMESH_SERVICE_AUTH=mtls), it
connects the way the mesh does: TLS verified against that CA, presenting the container's own
certificate (RAGMESH_TLS_CLIENT_CERT_FILE / _KEY_FILE). Kubelet's native gRPC probe can do
neither, so the manifests run this as an exec probe. The server certificate names the Service,
not 127.0.0.1, so the name checked is the first DNS name of the container's own server
certificate (RAGMESH_TLS_CERT_FILE, which is the certificate the server presents) unless
--server-name says otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT_S = 3.0


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value) if value else None


def own_dns_name(cert_file: Path) -> str:
    """The first DNS subject alternative name of a PEM certificate ('' when it has none)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ""
    names = san.get_values_for_type(x509.DNSName)
    return names[0] if names else ""


def channel_credentials(server_name: str) -> tuple[object | None, list[tuple[str, str]]]:
    """(credentials, options) for the health channel: (None, []) means plaintext."""
    import grpc

    ca = _env_path("RAGMESH_TLS_CA_FILE")
    if ca is None:
        return None, []
    cert = _env_path("RAGMESH_TLS_CLIENT_CERT_FILE")
    key = _env_path("RAGMESH_TLS_CLIENT_KEY_FILE")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key and cert else None,
        certificate_chain=cert.read_bytes() if key and cert else None,
    )
    if not server_name:
        server_cert = _env_path("RAGMESH_TLS_CERT_FILE")
        server_name = own_dns_name(server_cert) if server_cert else ""
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return credentials, options


def grpc_serving(port: int, service: str, server_name: str = "") -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        credentials, options = channel_credentials(server_name)
    except (OSError, ValueError) as exc:
        print(f"unhealthy: cannot load the TLS files: {exc}", file=sys.stderr)
        return False
    target = f"127.0.0.1:{port}"
    channel = (
        grpc.secure_channel(target, credentials, options)  # type: ignore[arg-type]
        if credentials is not None
        else grpc.insecure_channel(target)
    )
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S
            )
        except grpc.RpcError as exc:
            print(f"unhealthy: {exc.code().name}", file=sys.stderr)
            return False
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        print(f"unhealthy: {status}", file=sys.stderr)
        return False
    return True


def http_ok(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=TIMEOUT_S) as reply:
            return bool(200 <= reply.status < 300)
    except (urllib.error.URLError, OSError) as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("service", nargs="?", default="", help="gRPC service name ('' = the server)")
    parser.add_argument("--http", metavar="PATH", help="check HTTP GET PATH instead of gRPC health")
    parser.add_argument("--port", type=int, default=int(os.environ.get("RAGMESH_PORT", "50051")))
    parser.add_argument(
        "--server-name",
        default="",
        help="name the server certificate must carry (default: own first DNS SAN)",
    )
    args = parser.parse_args()
    if args.http:
        healthy = http_ok(args.port, args.http)
    else:
        healthy = grpc_serving(args.port, args.service, args.server_name)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
