"""Container HEALTHCHECK: exit 0 when this container's server says it is serving, 1 otherwise.

    python /app/docker/healthcheck.py                  # gRPC health of "" (the whole server)
    python /app/docker/healthcheck.py ragmesh.embedder.v1.EmbedderService
    python /app/docker/healthcheck.py --http /health   # HTTP servers (the llama.cpp LLM server)

grpc_health_probe is not installable from PyPI, so the images carry this instead. It asks
127.0.0.1 on RAGMESH_PORT, the port every ragmesh process serves on; a short deadline keeps a
hung server from hanging the check.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 3.0


def grpc_serving(port: int, service: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
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
            return 200 <= reply.status < 300
    except (urllib.error.URLError, OSError) as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("service", nargs="?", default="", help="gRPC service name ('' = the server)")
    parser.add_argument("--http", metavar="PATH", help="check HTTP GET PATH instead of gRPC health")
    parser.add_argument("--port", type=int, default=int(os.environ.get("RAGMESH_PORT", "50051")))
    args = parser.parse_args()
    healthy = http_ok(args.port, args.http) if args.http else grpc_serving(args.port, args.service)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
