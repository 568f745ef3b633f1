"""A tiny guarded service for the key-reload tests: Embed needs an API key (read) and answers with
its worker's pid, so a test can tell which pre-fork worker accepted a key.

RAGMESH_WORKERS=2 RAGMESH_PORT=... RAGMESH_API_KEYS_FILE=... python libs/tests/prefork_guarded_service.py
"""

from __future__ import annotations

import os

from grpc import aio

from meshkit.rpc.auth import READ, Rule
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
        name="prefork-keys-test",
        grpc_services=["ragmesh.embedder.v1.EmbedderService"],
        register=lambda server: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(servicer, server),
        access={"Embed": Rule(READ)},
        multiprocess_safe=True,
    )
    run_service(spec, MeshSettings())


if __name__ == "__main__":
    main()
