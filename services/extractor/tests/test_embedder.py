from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import numpy as np
import pytest
from grpc import aio

from meshkit.rpc.server import RunningService, ServiceSpec, start_service
from meshkit.settings import MeshSettings
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from services.extractor.embedder import CHUNK_TEXTS, EmbedderClient
from services.extractor.extractive import EmbedError
from services.extractor.tests.conftest import bag_of_words, make_settings


class FakeEmbedderService(embedder_pb2_grpc.EmbedderServiceServicer):
    def __init__(self) -> None:
        self.requests: list[embedder_pb2.EmbedRequest] = []
        self.drop_one = False

    async def Embed(
        self, request: embedder_pb2.EmbedRequest, context: aio.ServicerContext
    ) -> embedder_pb2.EmbedResponse:
        self.requests.append(request)
        texts = list(request.texts)[: -1 if self.drop_one else None]
        vectors = [common_pb2.Vector(values=bag_of_words(t).tolist()) for t in texts]
        return embedder_pb2.EmbedResponse(vectors=vectors, model="bag")


@pytest.fixture
async def embedder() -> AsyncIterator[tuple[FakeEmbedderService, RunningService]]:
    fake = FakeEmbedderService()

    def register(server: aio.Server) -> None:
        embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(fake, server)

    spec = ServiceSpec(
        name="fake-embedder", grpc_services=["ragmesh.embedder.v1.EmbedderService"], register=register
    )
    running = await start_service(spec, MeshSettings(port=0, log_format="text"))
    yield fake, running
    await running.stop(0)


async def test_large_inputs_are_split_into_calls_and_rejoined(
    embedder: tuple[FakeEmbedderService, RunningService],
) -> None:
    fake, running = embedder
    client = EmbedderClient(make_settings(embedder_address=f"127.0.0.1:{running.port}"))
    await client.start()
    try:
        texts = [f"word{i} tower" for i in range(CHUNK_TEXTS * 2 + 5)]
        rows = await client(texts, embedder_pb2.TEXT_KIND_PASSAGE)
    finally:
        await client.close()
    assert rows.shape[0] == len(texts)
    assert sorted(len(r.texts) for r in fake.requests) == [5, CHUNK_TEXTS, CHUNK_TEXTS]
    assert all(r.kind == embedder_pb2.TEXT_KIND_PASSAGE for r in fake.requests)
    np.testing.assert_allclose(rows[7], bag_of_words(texts[7]), atol=1e-6)


async def test_a_short_reply_is_an_embed_error(embedder: tuple[FakeEmbedderService, RunningService]) -> None:
    fake, running = embedder
    fake.drop_one = True
    client = EmbedderClient(make_settings(embedder_address=f"127.0.0.1:{running.port}"))
    await client.start()
    try:
        with pytest.raises(EmbedError, match="vectors"):
            await client(["a", "b"], embedder_pb2.TEXT_KIND_QUERY)
    finally:
        await client.close()


async def test_unreachable_embedder_is_an_embed_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = make_settings(
        embedder_address=f"127.0.0.1:{port}", client_timeout_s=1.0, client_retry_attempts=1
    )
    client = EmbedderClient(settings)
    await client.start()
    try:
        with pytest.raises(EmbedError, match="embedder"):
            await client(["a"], embedder_pb2.TEXT_KIND_QUERY)
    finally:
        await client.close()
