"""Real gRPC servers on 127.0.0.1:0 for meshkit tests, serving a scriptable fake of the
embedder contract: the platform code under test (interceptor, bootstrap, client) is real."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from grpc import aio

from meshkit.core.logs import current_request_id
from meshkit.rpc.auth import Rule
from meshkit.rpc.identity import Callers
from meshkit.rpc.interceptors import deadline_var
from meshkit.rpc.server import RunningService, ServiceSpec, start_service
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc

EMBEDDER_SERVICE = "ragmesh.embedder.v1.EmbedderService"

Behavior = Callable[[embedder_pb2.EmbedRequest, aio.ServicerContext], Awaitable[embedder_pb2.EmbedResponse]]

_names = itertools.count()


@dataclass
class Seen:
    """What one handler invocation observed of its call context."""

    request_id: str
    deadline: float | None
    time_remaining: float | None


@dataclass
class FakeEmbedder(embedder_pb2_grpc.EmbedderServiceServicer):
    """Echoes the texts back in ``model`` unless a test installs a ``behavior``; counts calls
    so tests can tell whether a request reached the server at all."""

    behavior: Behavior | None = None
    seen: list[Seen] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return len(self.seen)

    async def Embed(
        self, request: embedder_pb2.EmbedRequest, context: aio.ServicerContext
    ) -> embedder_pb2.EmbedResponse:
        self.seen.append(Seen(current_request_id(), deadline_var.get(), context.time_remaining()))
        if self.behavior is not None:
            return await self.behavior(request, context)
        return embedder_pb2.EmbedResponse(model="|".join(request.texts))


@dataclass
class Served:
    name: str
    fake: FakeEmbedder
    running: RunningService

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.running.port}"


StartFake = Callable[..., Awaitable[Served]]


def unique_name(prefix: str) -> str:
    """Metric labels are process-global: a fresh name keeps each test's counters its own."""
    return f"{prefix}-{next(_names)}"


@pytest.fixture
async def start_fake() -> AsyncIterator[StartFake]:
    started: list[Served] = []

    async def start(
        fake: FakeEmbedder | None = None,
        extra: Callable[[aio.Server], None] | None = None,
        *,
        name: str | None = None,
        callers: Callers | None = None,
        access: Mapping[str, Rule] | None = None,
        max_concurrent_rpcs: int = 256,
        max_concurrent_rpcs_setting: int = 0,
        max_request_bytes: int = 0,
        **settings: Any,
    ) -> Served:
        fake = fake or FakeEmbedder()
        name = name or unique_name("fake")

        def register(server: aio.Server) -> None:
            embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(fake, server)
            if extra is not None:
                extra(server)

        spec = ServiceSpec(
            name=name,
            grpc_services=[EMBEDDER_SERVICE],
            register=register,
            callers=callers or {},
            access=access or {},
            max_concurrent_rpcs=max_concurrent_rpcs,
            max_request_bytes=max_request_bytes,
        )
        mesh = MeshSettings(
            host="127.0.0.1", port=0, max_concurrent_rpcs=max_concurrent_rpcs_setting, **settings
        )
        running = await start_service(spec, mesh)
        served = Served(name, fake, running)
        started.append(served)
        return served

    yield start
    for served in started:
        with contextlib.suppress(Exception):
            await served.running.stop(0)
