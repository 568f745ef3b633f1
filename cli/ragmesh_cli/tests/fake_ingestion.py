"""A fake IngestionService for the CLI's unit tests, served in-process: an object with some of
the service's methods (``async def IngestDocuments(self, request, **_)`` and the like, taking
and returning contract messages) answers those; ``serve`` gives the ragmesh_client that
``ragmesh ingest`` builds (``channels.ingestion_client``) pointed at it (a servicer subclass,
whose methods get the context, is served as it is)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from grpc import aio

from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh_cli.channels import ingestion_client
from ragmesh_client import AsyncClient

_METHODS = ingestion_pb2.DESCRIPTOR.services_by_name["IngestionService"].methods_by_name


def _forward(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def handle(self: Any, request: Any, context: aio.ServicerContext) -> Any:
        return await method(request, timeout=context.time_remaining())

    return handle


def servicer(fake: object) -> ingestion_pb2_grpc.IngestionServiceServicer:
    """A servicer answering with ``fake``'s methods (the others: UNIMPLEMENTED)."""
    handlers = {name: _forward(getattr(fake, name)) for name in _METHODS if hasattr(fake, name)}
    return type("FakeIngestion", (ingestion_pb2_grpc.IngestionServiceServicer,), handlers)()


@contextlib.asynccontextmanager
async def serve(fake: object) -> AsyncIterator[AsyncClient]:
    server = aio.server()
    # A servicer of its own (methods taking the context, to abort with a status) serves as is.
    own = isinstance(fake, ingestion_pb2_grpc.IngestionServiceServicer)
    ingestion_pb2_grpc.add_IngestionServiceServicer_to_server(fake if own else servicer(fake), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = ingestion_client(f"127.0.0.1:{port}", key="")
    try:
        yield client
    finally:
        await client.close()
        await server.stop(None)
