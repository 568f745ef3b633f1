"""Client factory: every outgoing call gets a deadline (the caller's, never longer), retries
when it is safe (idempotent calls, UNAVAILABLE only, tenacity) and a circuit breaker per
downstream (pybreaker), and carries the request id to the next hop.

    embedder = Downstream("embedder", settings.embedder_address, EmbedderServiceStub, policy)
    reply = await embedder.call(embedder.stub.Embed, request, idempotent=True)

Failures surface as ``DownstreamError`` with a typed reason, which callers turn into a
degradation (skip the stage) or a status of their own.

A comma list of replicas (IP literals) is balanced here, per call: one channel per replica, each
call to the replica with the fewest calls in flight, slow or failing replicas ejected for a while
(meshkit.rpc.balancer); a retry goes to another replica. A DNS name or one address is one channel
balanced by gRPC's round_robin (see meshkit.rpc.addresses for why).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc
import pybreaker
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_any,
    stop_before_delay,
    wait_exponential_jitter,
)

from meshkit.core.logs import REQUEST_ID_HEADER, current_request_id, new_request_id
from meshkit.rpc import tracing
from meshkit.rpc.addresses import grpc_target, replica_targets
from meshkit.rpc.balancer import Balancer, BalancerConfig, Replica
from meshkit.rpc.interceptors import MAX_DEADLINE_S, deadline_var
from meshkit.rpc.metrics import BREAKER_STATE, CLIENT_CALLS, CLIENT_RETRIES
from meshkit.rpc.tls import ClientTLS, open_channel
from meshkit.settings import MeshSettings

log = logging.getLogger("meshkit.rpc.client")

StubT = TypeVar("StubT")

# Codes that say "the downstream is unwell" (count against its breaker) as opposed to
# "the request was wrong" (INVALID_ARGUMENT, NOT_FOUND...), which say nothing of its health.
FAILURE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})
# Leave this much of the caller's deadline for our own work after a downstream call returns.
# An expired grpc.aio call reaches the handler a few ms late under load (3-7 ms measured on a
# busy 2-core box), so a smaller margin leaves no time to answer with a degraded result.
DEADLINE_MARGIN_S = 0.02


# What a failed call says when no handler of the downstream answered it (no connection, a deadline
# passed on the way): gRPC's own text would name addresses and transport internals.
TRANSPORT_MESSAGES = {
    grpc.StatusCode.UNAVAILABLE: "could not reach the service",
    grpc.StatusCode.DEADLINE_EXCEEDED: "no answer before the deadline",
}


def answered_by_handler(exc: aio.AioRpcError) -> bool:
    """Whether a mesh server's handler produced this status (its interceptor tags every answer
    with the request id), rather than gRPC on the way there."""
    trailers: Any = exc.trailing_metadata() or ()
    return any(item[0] == REQUEST_ID_HEADER for item in trailers)


def caller_safe_details(exc: aio.AioRpcError) -> str:
    """A failed call's message as our own callers may see it: the downstream handler's message
    (written for callers), or only what happened when the transport failed."""
    if answered_by_handler(exc) or exc.code() not in TRANSPORT_MESSAGES:
        return exc.details() or ""
    return TRANSPORT_MESSAGES[exc.code()]


class DownstreamError(Exception):
    """A downstream call that did not succeed, with why: unavailable, deadline, breaker_open,
    or rejected (the downstream answered with a non-failure status such as INVALID_ARGUMENT).
    Its message may reach callers (as a degradation): it never carries transport internals."""

    def __init__(self, target: str, reason: str, code: grpc.StatusCode | None, message: str) -> None:
        super().__init__(f"{target}: {reason}: {message}")
        self.target = target
        self.reason = reason
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ClientPolicy:
    timeout_s: float = 10.0
    retry_attempts: int = 3
    retry_backoff_s: float = 0.1
    breaker_fail_max: int = 5
    breaker_reset_s: float = 10.0
    # None: plaintext channels; else TLS (and mTLS with a client certificate), see meshkit.rpc.tls.
    tls: ClientTLS | None = None
    # How a replica list is balanced (least outstanding calls, outlier ejection).
    balancing: BalancerConfig = field(default_factory=BalancerConfig)

    @classmethod
    def from_settings(cls, settings: MeshSettings) -> ClientPolicy:
        return cls(
            timeout_s=settings.client_timeout_s,
            retry_attempts=settings.client_retry_attempts,
            retry_backoff_s=settings.client_retry_backoff_s,
            breaker_fail_max=settings.breaker_fail_max,
            breaker_reset_s=settings.breaker_reset_s,
            tls=ClientTLS.from_settings(settings),
        )


def channel_options(max_message_bytes: int = 64 * 1024 * 1024) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # Reconnect quickly once a restarted downstream is back.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        ("grpc.enable_retries", 0),
        # Connections of this channel only: with the process-wide pool, a channel to an address
        # that a stopped server left in reconnect backoff shares that backoff when a new server
        # takes the port, and its first calls fail UNAVAILABLE.
        ("grpc.use_local_subchannel_pool", 1),
        # Spread calls over every address the target resolves to (a headless Service's pods, an
        # explicit ipv4:a,b target) instead of sticking to the first. A plain list of replicas
        # has a channel per replica, balanced by meshkit.rpc.balancer.
        ("grpc.lb_policy_name", "round_robin"),
    ]


def _is_health_neutral(exc: BaseException) -> bool:
    return isinstance(exc, aio.AioRpcError) and exc.code() not in FAILURE_CODES


# Set on a failure of one balanced replica while others are ready: the balancer ejects that
# replica, and the downstream's breaker does not count it (one replica's death must not open the
# breaker of the whole tier; its in-flight calls all fail at once).
_REPLICA_LOCAL = "ragmesh_replica_local"


def _is_replica_local(exc: BaseException) -> bool:
    return bool(getattr(exc, _REPLICA_LOCAL, False))


class BreakerMetrics(pybreaker.CircuitBreakerListener):
    """Exports a breaker's state as ragmesh_breaker_open{target} and logs each change."""

    def __init__(self, target: str) -> None:
        self.target = target

    def state_change(self, cb: pybreaker.CircuitBreaker, old_state: Any, new_state: Any) -> None:
        name = getattr(new_state, "name", str(new_state))
        BREAKER_STATE.labels(self.target).set(1 if name == pybreaker.STATE_OPEN else 0)
        log.warning("breaker state change", extra={"target": self.target, "state": name})


def remaining_budget(timeout: float | None) -> float:
    """Timeout for an outgoing call: the requested one, cut to what is left of the inbound
    call's deadline, and never beyond MAX_DEADLINE_S: grpc's client fails a call at once whose
    deadline it cannot represent (see meshkit.rpc.interceptors)."""
    budget = timeout
    deadline = deadline_var.get()
    if deadline is not None:
        left = deadline - time.monotonic() - DEADLINE_MARGIN_S
        budget = left if budget is None else min(budget, left)
    return min(budget, MAX_DEADLINE_S) if budget is not None else 3600.0


class Downstream(Generic[StubT]):
    """A guarded client for one downstream stage: one address, a comma separated list of its
    replicas, or a DNS name (see meshkit.rpc.addresses).

    ``stub`` is the first replica's stub: pass its methods to ``call`` / ``stream``, which send
    each attempt to the method of the same name on the replica the balancer picks."""

    def __init__(
        self,
        target: str,
        address: str,
        stub_factory: Callable[[aio.Channel], StubT],
        policy: ClientPolicy | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.target = target
        self.address = address
        self.policy = policy or ClientPolicy()
        options = channel_options(max_message_bytes)
        replicas = replica_targets(address)
        # None: one channel, balanced by gRPC (a DNS name, one address, a target with a scheme).
        self.balancer: Balancer | None = None
        self.stub: StubT
        if replicas:
            channels = [open_channel(t, options, self.policy.tls) for _, t in replicas]
            self.balancer = Balancer(
                target,
                [
                    Replica(target, i, replica, channel, stub_factory(channel))
                    for i, ((replica, _), channel) in enumerate(zip(replicas, channels, strict=True))
                ],
                self.policy.balancing,
            )
            self.balancer.connect()
            self.channel = channels[0]
            self.stub = self.balancer.replicas[0].stub
        else:
            self.channel = open_channel(grpc_target(address), options, self.policy.tls)
            self.stub = stub_factory(self.channel)
        self.breaker = pybreaker.CircuitBreaker(
            fail_max=self.policy.breaker_fail_max,
            reset_timeout=self.policy.breaker_reset_s,
            exclude=[_is_health_neutral, _is_replica_local],
            listeners=[BreakerMetrics(target)],
            name=target,
            # The call that trips the breaker reached the downstream: report what it answered,
            # not 'breaker_open' (kept for calls the open breaker refused).
            throw_new_error_on_trip=False,
        )

    @property
    def breaker_state(self) -> str:
        return str(self.breaker.current_state)

    async def close(self) -> None:
        if self.balancer is None:
            await self.channel.close(None)
            return
        for replica in self.balancer.replicas:
            await replica.channel.close(None)

    async def call(
        self,
        method: Any,
        request: Any,
        *,
        timeout: float | None = None,
        idempotent: bool = False,
    ) -> Any:
        """Call ``method`` (a stub attribute) with deadline, retries and breaker."""
        name = getattr(method, "_method", b"").decode().rsplit("/", 1)[-1] or "call"
        overall = time.monotonic() + remaining_budget(
            timeout if timeout is not None else self.policy.timeout_s
        )
        rid = current_request_id() or new_request_id()
        attempts = self.policy.retry_attempts if idempotent else 1

        def before_sleep(state: RetryCallState) -> None:
            CLIENT_RETRIES.labels(self.target, name).inc()

        retrying = AsyncRetrying(
            stop=stop_any(
                stop_after_attempt(max(1, attempts)), stop_before_delay(overall - time.monotonic())
            ),
            # Jitter scaled to the backoff: tenacity's default adds up to 1 s, which would swamp
            # a 0.1 s backoff and eat short caller deadlines.
            wait=wait_exponential_jitter(
                multiplier=self.policy.retry_backoff_s, max=2.0, jitter=self.policy.retry_backoff_s
            ),
            retry=retry_if_exception(
                lambda e: isinstance(e, aio.AioRpcError) and e.code() in RETRYABLE_CODES
            ),
            before_sleep=before_sleep,
            reraise=True,
        )
        with tracing.rpc_call(self.target, name) as carrier:
            metadata = ((REQUEST_ID_HEADER, rid), *carrier.items())
            return await self._attempts(retrying, method, request, metadata, name, overall)

    async def _attempts(
        self,
        retrying: AsyncRetrying,
        method: Any,
        request: Any,
        metadata: tuple[tuple[str, str], ...],
        name: str,
        overall: float,
    ) -> Any:
        tried: list[Replica] = []
        try:
            async for attempt in retrying:
                with attempt:
                    left = overall - time.monotonic()
                    if left <= 0:
                        raise DownstreamError(
                            self.target,
                            "deadline",
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            "no time left before the caller's deadline",
                        )
                    with self.breaker.calling():
                        response = await self._send(method, request, left, metadata, tried)
                    CLIENT_CALLS.labels(self.target, name, "OK").inc()
                    return response
        except (pybreaker.CircuitBreakerError, aio.AioRpcError) as exc:
            raise self._failed(name, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(
        self,
        method: Any,
        request: Any,
        timeout: float,
        metadata: tuple[tuple[str, str], ...],
        tried: list[Replica],
    ) -> Any:
        """One attempt: on the one channel, or on the replica the balancer picks (one this call
        has not tried yet when it can), accounted to that replica."""
        replica, bound = self._route(method, tried)
        if replica is None or self.balancer is None:
            return await bound(request, timeout=timeout, metadata=metadata)
        tried.append(replica)
        self.balancer.started(replica)
        started = time.monotonic()
        code = grpc.StatusCode.CANCELLED
        try:
            response = await bound(request, timeout=timeout, metadata=metadata)
            code = grpc.StatusCode.OK
            return response
        except aio.AioRpcError as exc:
            code = exc.code()
            if self.balancer.others_ready(replica):
                setattr(exc, _REPLICA_LOCAL, True)
            raise
        finally:
            self.balancer.finished(replica, code, time.monotonic() - started)

    def _route(self, method: Any, tried: list[Replica]) -> tuple[Replica | None, Any]:
        """(the replica picked, its method); (None, ``method``) without a balancer, or for a
        callable that is no stub method (then sent as given)."""
        if self.balancer is None:
            return None, method
        replica = self.balancer.pick(tried)
        bound = replica.bind(method)
        return (None, method) if bound is None else (replica, bound)

    async def stream(self, method: Any, request: Any, *, timeout: float | None = None) -> AsyncIterator[Any]:
        """The messages of a server-streaming ``method``, under the deadline and the breaker.
        Never retried (what was yielded cannot be taken back). The breaker judges the opening:
        a stream that delivers its first message counts as a success, so one cut short later
        is reported to the caller (DownstreamError) without tripping the breaker twice."""
        name = getattr(method, "_method", b"").decode().rsplit("/", 1)[-1] or "stream"
        left = remaining_budget(timeout if timeout is not None else self.policy.timeout_s)
        if left <= 0:
            raise DownstreamError(
                self.target, "deadline", grpc.StatusCode.DEADLINE_EXCEEDED, "no time left before the deadline"
            )
        rid = current_request_id() or new_request_id()
        with tracing.rpc_call(self.target, name) as carrier:
            metadata = ((REQUEST_ID_HEADER, rid), *carrier.items())
            call: Any = None
            replica: Replica | None = None
            code = grpc.StatusCode.CANCELLED
            try:
                with self.breaker.calling():
                    replica, bound = self._route(method, [])
                    if replica is not None and self.balancer is not None:
                        self.balancer.started(replica)
                    call = bound(request, timeout=left, metadata=metadata)
                    messages = call.__aiter__()
                    first = await anext(messages, None)
                if first is not None:
                    yield first
                    async for message in messages:
                        yield message
                code = grpc.StatusCode.OK
                CLIENT_CALLS.labels(self.target, name, "OK").inc()
            except (pybreaker.CircuitBreakerError, aio.AioRpcError) as exc:
                if isinstance(exc, aio.AioRpcError):
                    code = exc.code()
                raise self._failed(name, exc) from exc
            finally:
                if call is not None and not call.done():
                    call.cancel()
                if replica is not None and self.balancer is not None:
                    # A stream's length is the answer's, not the replica's speed: no latency sample.
                    self.balancer.finished(replica, code, None)

    def _failed(self, name: str, exc: pybreaker.CircuitBreakerError | aio.AioRpcError) -> DownstreamError:
        if isinstance(exc, pybreaker.CircuitBreakerError):
            CLIENT_CALLS.labels(self.target, name, "BREAKER_OPEN").inc()
            return DownstreamError(
                self.target, "breaker_open", grpc.StatusCode.UNAVAILABLE, "circuit breaker open"
            )
        code = exc.code()
        CLIENT_CALLS.labels(self.target, name, code.name).inc()
        reason = {
            grpc.StatusCode.UNAVAILABLE: "unavailable",
            grpc.StatusCode.DEADLINE_EXCEEDED: "deadline",
        }.get(code, "error" if code in FAILURE_CODES else "rejected")
        message = caller_safe_details(exc)
        if message != exc.details():
            log.warning(
                "downstream call failed",
                extra={"target": self.target, "method": name, "code": code.name, "detail": exc.details()},
            )
        return DownstreamError(self.target, reason, code, message)


async def check_health(
    address: str, service: str = "", timeout: float = 1.0, tls: ClientTLS | None = None
) -> str:
    """The health status name of ``service`` at ``address``: SERVING, NOT_SERVING,
    UNREACHABLE... (over TLS when ``tls`` is given)."""
    async with open_channel(address, tls=tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except aio.AioRpcError as exc:
            return "UNREACHABLE" if exc.code() in FAILURE_CODES else exc.code().name
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
