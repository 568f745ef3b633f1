"""The default backend of the LLM tier (meshkit.llm.factory): any OpenAI-compatible server (vLLM,
llama.cpp server, Ollama) over ``/chat/completions``, with the same guards as gRPC downstreams
(see client.py): a deadline that caps every attempt, retries when they are safe (tenacity) and a
circuit breaker per client (pybreaker).

    llm = OpenAICompatibleLLM(LLMSettings())
    text = await llm.chat([{"role": "user", "content": "Hi"}])
    plan = await llm.structured(messages, Plan)          # a validated pydantic model
    async for delta in llm.stream(messages): ...

Failures surface as ``LLMError`` with a typed reason (unavailable, deadline, breaker_open,
error, invalid_output), which callers turn into a degradation (skip the LLM stage).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import httpx
import pybreaker
from prometheus_client import Counter, Histogram
from pydantic import BaseModel
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_any,
    stop_before_delay,
    wait_exponential_jitter,
)

from meshkit.llm.common import LLMError, Messages, ModelT
from meshkit.llm.replies import parse_structured
from meshkit.rpc import tracing
from meshkit.rpc.client import BreakerMetrics, remaining_budget
from meshkit.settings import LLMSettings

log = logging.getLogger("meshkit.llm.factory")

T = TypeVar("T")

CHAT_PATH = "chat/completions"
# Statuses that say "busy or restarting, try again"; any other 4xx is our request's fault.
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
# How much of a bad reply an error keeps: enough to debug, not a whole completion in the logs.
MAX_ERROR_BODY_CHARS = 2000

REQUESTS = Counter("ragmesh_llm_requests", "LLM calls by outcome (ok or the error reason).", ["outcome"])
REQUEST_SECONDS = Histogram(
    "ragmesh_llm_request_seconds",
    "Duration of one LLM call, retries (and for streams the whole stream) included.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
)
TOKENS = Counter("ragmesh_llm_tokens", "Tokens the LLM server reported using.", ["kind"])


class _StatusError(Exception):
    """A non-2xx answer, kept apart from LLMError so tenacity and the breaker can judge it."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body

    @property
    def server_unwell(self) -> bool:
        return self.status in RETRYABLE_STATUSES or self.status >= 500


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, _StatusError):
        return exc.status in RETRYABLE_STATUSES
    return isinstance(exc, httpx.ConnectError | httpx.TimeoutException)


def _is_health_neutral(exc: BaseException) -> bool:
    # A refused request (400, 401, 422...) or a caller giving up says nothing of the server's health.
    return isinstance(exc, asyncio.CancelledError) or (
        isinstance(exc, _StatusError) and not exc.server_unwell
    )


def _as_llm_error(exc: BaseException) -> LLMError:
    """The LLMError for a failed call. Its message reaches callers (as a degradation or fallback
    reason), so it says what kind of failure it was and no more; the server's answer and the
    client's exception go to the log."""
    if isinstance(exc, LLMError):
        return exc
    if isinstance(exc, pybreaker.CircuitBreakerError):
        return LLMError("breaker_open", "circuit breaker open")
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return LLMError("deadline", f"no answer before the deadline ({type(exc).__name__})")
    if isinstance(exc, httpx.TransportError):
        log.warning("llm server unreachable", extra={"error": repr(exc)})
        return LLMError("unavailable", f"cannot reach the LLM server ({type(exc).__name__})")
    if isinstance(exc, _StatusError):
        log.warning("llm server refused the call", extra={"status": exc.status, "body": exc.body})
        reason = "unavailable" if exc.status in RETRYABLE_STATUSES else "error"
        return LLMError(reason, f"HTTP {exc.status} from the LLM server", status=exc.status)
    log.warning("unexpected llm client error", exc_info=exc)
    return LLMError("error", f"unexpected {type(exc).__name__} in the LLM client")


class OpenAICompatibleLLM:
    """A guarded async client for one OpenAI-compatible server."""

    def __init__(
        self,
        settings: LLMSettings,
        *,
        target: str = "llm",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.target = target
        headers = {"Authorization": f"Bearer {settings.llm_api_key}"} if settings.llm_api_key else {}
        self._http = httpx.AsyncClient(
            # httpx joins relative paths onto the base only when it ends with a slash.
            base_url=settings.llm_base_url.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(settings.llm_timeout_s),
            transport=transport,
        )
        self.breaker = pybreaker.CircuitBreaker(
            fail_max=settings.llm_breaker_fail_max,
            reset_timeout=settings.llm_breaker_reset_s,
            exclude=[_is_health_neutral],
            listeners=[BreakerMetrics(target)],
            name=target,
            # The call that trips the breaker reached the server: report what it answered.
            throw_new_error_on_trip=False,
        )

    async def __aenter__(self) -> OpenAICompatibleLLM:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    @property
    def breaker_state(self) -> str:
        return str(self.breaker.current_state)

    # --- public calls ---

    async def chat(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> str:
        """The assistant's reply to ``messages``."""
        with _measured(), tracing.llm_call("chat", self.settings.llm_model) as carrier:
            body = self._body(messages, max_tokens, temperature)
            return await self._complete(body, timeout, carrier)

    async def structured(
        self,
        messages: Messages,
        schema: type[ModelT],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> ModelT:
        """The reply as a validated ``schema``; the server is asked to constrain its output to the
        schema, but small models and servers without guided decoding still wrap or bend it, so
        the text is parsed leniently and validated in lax mode."""
        with _measured(), tracing.llm_call("structured", self.settings.llm_model) as carrier:
            body = self._body(messages, max_tokens, temperature)
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": _schema_name(schema),
                    "schema": schema.model_json_schema(),
                    "strict": True,
                },
            }
            return parse_structured(await self._complete(body, timeout, carrier), schema)

    async def stream(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[str]:
        """The reply's content deltas as the server produces them. Only opening the stream is
        retried: once text has been yielded, a retry would repeat it. The deadline caps the
        whole stream."""
        with _measured(), tracing.llm_call("stream", self.settings.llm_model) as carrier:
            body = self._body(messages, max_tokens, temperature)
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            overall = self._deadline(timeout)
            response = await self._guarded(lambda left: self._open_stream(body, left, carrier), overall)
            try:
                async for delta in self._deltas(response, overall):
                    yield delta
            finally:
                await response.aclose()

    # --- plumbing ---

    def _body(self, messages: Messages, max_tokens: int | None, temperature: float | None) -> dict[str, Any]:
        return {
            "model": self.settings.llm_model,
            "messages": [dict(m) for m in messages],
            "max_tokens": max_tokens if max_tokens is not None else self.settings.llm_max_tokens,
            "temperature": temperature if temperature is not None else self.settings.llm_temperature,
        }

    def _deadline(self, timeout: float | None) -> float:
        # Also capped by the inbound gRPC call's deadline when we serve one.
        return time.monotonic() + remaining_budget(
            timeout if timeout is not None else self.settings.llm_timeout_s
        )

    async def _complete(self, body: dict[str, Any], timeout: float | None, headers: dict[str, str]) -> str:
        response = await self._guarded(lambda left: self._post(body, left, headers), self._deadline(timeout))
        try:
            data = response.json()
            _count_usage(data.get("usage"))
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
            raise LLMError(
                "error", "malformed chat completion", raw=response.text[:MAX_ERROR_BODY_CHARS]
            ) from exc
        if not isinstance(content, str):
            raise LLMError(
                "invalid_output", "the reply has no text content", raw=json.dumps(data)[:MAX_ERROR_BODY_CHARS]
            )
        return content

    async def _post(self, body: dict[str, Any], left: float, headers: dict[str, str]) -> httpx.Response:
        response = await self._http.post(CHAT_PATH, json=body, headers=headers, timeout=httpx.Timeout(left))
        if response.status_code >= 400:
            raise _StatusError(response.status_code, response.text[:MAX_ERROR_BODY_CHARS])
        return response

    async def _open_stream(
        self, body: dict[str, Any], left: float, headers: dict[str, str]
    ) -> httpx.Response:
        request = self._http.build_request(
            "POST", CHAT_PATH, json=body, headers=headers, timeout=httpx.Timeout(left)
        )
        response = await self._http.send(request, stream=True)
        if response.status_code >= 400:
            try:
                await response.aread()
            finally:
                await response.aclose()
            raise _StatusError(response.status_code, response.text[:MAX_ERROR_BODY_CHARS])
        return response

    async def _guarded(self, send: Callable[[float], Awaitable[T]], overall: float) -> T:
        """``send(seconds_left)`` under the deadline, retries and breaker."""

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "llm call failed, retrying",
                extra={"target": self.target, "attempt": state.attempt_number, "error": repr(exc)},
            )

        retrying = AsyncRetrying(
            stop=stop_any(
                stop_after_attempt(self.settings.llm_retry_attempts),
                stop_before_delay(max(0.0, overall - time.monotonic())),
            ),
            wait=wait_exponential_jitter(
                multiplier=self.settings.llm_retry_backoff_s,
                max=5.0,
                jitter=self.settings.llm_retry_backoff_s,
            ),
            retry=retry_if_exception(_is_retryable),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    left = overall - time.monotonic()
                    if left <= 0:
                        raise LLMError("deadline", "no time left before the deadline")
                    with self.breaker.calling():
                        # httpx's own timeouts apply per read; this one caps the attempt as a whole.
                        async with asyncio.timeout(left):
                            return await send(left)
        except (pybreaker.CircuitBreakerError, TimeoutError, httpx.TransportError, _StatusError) as exc:
            raise _as_llm_error(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _deltas(self, response: httpx.Response, overall: float) -> AsyncIterator[str]:
        lines = response.aiter_lines()
        while True:
            left = overall - time.monotonic()
            if left <= 0:
                raise LLMError("deadline", "the stream outlived the deadline")
            try:
                async with asyncio.timeout(left):
                    line = await anext(lines)
            except StopAsyncIteration:
                raise LLMError("unavailable", "the stream ended before [DONE]") from None
            except (TimeoutError, httpx.TransportError) as exc:
                raise _as_llm_error(exc) from exc
            data = _sse_data(line)
            if data is None:
                continue
            if data == "[DONE]":
                return
            delta = _stream_delta(data)
            if delta:
                yield delta


@contextlib.contextmanager
def _measured() -> Iterator[None]:
    started = time.monotonic()
    outcome = "cancelled"
    try:
        yield
        outcome = "ok"
    except LLMError as exc:
        outcome = exc.reason
        raise
    except Exception:
        outcome = "error"
        raise
    finally:
        REQUESTS.labels(outcome).inc()
        REQUEST_SECONDS.observe(time.monotonic() - started)


def _count_usage(usage: Any) -> None:
    if not isinstance(usage, Mapping):
        return
    for kind in ("prompt", "completion"):
        count = usage.get(f"{kind}_tokens")
        if isinstance(count, int) and count > 0:
            TOKENS.labels(kind).inc(count)


def _sse_data(line: str) -> str | None:
    """The payload of a ``data:`` line; None for blank lines, comments and other fields."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def _stream_delta(data: str) -> str:
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise LLMError("error", "malformed stream event", raw=data[:MAX_ERROR_BODY_CHARS]) from exc
    if not isinstance(chunk, dict):
        raise LLMError("error", "malformed stream event", raw=data[:MAX_ERROR_BODY_CHARS])
    if "error" in chunk:
        raise LLMError("error", f"the server failed mid-stream: {chunk['error']}")
    # The usage event (stream_options.include_usage) comes last, with no choices.
    _count_usage(chunk.get("usage"))
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    content = (choices[0].get("delta") or {}).get("content")
    return content if isinstance(content, str) else ""


def _schema_name(schema: type[BaseModel]) -> str:
    # OpenAI limits the name to 64 characters of [a-zA-Z0-9_-].
    return re.sub(r"[^a-zA-Z0-9_-]", "_", schema.__name__)[:64] or "output"
