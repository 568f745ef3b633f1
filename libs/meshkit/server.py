"""Service bootstrap on grpc.aio: health checking, reflection, interceptors, metrics, and a
graceful shutdown on SIGTERM/SIGINT that stops taking calls and drains the ones in flight.

A service describes itself with a ``ServiceSpec`` and calls ``run_service``; everything else
(ports, logs, signals) is the same for every service in the mesh.
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

from meshkit.auth import Rule, guard_for
from meshkit.interceptors import MeshServerInterceptor
from meshkit.logs import configure_logging
from meshkit.metrics import start_metrics_server
from meshkit.prefork import WorkerGroup, check_workers, exit_when_orphaned, metrics_port_of
from meshkit.settings import MeshSettings
from meshkit.tls import bind, server_mode

log = logging.getLogger("meshkit.server")

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
    # Per-method access rules of a public service (meshkit.auth); empty: internal, no API keys.
    access: Mapping[str, Rule] = field(default_factory=dict)
    # Largest inbound message (0: max_message_bytes): public services take less than the mesh.
    max_request_bytes: int = 0
    # True when several processes may serve it side by side (RAGMESH_WORKERS > 1): no data dir,
    # consumer or other state of its own (see meshkit.prefork).
    multiprocess_safe: bool = False


MAX_CONNECTION_AGE_MS = 5 * 60 * 1000
# Longer than the slowest call (an Ask on a CPU LLM takes up to its 120 s deadline).
MAX_CONNECTION_AGE_GRACE_MS = 3 * 60 * 1000


def server_options(settings: MeshSettings, max_request_bytes: int = 0) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", max_request_bytes or settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        # Off for one process, so a port already taken is an error; on for pre-fork workers,
        # which share the port (meshkit.prefork).
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

    def __init__(self, spec: ServiceSpec, server: aio.Server, health_servicer: AioHealthServicer, port: int):
        self.spec = spec
        self.server = server
        self.health = health_servicer
        self.port = port

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        log.info("draining", extra={"grace_s": grace})
        await self.server.stop(grace)
        for hook in self.spec.on_stop:
            try:
                await hook()
            except Exception:
                log.exception("shutdown hook failed")


async def start_service(spec: ServiceSpec, settings: MeshSettings) -> RunningService:
    """Start the server (hooks first, then the port); health turns SERVING once all is ready."""
    for hook in spec.on_start:
        await hook()
    guard = guard_for(spec.name, spec.access, settings)
    server = aio.server(
        interceptors=[MeshServerInterceptor(spec.name, guard)],
        options=server_options(settings, spec.max_request_bytes),
    )
    spec.register(server)
    health_servicer = AioHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*spec.grpc_services, health.SERVICE_NAME, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    port = bind(server, f"{settings.host}:{settings.port}", settings)
    if port == 0:
        raise RuntimeError(f"could not bind {settings.host}:{settings.port}")
    await server.start()
    for name in ["", *spec.grpc_services]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "serving",
        extra={"port": port, "services": list(spec.grpc_services), "transport": server_mode(settings)},
    )
    return RunningService(spec, server, health_servicer, port)


async def serve_until_signalled(spec: ServiceSpec, settings: MeshSettings) -> None:
    running = await start_service(spec, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
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
    and of each of its workers (meshkit.prefork)."""
    configure_logging(spec.name, settings.log_level, settings.log_format)
    try:
        check_workers(spec.name, spec.multiprocess_safe, settings)
    except ValueError as exc:
        log.error("refusing to start", extra={"reason": str(exc)})
        raise SystemExit(f"error: {exc}") from None
    if settings.workers > 1 and settings.worker_index is None:
        raise SystemExit(WorkerGroup(settings).run())
    start_metrics_server(metrics_port_of(settings), settings.host)
    asyncio.run(serve_until_signalled(spec, settings))
