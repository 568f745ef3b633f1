"""The asyncio client: the same methods as ``Client`` (``_operations.py``), each step awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, TypeVar

import grpc
from grpc import aio

from ragmesh_client._calls import Call
from ragmesh_client._operations import Operations
from ragmesh_client._steps import Awaiting, Emit, Items, Sleep, Step, Stepper, Steps, Stream
from ragmesh_client.config import ClientConfig, new_request_id
from ragmesh_client.errors import from_rpc_error

T = TypeVar("T")
Y = TypeVar("Y")


class AsyncClient(Operations, Awaiting):
    """An asyncio client of the gateway and the ingestion API (see ``Client`` for the options).
    Its channels open on first use, in the running event loop; ``await close()`` (or
    ``async with``) releases them."""

    def __init__(self, gateway: str | None = None, **kwargs: Any) -> None:
        super().__init__(gateway, **kwargs)
        self._channels: dict[str, aio.Channel] = {}

    @classmethod
    def from_env(cls, **overrides: Any) -> AsyncClient:
        return cls(config=ClientConfig.from_env(**overrides))

    def _channel(self, service: str) -> aio.Channel:
        if service not in self._channels:
            target, options = self._target(service), self.config.channel_options()
            credentials = self._credentials()
            self._channels[service] = (
                aio.insecure_channel(target, options=options)
                if credentials is None
                else aio.secure_channel(target, credentials, options=options)
            )
        return self._channels[service]

    # ------------------------------------------------------------------ running the steps

    async def _run(self, call: Call[T]) -> T:
        request_id = new_request_id()
        method = getattr(self._stub(call.service, self._channel(call.service)), call.method)
        try:
            reply = await method(
                call.request, timeout=call.timeout, metadata=self.config.metadata(request_id)
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, request_id) from None
        return call.read(reply, request_id)

    async def _stream(self, call: Call[Y | None]) -> AsyncIterator[Y]:
        request_id = new_request_id()
        method = getattr(self._stub(call.service, self._channel(call.service)), call.method)
        try:
            async for message in method(
                call.request, timeout=call.timeout, metadata=self.config.metadata(request_id)
            ):
                item = call.read(message, request_id)
                if item is not None:
                    yield item
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, request_id) from None

    async def _step(self, step: Step) -> Any:
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        return await self._run(step)

    async def _complete(self, steps: Steps[T]) -> T:
        walk = Stepper(steps)
        while (step := walk.next()) is not None:
            try:
                walk.reply(await self._step(step))
            except Exception as exc:
                walk.fail(exc)
        return walk.result

    async def _iterate(self, items: Items[Y]) -> AsyncIterator[Y]:
        walk = Stepper(items)
        try:
            while (step := walk.next()) is not None:
                if isinstance(step, Emit):
                    yield step.item
                    continue
                try:
                    if isinstance(step, Stream):
                        async for item in self._stream(step.call):
                            yield item
                    else:
                        walk.reply(await self._step(step))
                except Exception as exc:
                    walk.fail(exc)
        finally:
            walk.close()

    # ------------------------------------------------------------------ lifecycle

    async def close(self, grace: float | None = None) -> None:
        """Close the channels; calls in flight get ``grace`` seconds to finish (None: cancelled)."""
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close(grace)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
