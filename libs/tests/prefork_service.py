"""A tiny stateless service for the pre-fork tests: Embed answers with its worker's pid.

RAGMESH_WORKERS=2 RAGMESH_PORT=... python libs/tests/prefork_service.py
"""

from __future__ import annotations

import os

from grpc import aio

from meshkit.rpc.server import ServiceSpec, run_service
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc


class PidEmbedder(embedder_pb2_grpc.EmbedderServiceServicer):
    async def Embed(
        self, request: embedder_pb2.EmbedRequest, context: aio.ServicerContext
    ) -> embedder_pb2.EmbedResponse:
        return embedder_pb2.EmbedResponse(model=str(os.getpid()))


def main() -> None:
    servicer = PidEmbedder()
    spec = ServiceSpec(
        name="prefork-test",
        grpc_services=["ragmesh.embedder.v1.EmbedderService"],
        register=lambda server: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(servicer, server),
        multiprocess_safe=True,
    )
    run_service(spec, MeshSettings())


if __name__ == "__main__":
    main()
