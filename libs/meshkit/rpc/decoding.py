"""Requests that do not decode: INVALID_ARGUMENT in our words, never grpc's UNKNOWN.

grpc's Python server runs a method's ``request_deserializer`` before any code of the handler,
and answers an exception there with UNKNOWN and ``Unexpected <class '...DecodeError'>: ...``:
a Python class name and the parser's text, for something that is only the caller's mistake.
``safe_deserializer`` wraps a deserializer so that it returns an ``Undecodable`` marker instead
of raising; the server interceptor (meshkit.rpc.interceptors) answers the marker with
INVALID_ARGUMENT and logs the parser's text under the request id. ``decoding_checked`` gives
handlers the interceptor does not otherwise wrap (health, reflection) the same answer.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from grpc import aio

log = logging.getLogger("meshkit.rpc")

Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True)
class Undecodable:
    """What a wrapped deserializer returns for bytes that are no valid request."""

    # The request message's name ("SearchRequest"), for the caller.
    message_type: str
    # What is wrong, in our words.
    problem: str
    # The parser's exception, for the log only.
    detail: str

    @property
    def caller_message(self) -> str:
        return f"the request is not a valid {self.message_type} message: {self.problem}"


def decode_problem(exc: BaseException) -> str:
    """What is wrong with bytes a parser refused, in our words: protobuf's text names its own
    internals (``Exceeded upb_DecodeOptions_MaxDepth``) and the message's full type."""
    text = str(exc).lower()
    if isinstance(exc, UnicodeDecodeError) or "utf-8" in text or "utf8" in text:
        return "a string field holds invalid UTF-8"
    if isinstance(exc, RecursionError) or "depth" in text or "recursion" in text:
        return "the message is nested too deeply"
    return "the message is malformed"


def message_type_of(deserializer: Deserializer, method: str) -> str:
    """The message name behind a generated deserializer (``SearchRequest.FromString``), or the
    method's name when it is some other callable."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    name = getattr(descriptor, "name", None)
    return name if isinstance(name, str) and name else f"{method} request"


def safe_deserializer(deserializer: Deserializer | None, method: str) -> Deserializer | None:
    """``deserializer``, returning an ``Undecodable`` where it would raise (None stays None:
    such a handler takes raw bytes)."""
    if deserializer is None:
        return None
    message_type = message_type_of(deserializer, method)

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # whatever the parser raises, the bytes are at fault
            return Undecodable(message_type, decode_problem(exc), f"{type(exc).__name__}: {exc}")

    return deserialize


def log_undecodable(method: str, request: Undecodable) -> None:
    # The request id comes with the logging context (meshkit.core.logs).
    log.warning(
        "undecodable request",
        extra={"method": method, "message_type": request.message_type, "detail": request.detail},
    )


async def abort_undecodable(context: aio.ServicerContext, method: str, request: Undecodable) -> NoReturn:
    log_undecodable(method, request)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.caller_message)
    raise AssertionError("unreachable")  # pragma: no cover: abort raises


# --- handlers outside the access log (health, reflection) -----------------------------------

Prepare = Callable[[Any, aio.ServicerContext], Awaitable[Any]]


def decoding_checked(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """``handler`` with its undecodable requests answered INVALID_ARGUMENT, and nothing else
    changed (no access log, no metrics). A synchronous handler is returned as it is: wrapping
    it in a coroutine would run it on the event loop instead of grpc's thread pool."""
    behavior = _behavior_of(handler)
    if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
        return handler
    deserializer = safe_deserializer(handler.request_deserializer, method)
    serializer = handler.response_serializer
    if handler.request_streaming:
        checked = _checked(behavior, _checked_stream(method))
        factory = (
            grpc.stream_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.stream_unary_rpc_method_handler
        )
    else:
        checked = _checked(behavior, _checked_unary(method))
        factory = (
            grpc.unary_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.unary_unary_rpc_method_handler
        )
    return factory(checked, request_deserializer=deserializer, response_serializer=serializer)


def _behavior_of(handler: grpc.RpcMethodHandler) -> Any:
    return handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream


def _checked(behavior: Any, prepare: Prepare) -> Any:
    """A behaviour of the same kind as ``behavior`` (grpc.aio tells an async generator from a
    coroutine that writes through the context), whose input goes through ``prepare`` first."""
    if inspect.isasyncgenfunction(behavior):

        async def streamed(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in behavior(await prepare(request, context), context):
                yield item

        return streamed

    async def awaited(request: Any, context: aio.ServicerContext) -> Any:
        return await behavior(await prepare(request, context), context)

    return awaited


def _checked_unary(method: str) -> Prepare:
    async def prepare(request: Any, context: aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await abort_undecodable(context, method, request)
        return request

    return prepare


def _checked_stream(method: str) -> Prepare:
    async def prepare(requests: Any, context: aio.ServicerContext) -> Any:
        return checked_requests(requests, context, method)

    return prepare


async def checked_requests(
    requests: AsyncIterator[Any], context: aio.ServicerContext, method: str
) -> AsyncIterator[Any]:
    """The messages of a streamed request; the first undecodable one ends the call."""
    async for request in requests:
        if isinstance(request, Undecodable):
            await abort_undecodable(context, method, request)
        yield request


class DecodingInterceptor(aio.ServerInterceptor):
    """``decoding_checked`` for every handler of a server without the mesh interceptor (the
    plaintext health-only port)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return decoding_checked(handler, handler_call_details.method.rsplit("/", 1)[-1])
