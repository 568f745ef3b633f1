"""Server interceptor: request ids, deadlines, access logs, metrics and error mapping.

It wraps every handler so servicers only hold business logic: they raise ``ServiceError`` for
caller mistakes and let anything else become INTERNAL with the request id in the message.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc
from grpc import aio

from meshkit.errors import ServiceError
from meshkit.logs import REQUEST_ID_HEADER, new_request_id, request_id_var
from meshkit.metrics import RPC_IN_FLIGHT, RPC_LATENCY, RPC_REQUESTS

log = logging.getLogger("meshkit.rpc")

# Absolute monotonic deadline of the call being served, so outgoing calls can inherit it.
deadline_var: contextvars.ContextVar[float | None] = contextvars.ContextVar("deadline", default=None)

_QUIET_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _request_id_from(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER and value:
            text = value if isinstance(value, str) else value.decode("ascii", "replace")
            return text[:64]
    return new_request_id()


def _begin(context: aio.ServicerContext) -> tuple[contextvars.Token[str], contextvars.Token[float | None]]:
    rid = _request_id_from(context.invocation_metadata())
    remaining = context.time_remaining()
    deadline = time.monotonic() + remaining if remaining is not None else None
    return request_id_var.set(rid), deadline_var.set(deadline)


def _end(tokens: tuple[contextvars.Token[str], contextvars.Token[float | None]]) -> None:
    request_id_var.reset(tokens[0])
    deadline_var.reset(tokens[1])


class MeshServerInterceptor(aio.ServerInterceptor):
    def __init__(self, service: str) -> None:
        self.service = service

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_QUIET_METHODS):
            return handler
        short = method.rsplit("/", 1)[-1]
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, short),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                # grpc-stubs types stream handlers as sync iterators; under grpc.aio they are async.
                self._wrap_stream(cast(Callable[..., AsyncIterator[Any]], handler.unary_stream), short),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _finish(self, method: str, code: grpc.StatusCode, started: float, detail: str = "") -> None:
        elapsed = time.perf_counter() - started
        RPC_REQUESTS.labels(self.service, method, code.name).inc()
        RPC_LATENCY.labels(self.service, method).observe(elapsed)
        level = logging.INFO if code in (grpc.StatusCode.OK,) else logging.WARNING
        if code == grpc.StatusCode.INTERNAL:
            level = logging.ERROR
        log.log(
            level,
            "rpc",
            extra={"method": method, "code": code.name, "ms": round(elapsed * 1000, 2), "detail": detail},
        )

    async def _fail(
        self, context: aio.ServicerContext, method: str, exc: BaseException, started: float
    ) -> None:
        if isinstance(exc, ServiceError):
            self._finish(method, exc.code, started, exc.message)
            await context.abort(exc.code, exc.message)
        if isinstance(exc, NotImplementedError):
            # A generated servicer method nobody implemented: say so, not INTERNAL.
            self._finish(method, grpc.StatusCode.UNIMPLEMENTED, started, str(exc))
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented")
        if isinstance(exc, TimeoutError):
            self._finish(method, grpc.StatusCode.DEADLINE_EXCEEDED, started, str(exc))
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline exceeded in {method}")
        log.exception("unhandled error in %s", method)
        self._finish(method, grpc.StatusCode.INTERNAL, started, repr(exc))
        await context.abort(
            grpc.StatusCode.INTERNAL, f"internal error (request id {request_id_var.get()}): {exc!r}"[:500]
        )

    def _wrap_unary(
        self, behavior: Callable[..., Awaitable[Any]], method: str
    ) -> Callable[..., Awaitable[Any]]:
        async def wrapped(request: Any, context: aio.ServicerContext) -> Any:
            tokens = _begin(context)
            started = time.perf_counter()
            RPC_IN_FLIGHT.labels(self.service).inc()
            try:
                context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id_var.get()),))
                response = await behavior(request, context)
                self._finish(method, context.code() or grpc.StatusCode.OK, started)
                return response
            except aio.AbortError:
                raise
            except Exception as exc:
                await self._fail(context, method, exc, started)
            finally:
                RPC_IN_FLIGHT.labels(self.service).dec()
                _end(tokens)

        return wrapped

    def _wrap_stream(
        self, behavior: Callable[..., AsyncIterator[Any]], method: str
    ) -> Callable[..., AsyncIterator[Any]]:
        async def wrapped(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
            tokens = _begin(context)
            started = time.perf_counter()
            RPC_IN_FLIGHT.labels(self.service).inc()
            try:
                async for item in behavior(request, context):
                    yield item
                self._finish(method, grpc.StatusCode.OK, started)
            except aio.AbortError:
                raise
            except Exception as exc:
                await self._fail(context, method, exc, started)
            finally:
                RPC_IN_FLIGHT.labels(self.service).dec()
                _end(tokens)

        return wrapped
