"""Server interceptor: request ids, deadlines, access logs, metrics and error mapping.

It wraps every handler so servicers only hold business logic: they raise ``ServiceError`` for
caller mistakes and let anything else become INTERNAL, whose message to the caller is generic
and carries only the request id (the exception goes to the log, under that id). A service with
an ``IdentityGuard`` (meshkit.rpc.identity: mesh identities, internal services) or a ``Guard``
(meshkit.rpc.auth: API keys, public services) has every call but health and reflection checked
before the handler runs.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc
from grpc import aio

from meshkit.core.errors import ServiceError, invalid_argument
from meshkit.core.logs import (
    REQUEST_ID_HEADER,
    api_key_name_var,
    caller_identity_var,
    new_request_id,
    request_id_var,
)
from meshkit.rpc import tracing
from meshkit.rpc.auth import Guard, principal_var
from meshkit.rpc.decoding import Undecodable, decoding_checked, log_undecodable, safe_deserializer
from meshkit.rpc.identity import IdentityGuard
from meshkit.rpc.metrics import RPC_IN_FLIGHT, RPC_LATENCY, RPC_REQUESTS

log = logging.getLogger("meshkit.rpc")

# Absolute monotonic deadline of the call being served, so outgoing calls can inherit it.
deadline_var: contextvars.ContextVar[float | None] = contextvars.ContextVar("deadline", default=None)

# The longest deadline a call is served under; a caller's longer one is cut to it. grpc-timeout
# carries up to 99999999 hours, but grpc's Python client turns an outgoing deadline into int64
# nanoseconds since the epoch, which overflow past the year 2262: a downstream call given the
# rest of such a deadline expires at once (DEADLINE_EXCEEDED, nothing sent). No call of the mesh
# comes near a day.
MAX_DEADLINE_S = 24 * 3600.0


def clamp_deadline(seconds: float | None) -> float | None:
    """Seconds of a deadline, at most MAX_DEADLINE_S (None, no deadline, stays None)."""
    return None if seconds is None else min(seconds, MAX_DEADLINE_S)


_QUIET_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _request_id_from(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER and value:
            text = value if isinstance(value, str) else value.decode("ascii", "replace")
            return text[:64]
    return new_request_id()


@dataclass(frozen=True)
class _CallTokens:
    request_id: contextvars.Token[str]
    deadline: contextvars.Token[float | None]
    api_key_name: contextvars.Token[str]
    principal: contextvars.Token[Any]
    identity: contextvars.Token[str]
    # The call's span (None with tracing off), current while the handler runs.
    trace: tracing.Incoming | None = None


def _begin(context: aio.ServicerContext, service: str = "", method: str = "") -> _CallTokens:
    metadata = context.invocation_metadata()
    rid = _request_id_from(metadata)
    remaining = clamp_deadline(context.time_remaining())
    deadline = time.monotonic() + remaining if remaining is not None else None
    # The caller is set by the guards; blank until then, and reset with the rest after the call.
    return _CallTokens(
        request_id_var.set(rid),
        deadline_var.set(deadline),
        api_key_name_var.set(""),
        principal_var.set(None),
        caller_identity_var.set(""),
        tracing.start_server_span(service, method, metadata),
    )


def _end(tokens: _CallTokens) -> None:
    tracing.finish(tokens.trace)
    request_id_var.reset(tokens.request_id)
    deadline_var.reset(tokens.deadline)
    api_key_name_var.reset(tokens.api_key_name)
    principal_var.reset(tokens.principal)
    caller_identity_var.reset(tokens.identity)


INTERNAL_MESSAGE = "internal error (request id {rid}); the service logged the details under this id"


class MeshServerInterceptor(aio.ServerInterceptor):
    def __init__(
        self, service: str, guard: Guard | None = None, identity: IdentityGuard | None = None
    ) -> None:
        self.service = service
        self.guard = guard
        self.identity = identity

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:
            return handler
        short = method.rsplit("/", 1)[-1]
        if method.startswith(_QUIET_METHODS):
            return decoding_checked(handler, short)
        # grpc decodes the request before the handler runs, and answers a decoding error with
        # UNKNOWN and the exception's class: the wrapped deserializer hands the handler a marker.
        deserializer = safe_deserializer(handler.request_deserializer, short)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, short),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                # grpc-stubs types stream handlers as sync iterators; under grpc.aio they are async.
                self._wrap_stream(cast(Callable[..., AsyncIterator[Any]], handler.unary_stream), short),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if self.guard is not None or self.identity is not None:
            # The checks run in the wrapper around a unary request; no method of the mesh streams
            # its request, and one that did is refused rather than served unchecked.
            return _refused(handler, short)
        return decoding_checked(handler, short)

    def _authorise(self, method: str, request: Any, context: aio.ServicerContext) -> None:
        if self.identity is not None:
            caller_identity_var.set(self.identity.check(method, context.auth_context()))
        if self.guard is None:
            return
        key = self.guard.check(method, request, context.invocation_metadata())
        principal_var.set(key)
        api_key_name_var.set(key.name)

    @staticmethod
    def _refuse_undecodable(method: str, request: Any) -> None:
        """INVALID_ARGUMENT for a request that did not decode (see meshkit.rpc.decoding), before the
        caller checks: like an oversized message, it is refused before anything reads it."""
        if isinstance(request, Undecodable):
            log_undecodable(method, request)
            raise invalid_argument(request.caller_message)

    def _finish(self, method: str, code: grpc.StatusCode, started: float, detail: str = "") -> None:
        elapsed = time.perf_counter() - started
        RPC_REQUESTS.labels(self.service, method, code.name).inc()
        RPC_LATENCY.labels(self.service, method).observe(elapsed)
        tracing.record_rpc_code(code)
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
        # The exception and its traceback go to the log (tagged with the request id); the caller
        # learns only that it failed and the id to quote, never the service's internals.
        log.exception("unhandled error in %s", method)
        self._finish(method, grpc.StatusCode.INTERNAL, started, repr(exc))
        await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE.format(rid=request_id_var.get()))

    def _wrap_unary(
        self, behavior: Callable[..., Awaitable[Any]], method: str
    ) -> Callable[..., Awaitable[Any]]:
        async def wrapped(request: Any, context: aio.ServicerContext) -> Any:
            tokens = _begin(context, self.service, method)
            started = time.perf_counter()
            RPC_IN_FLIGHT.labels(self.service).inc()
            try:
                context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id_var.get()),))
                self._refuse_undecodable(method, request)
                self._authorise(method, request, context)
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
            tokens = _begin(context, self.service, method)
            started = time.perf_counter()
            RPC_IN_FLIGHT.labels(self.service).inc()
            try:
                context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id_var.get()),))
                self._refuse_undecodable(method, request)
                self._authorise(method, request, context)
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


def _refused(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    async def refuse(request_iterator: Any, context: aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, f"{method}: streamed requests are not served with auth on"
        )

    factory = (
        grpc.stream_stream_rpc_method_handler
        if handler.stream_stream
        else grpc.stream_unary_rpc_method_handler
    )
    return factory(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
