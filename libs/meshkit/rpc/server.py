"""Service bootstrap on grpc.aio: health checking, reflection, interceptors, metrics, and a
graceful shutdown on SIGTERM/SIGINT that stops taking calls and drains the ones in flight.

A service describes itself with a ``ServiceSpec`` and calls ``run_service``; everything else
(ports, logs, signals, limits, who may call it) is the same for every service in the mesh. Every
server caps the calls it runs at once (``maximum_concurrent_rpcs``: beyond it gRPC answers
RESOURCE_EXHAUSTED at once instead of queueing without bound) and the size of what it accepts
(its largest legal request, ``max_request_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as AioHealthServicer
from grpc_reflection.v1alpha import reflection

from meshkit.core.logs import configure_logging
from meshkit.rpc.auth import Guard, Rule, guard_for
from meshkit.rpc.decoding import DecodingInterceptor
from meshkit.rpc.identity import MESH_IDENTITIES, Callers, IdentityGuard, describe
from meshkit.rpc.interceptors import MeshServerInterceptor
from meshkit.rpc.keyreload import KeysReloader, reloader_for
from meshkit.rpc.metrics import start_metrics_server
from meshkit.rpc.prefork import WorkerGroup, check_workers, exit_when_orphaned, metrics_port_of
from meshkit.rpc.tls import TLSConfigError, bind, metrics_tls, own_identity, server_mode
from meshkit.rpc.tracing import configure_tracing, shutdown_tracing
from meshkit.settings import MeshSettings

log = logging.getLogger("meshkit.rpc.server")

Hook = Callable[[], Awaitable[None]]


@dataclass
class ServiceSpec:
    """What a service brings to the bootstrap."""

    name: str
    # Full protobuf service names, e.g. "ragmesh.embedder.v1.EmbedderService".
    grpc_services: Sequence[str]
    # Adds the servicers to the server (called once, before start).
    register: Callable[[aio.Server], None]
    on_start: Sequence[Hook] = field(default_factory=list)
    on_stop: Sequence[Hook] = field(default_factory=list)
    # Per-method access rules of a public service (meshkit.rpc.auth); empty: internal, no API keys.
    access: Mapping[str, Rule] = field(default_factory=dict)
    # Per-method caller identities of an internal service (meshkit.rpc.identity), checked with
    # RAGMESH_SERVICE_AUTH=mtls; a method missing here is refused to every caller.
    callers: Callers = field(default_factory=dict)
    # Largest inbound message: what the service's largest legal request needs (0: the mesh-wide
    # max_message_bytes, which also caps it).
    max_request_bytes: int = 0
    # Calls served at once unless RAGMESH_MAX_CONCURRENT_RPCS overrides it.
    max_concurrent_rpcs: int = 256
    # True when several processes may serve it side by side (RAGMESH_WORKERS > 1): no data dir,
    # consumer or other state of its own (see meshkit.rpc.prefork).
    multiprocess_safe: bool = False


MAX_CONNECTION_AGE_MS = 5 * 60 * 1000
# Longer than the slowest call (an Ask on a CPU LLM takes up to its 120 s deadline).
MAX_CONNECTION_AGE_GRACE_MS = 3 * 60 * 1000


# Room a request needs beyond the text its limits allow (ids, framing, small fields).
REQUEST_SLACK_BYTES = 64 * 1024
# Worst case of one character in UTF-8, for message limits derived from character limits.
UTF8_MAX_BYTES = 4
# Room per listed item (passage, source, fact) besides its text: an id of up to 512 characters,
# a doc_id of up to 256 and a title of up to 2000, in UTF-8's worst case, plus framing.
ITEM_OVERHEAD_BYTES = 16 * 1024


def text_request_bytes(items: int = 0, item_chars: int = 0, item_overhead: int = 0, chars: int = 0) -> int:
    """The largest request made of ``items`` texts of ``item_chars`` characters (plus
    ``item_overhead`` bytes each: ids, titles, framing) and ``chars`` characters more (a query)."""
    texts = items * (UTF8_MAX_BYTES * item_chars + item_overhead)
    return texts + UTF8_MAX_BYTES * chars + REQUEST_SLACK_BYTES


def request_limit(settings: MeshSettings, max_request_bytes: int = 0) -> int:
    """A service's inbound message limit: its own, never above the mesh-wide one."""
    if max_request_bytes <= 0:
        return settings.max_message_bytes
    return min(max_request_bytes, settings.max_message_bytes)


def concurrency_limit(spec: ServiceSpec, settings: MeshSettings) -> int:
    return settings.max_concurrent_rpcs or spec.max_concurrent_rpcs


def server_options(settings: MeshSettings, max_request_bytes: int = 0) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", request_limit(settings, max_request_bytes)),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        # Off for one process, so a port already taken is an error; on for pre-fork workers,
        # which share the port (meshkit.rpc.prefork).
        ("grpc.so_reuseport", 1 if settings.workers > 1 else 0),
        ("grpc.keepalive_permit_without_calls", 1),
        # Clients reconnect (and re-resolve a headless Service's DNS) every few minutes, so
        # replicas added by scaling get their share; calls in flight get the grace to finish.
        ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
        ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
    ]


class RunningService:
    """A started server; ``stop`` drains it."""

    def __init__(
        self,
        spec: ServiceSpec,
        server: aio.Server,
        health_servicer: AioHealthServicer,
        port: int,
        health_server: aio.Server | None = None,
        keys_reloader: KeysReloader | None = None,
    ):
        self.spec = spec
        self.server = server
        self.health = health_servicer
        self.port = port
        self.health_server = health_server
        self.keys_reloader = keys_reloader

    async def stop(self, grace: float) -> None:
        if self.keys_reloader is not None:
            await self.keys_reloader.stop()
        await self.health.enter_graceful_shutdown()
        log.info("draining", extra={"grace_s": grace})
        await self.server.stop(grace)
        if self.health_server is not None:
            await self.health_server.stop(0)
        for hook in self.spec.on_stop:
            try:
                await hook()
            except Exception:
                log.exception("shutdown hook failed")


def identity_guard_for(spec: ServiceSpec, settings: MeshSettings) -> IdentityGuard | None:
    """The caller check of an internal service under service_auth=mtls (None otherwise: off, or a
    public service, whose callers present API keys)."""
    if settings.service_auth != "mtls" or spec.access:
        return None
    return IdentityGuard(spec.name, spec.callers)


def check_mesh_auth(spec: ServiceSpec, settings: MeshSettings, guard: Guard | None) -> str | None:
    """Refuse to start a service that would leave a hole under service_auth=mtls: a public one
    without API keys, or one holding another identity's certificate. Returns the identity of
    the process's certificate (None with auth off)."""
    if settings.service_auth != "mtls":
        return None
    if spec.access and guard is None:
        raise TLSConfigError(
            f"{spec.name} is public: with RAGMESH_SERVICE_AUTH=mtls it needs API keys "
            "(RAGMESH_API_KEYS_FILE), or anyone could call it"
        )
    identity = own_identity(settings)
    if identity is None:
        raise TLSConfigError(
            f"RAGMESH_SERVICE_AUTH=mtls: the certificate {str(settings.tls_cert_file)!r} names no "
            "spiffe://ragmesh/<identity> (make one with 'ragmesh certs new')"
        )
    if spec.name in MESH_IDENTITIES and identity != spec.name:
        raise TLSConfigError(f"{spec.name} was given the certificate of {identity!r}")
    return identity


async def _start_health_port(settings: MeshSettings, health_servicer: AioHealthServicer) -> aio.Server | None:
    """The plaintext health-only port (settings.health_port), for probes without a certificate."""
    if settings.health_port <= 0:
        return None
    server = aio.server(
        # No access log for probes, but an undecodable one is INVALID_ARGUMENT, not UNKNOWN.
        interceptors=[DecodingInterceptor()],
        options=[("grpc.so_reuseport", 1 if settings.workers > 1 else 0)],
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(f"{settings.host}:{settings.health_port}") == 0:
        raise RuntimeError(f"could not bind the health port {settings.host}:{settings.health_port}")
    await server.start()
    return server


async def start_service(spec: ServiceSpec, settings: MeshSettings) -> RunningService:
    """Start the server (hooks first, then the port); health turns SERVING once all is ready."""
    guard = guard_for(spec.name, spec.access, settings)
    identity = check_mesh_auth(spec, settings, guard)
    for hook in spec.on_start:
        await hook()
    public = bool(spec.access)
    server = aio.server(
        interceptors=[MeshServerInterceptor(spec.name, guard, identity_guard_for(spec, settings))],
        options=server_options(settings, spec.max_request_bytes),
        maximum_concurrent_rpcs=concurrency_limit(spec, settings),
    )
    spec.register(server)
    health_servicer = AioHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*spec.grpc_services, health.SERVICE_NAME, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    port = bind(server, f"{settings.host}:{settings.port}", settings, public)
    if port == 0:
        raise RuntimeError(f"could not bind {settings.host}:{settings.port}")
    await server.start()
    # Each serving process (a pre-fork worker too) watches the keys file on its own.
    keys_reloader = reloader_for(guard, settings)
    if keys_reloader is not None:
        keys_reloader.start()
    health_server = await _start_health_port(settings, health_servicer)
    for name in ["", *spec.grpc_services]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "serving",
        extra={
            "port": port,
            "services": list(spec.grpc_services),
            "transport": server_mode(settings, public),
            "identity": identity,
            "callers": describe(spec.callers) if identity and not public else None,
            "max_concurrent_rpcs": concurrency_limit(spec, settings),
            "max_request_bytes": request_limit(settings, spec.max_request_bytes),
            "health_port": settings.health_port or None,
            "api_keys_reload_s": settings.api_keys_reload_s if keys_reloader is not None else None,
        },
    )
    return RunningService(spec, server, health_servicer, port, health_server, keys_reloader)


def log_task_stacks() -> None:
    """SIGUSR1: log where every asyncio task of the process is waiting. A process that looks
    idle but makes no progress is waiting on something; a thread dump (py-spy) cannot say what."""
    for task in asyncio.all_tasks():
        log.warning("task stack", extra={"task": task.get_name(), "frames": _await_chain(task.get_coro())})


def _await_chain(coro: Any, limit: int = 32) -> list[str]:
    """The frames of a suspended coroutine and of what it awaits, outermost first (asyncio's own
    Task.get_stack gives only the outermost one)."""
    frames: list[str] = []
    while coro is not None and len(frames) < limit:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            frames.append(repr(coro)[:200])  # a future or another awaitable: what it waits on
            break
        frames.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return frames


async def serve_until_signalled(spec: ServiceSpec, settings: MeshSettings) -> None:
    running = await start_service(spec, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGUSR1, log_task_stacks)
    orphan_watch = (
        asyncio.create_task(exit_when_orphaned(stop)) if settings.worker_index is not None else None
    )
    await stop.wait()
    if orphan_watch is not None:
        orphan_watch.cancel()
    log.info("signal received, shutting down")
    await running.stop(settings.shutdown_grace_s)
    log.info("stopped")


def run_service(spec: ServiceSpec, settings: MeshSettings) -> None:
    """Entry point body for every service process; with workers > 1, of the pre-fork supervisor
    and of each of its workers (meshkit.rpc.prefork)."""
    configure_logging(spec.name, settings.log_level, settings.log_format)
    try:
        check_workers(spec.name, spec.multiprocess_safe, settings)
    except ValueError as exc:
        log.error("refusing to start", extra={"reason": str(exc)})
        raise SystemExit(f"error: {exc}") from None
    if settings.workers > 1 and settings.worker_index is None:
        raise SystemExit(WorkerGroup(settings).run())
    start_metrics_server(metrics_port_of(settings), settings.host, metrics_tls(settings))
    # After the pre-fork branch: each serving process exports its own spans.
    configure_tracing(spec.name, settings)
    try:
        asyncio.run(serve_until_signalled(spec, settings))
    finally:
        shutdown_tracing()
