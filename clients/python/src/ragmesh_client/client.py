"""The synchronous client: the methods of ``_operations.py``, each step run blocking."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, TypeVar

import grpc

from ragmesh_client._calls import GATEWAY, INGESTION, Call
from ragmesh_client._operations import Operations
from ragmesh_client._steps import Blocking, Emit, Items, Sleep, Step, Stepper, Steps, Stream
from ragmesh_client.config import ClientConfig, new_request_id
from ragmesh_client.errors import from_rpc_error

T = TypeVar("T")
Y = TypeVar("Y")


class Client(Operations, Blocking):
    """A blocking client of the gateway (search, ask) and the ingestion API (ingest, status,
    delete, dead letters). Thread-safe; close it (or use ``with``) to release its channels.

    Search and ask options (keywords): top_k, doc_ids, collapse_documents, filter ({key: value}
    or {key: [values]}), history ([(role, text)]), rerank, strategy (precise|exhaustive),
    weights ({leg: weight}), rrf_k, pool_size, rerank_candidates; ask also passages, mode
    (llm|extractive), hyde (off|fusion|supplement), include_facts. ``request=`` sends a contract
    message as is instead.
    """

    def __init__(self, gateway: str | None = None, **kwargs: Any) -> None:
        super().__init__(gateway, **kwargs)
        # Both channels now (they connect on first use), so threads never race to create one.
        self._channels: dict[str, grpc.Channel] = {
            service: self._open(service) for service in (GATEWAY, INGESTION)
        }

    @classmethod
    def from_env(cls, **overrides: Any) -> Client:
        """Configured like the ragmesh CLI (RAGMESH_GATEWAY_ADDRESS, RAGMESH_API_KEY, ...)."""
        return cls(config=ClientConfig.from_env(**overrides))

    def _open(self, service: str) -> grpc.Channel:
        target, options = self._target(service), self.config.channel_options()
        credentials = self._credentials()
        if credentials is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, credentials, options=options)

    def _channel(self, service: str) -> grpc.Channel:
        if not self._channels:
            raise RuntimeError("the client is closed")
        return self._channels[service]

    # ------------------------------------------------------------------ running the steps

    def _run(self, call: Call[T]) -> T:
        request_id = new_request_id()
        method = getattr(self._stub(call.service, self._channel(call.service)), call.method)
        try:
            reply = method(call.request, timeout=call.timeout, metadata=self.config.metadata(request_id))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, request_id) from None
        return call.read(reply, request_id)

    def _stream(self, call: Call[Y | None]) -> Iterator[Y]:
        request_id = new_request_id()
        method = getattr(self._stub(call.service, self._channel(call.service)), call.method)
        try:
            for message in method(
                call.request, timeout=call.timeout, metadata=self.config.metadata(request_id)
            ):
                item = call.read(message, request_id)
                if item is not None:
                    yield item
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, request_id) from None

    def _step(self, step: Step) -> Any:
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        return self._run(step)

    def _complete(self, steps: Steps[T]) -> T:
        walk = Stepper(steps)
        while (step := walk.next()) is not None:
            try:
                walk.reply(self._step(step))
            except Exception as exc:
                walk.fail(exc)
        return walk.result

    def _iterate(self, items: Items[Y]) -> Iterator[Y]:
        walk = Stepper(items)
        try:
            while (step := walk.next()) is not None:
                if isinstance(step, Emit):
                    yield step.item
                    continue
                try:
                    if isinstance(step, Stream):
                        yield from self._stream(step.call)
                    else:
                        walk.reply(self._step(step))
                except Exception as exc:
                    walk.fail(exc)
        finally:
            walk.close()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
