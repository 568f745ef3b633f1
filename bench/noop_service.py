"""A gRPC server that answers every unary method at once, for measuring the load driver's ceiling.

    .venv/bin/python -m bench.noop_service --port 0     # prints "PORT <n>", serves until SIGTERM

grpc.health.v1.Health/Check answers SERVING; any other method answers an empty message, which is
a valid (all-default) response of every contract, so ``ragmesh loadtest reranker --address ...``
against it measures the driver with the reranker's real request sizes. It runs in its own process
so the driver and the server do not share a GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2

from meshkit.rpc.client import channel_options

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SERVING = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING).SerializeToString()


async def _serving(request: bytes, context: aio.ServicerContext) -> bytes:
    return SERVING


async def _empty(request: bytes, context: aio.ServicerContext) -> bytes:
    return b""


class NoopHandler(grpc.GenericRpcHandler):
    """Every method, unparsed bytes in and out (no serialisers): the server does nothing."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = getattr(handler_call_details, "method", "")
        return grpc.unary_unary_rpc_method_handler(_serving if method == HEALTH_CHECK else _empty)


async def serve(host: str, port: int) -> None:
    server = aio.server(options=channel_options())
    server.add_generic_rpc_handlers((NoopHandler(),))
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"PORT {bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))
    sys.exit(0)


if __name__ == "__main__":
    main()
