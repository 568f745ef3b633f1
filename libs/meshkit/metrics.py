"""Prometheus metrics shared by every service (each process exposes /metrics on its own port)."""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

RPC_REQUESTS = Counter(
    "ragmesh_rpc_requests_total", "Handled RPCs by method and status code.", ["service", "method", "code"]
)
RPC_LATENCY = Histogram(
    "ragmesh_rpc_latency_seconds",
    "Server-side RPC latency.",
    ["service", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RPC_IN_FLIGHT = Gauge("ragmesh_rpc_in_flight", "RPCs being handled.", ["service"])
CLIENT_CALLS = Counter(
    "ragmesh_client_calls_total",
    "Outgoing calls by downstream, method and code.",
    ["target", "method", "code"],
)
CLIENT_RETRIES = Counter("ragmesh_client_retries_total", "Retried outgoing calls.", ["target", "method"])
BREAKER_STATE = Gauge(
    "ragmesh_breaker_open", "1 while the circuit breaker of a downstream is open.", ["target"]
)
AUTH_REQUESTS = Counter(
    "ragmesh_auth_requests_total",
    "Calls checked by API-key auth, by key name ('-' when none matched) and outcome "
    "(ok, unauthenticated, permission_denied, rate_limited).",
    ["service", "key", "outcome"],
)

IDENTITY_REQUESTS = Counter(
    "ragmesh_identity_requests_total",
    "Calls to internal services checked against their caller allow-lists (RAGMESH_SERVICE_AUTH=mtls), by "
    "the caller's mesh identity ('-' when its certificate names none) and outcome (ok, unauthenticated, "
    "permission_denied).",
    ["service", "identity", "outcome"],
)


def start_metrics_server(port: int, host: str = "127.0.0.1") -> int:
    """Serve /metrics; returns the bound port (0 disables)."""
    if port <= 0:
        return 0
    server, _thread = start_http_server(port, addr=host)
    bound = int(server.server_address[1])
    log.info("metrics listening", extra={"metrics_port": bound})
    return bound
