from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from meshkit.rpc.server import start_service
from meshkit.settings import EmbedderSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from services.embedder.model import EmbeddingModel, TextKind
from services.embedder.servicer import build_spec

MAX_TEXTS = 8
MAX_CHARS = 5000


@pytest.fixture(scope="module")
async def channel(settings: EmbedderSettings, model: EmbeddingModel) -> AsyncIterator[aio.Channel]:
    limited = settings.model_copy(
        update={"port": 0, "embedder_max_request_texts": MAX_TEXTS, "embedder_max_text_chars": MAX_CHARS}
    )
    spec, _ = build_spec(limited, model)
    running = await start_service(spec, limited)
    async with aio.insecure_channel(f"127.0.0.1:{running.port}") as chan:
        yield chan
    await running.stop(1.0)


@pytest.fixture
def stub(channel: aio.Channel) -> embedder_pb2_grpc.EmbedderServiceStub:
    return embedder_pb2_grpc.EmbedderServiceStub(channel)


def texts_total() -> float:
    return REGISTRY.get_sample_value("ragmesh_embedder_texts_total") or 0.0


async def test_health_is_serving(channel: aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="ragmesh.embedder.v1.EmbedderService"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_embed_returns_vectors_in_order(
    stub: embedder_pb2_grpc.EmbedderServiceStub, model: EmbeddingModel
) -> None:
    texts = ["first text", "second, rather different text", "word " * 600]
    before = texts_total()
    reply = await stub.Embed(
        embedder_pb2.EmbedRequest(texts=texts, kind=embedder_pb2.TEXT_KIND_PASSAGE), timeout=10
    )
    assert texts_total() - before == len(texts)
    assert reply.model == "all-MiniLM-L6-v2-int8"
    assert reply.truncated == 1
    got = np.array([v.values for v in reply.vectors], dtype=np.float32)
    direct, _ = model.embed(texts, TextKind.PASSAGE)
    assert got.shape == (3, 384)
    np.testing.assert_allclose(got, direct, atol=1e-4)


async def test_unspecified_kind_means_passage(stub: embedder_pb2_grpc.EmbedderServiceStub) -> None:
    unspecified = await stub.Embed(embedder_pb2.EmbedRequest(texts=["same"]), timeout=10)
    passage = await stub.Embed(
        embedder_pb2.EmbedRequest(texts=["same"], kind=embedder_pb2.TEXT_KIND_PASSAGE), timeout=10
    )
    assert list(unspecified.vectors[0].values) == list(passage.vectors[0].values)


@pytest.mark.parametrize(
    ("request_", "code", "fragment"),
    [
        (embedder_pb2.EmbedRequest(texts=[]), grpc.StatusCode.INVALID_ARGUMENT, "at least one"),
        (
            embedder_pb2.EmbedRequest(texts=["ok", "  "]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "texts[1] is empty",
        ),
        (
            embedder_pb2.EmbedRequest(texts=["x"] * (MAX_TEXTS + 1)),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "limit",
        ),
        (
            embedder_pb2.EmbedRequest(texts=["y" * (MAX_CHARS + 1)]),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "texts[0]",
        ),
        (embedder_pb2.EmbedRequest(texts=["ok"], kind=7), grpc.StatusCode.INVALID_ARGUMENT, "unknown kind"),
    ],
)
async def test_bad_requests_are_rejected(
    stub: embedder_pb2_grpc.EmbedderServiceStub,
    request_: embedder_pb2.EmbedRequest,
    code: grpc.StatusCode,
    fragment: str,
) -> None:
    with pytest.raises(aio.AioRpcError) as err:
        await stub.Embed(request_, timeout=10)
    assert err.value.code() == code
    assert fragment in (err.value.details() or "")


async def test_model_info(stub: embedder_pb2_grpc.EmbedderServiceStub) -> None:
    info = await stub.GetModelInfo(embedder_pb2.GetModelInfoRequest(), timeout=10)
    assert info.dimension == 384
    assert info.max_tokens == 256
    assert info.provider == "CPUExecutionProvider"
    assert info.model == "all-MiniLM-L6-v2-int8"
    assert info.max_batch == MAX_TEXTS
