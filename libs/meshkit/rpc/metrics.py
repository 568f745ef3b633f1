"""Prometheus metrics shared by every service (each process exposes /metrics on its own port)."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app, start_http_server
from prometheus_client.exposition import ThreadingWSGIServer

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
# Per replica of a downstream the client balances itself (meshkit.rpc.balancer): a replica list
# is a handful of addresses, so the address is a bounded label.
REPLICA_IN_FLIGHT = Gauge(
    "ragmesh_client_replica_in_flight",
    "Calls in flight to one replica of a downstream.",
    ["target", "replica"],
)
REPLICA_CALLS = Counter(
    "ragmesh_client_replica_calls_total",
    "Attempts sent to one replica of a downstream, by outcome (ok, failed: UNAVAILABLE or "
    "DEADLINE_EXCEEDED, other: any other status or cancelled).",
    ["target", "replica", "outcome"],
)
REPLICA_EJECTIONS = Counter(
    "ragmesh_client_replica_ejections_total",
    "Times a replica was taken out of the rotation, by reason (failures, latency).",
    ["target", "replica", "reason"],
)
REPLICA_EJECTED = Gauge(
    "ragmesh_client_replica_ejected",
    "1 while a replica is ejected (no calls until probed).",
    ["target", "replica"],
)
REPLICA_LATENCY = Gauge(
    "ragmesh_client_replica_latency_ewma_seconds",
    "Moving average of a replica's call latency as this client sees it (queueing included).",
    ["target", "replica"],
)
AUTH_REQUESTS = Counter(
    "ragmesh_auth_requests_total",
    "Calls checked by API-key auth, by key id (kid_...: 'ragmesh keys list' names it; '-' when none "
    "matched) and outcome (ok, unauthenticated, permission_denied, rate_limited, invalid).",
    ["service", "key", "outcome"],
)
AUTH_KEYS_RELOADS = Counter(
    "ragmesh_auth_keys_reloads_total",
    "Changes of the API keys file seen while serving, by outcome: ok (the new keys are in force) or "
    "invalid (refused; the previous keys stay in force).",
    ["service", "outcome"],
)

IDENTITY_REQUESTS = Counter(
    "ragmesh_identity_requests_total",
    "Calls to internal services checked against their caller allow-lists (RAGMESH_SERVICE_AUTH=mtls), by "
    "the caller's mesh identity ('-' when its certificate names none) and outcome (ok, unauthenticated, "
    "permission_denied).",
    ["service", "identity", "outcome"],
)


# ------------------------------------------------------------------------------- the /metrics port

# A client that connects and never finishes its handshake (or its request) holds only its own
# thread, and only this long.
METRICS_TLS_TIMEOUT_S = 10.0
_ADMITTED = "ragmesh.metrics.admitted"


@dataclass(frozen=True)
class MetricsTLS:
    """/metrics over mutual TLS (RAGMESH_SERVICE_AUTH=mtls; meshkit.rpc.tls.metrics_tls makes it).
    ``context`` requires a client certificate from the mesh CA, so a caller without one never
    gets past the handshake; ``identity_of`` reads the mesh identity of the verified certificate
    (DER) and only ``readers`` may read the metrics."""

    context: ssl.SSLContext
    identity_of: Callable[[bytes], str | None]
    readers: frozenset[str]
    timeout_s: float = METRICS_TLS_TIMEOUT_S


class _MetricsHandler(WSGIRequestHandler):
    server: _TLSMetricsServer

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one every few seconds per scraper)."""

    def get_environ(self) -> dict[str, Any]:
        environ: dict[str, Any] = dict(super().get_environ())
        environ["wsgi.url_scheme"] = "https"
        environ[_ADMITTED] = self.server.admits(self.connection)
        return environ


class _TLSMetricsServer(ThreadingWSGIServer):
    """prometheus_client's threading WSGI server with the TLS handshake in each connection's
    own thread: prometheus_client wraps the listening socket instead, which shakes hands in
    accept(), so one silent client would stall every scrape."""

    tls: MetricsTLS

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.tls.timeout_s)
        try:
            conn = self.tls.context.wrap_socket(request, server_side=True)
        except (OSError, ValueError):
            # Plaintext, no client certificate, another CA's: refused at the handshake.
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up or stalls mid-request (socketserver would print a traceback to
        # stderr for each): its own loss, nothing the operator must act on.
        log.debug("metrics connection failed", exc_info=True)

    def admits(self, conn: ssl.SSLSocket) -> bool:
        der = conn.getpeercert(binary_form=True)
        identity = self.tls.identity_of(der) if der else None
        if identity in self.tls.readers:
            return True
        log.warning("metrics scrape refused", extra={"caller_identity": identity})
        return False


def _refuse_unadmitted(app: Callable[..., Iterable[bytes]], readers: Iterable[str]) -> Callable[..., Any]:
    refusal = f"403: only the identities {', '.join(sorted(readers))} may read metrics\n".encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not environ.get(_ADMITTED):
            start_response(
                "403 Forbidden", [("Content-Type", "text/plain"), ("Content-Length", str(len(refusal)))]
            )
            return [refusal]
        return app(environ, start_response)

    return guarded


def _address_family(host: str, port: int) -> socket.AddressFamily:
    # As prometheus_client does: an IPv6 host needs an AF_INET6 socket.
    family, *_ = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return family


def serve_metrics(port: int, host: str = "127.0.0.1", tls: MetricsTLS | None = None) -> WSGIServer:
    """Serve /metrics on ``port`` (0: any free port) in a daemon thread: plaintext HTTP, or with
    ``tls`` HTTPS that requires a mesh client certificate of one of ``tls.readers``."""
    if tls is None:
        server, _thread = start_http_server(port, addr=host)
        return server

    class Server(_TLSMetricsServer):
        address_family = _address_family(host, port)

    Server.tls = tls
    app = _refuse_unadmitted(make_wsgi_app(), tls.readers)
    server = make_server(host, port, app, Server, handler_class=_MetricsHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def start_metrics_server(port: int, host: str = "127.0.0.1", tls: MetricsTLS | None = None) -> int:
    """Serve /metrics (over mTLS when ``tls`` is given); returns the bound port (0 disables)."""
    if port <= 0:
        return 0
    server = serve_metrics(port, host, tls)
    bound = int(server.server_address[1])
    log.info(
        "metrics listening",
        extra={"metrics_port": bound, "transport": "mtls" if tls is not None else "plaintext"},
    )
    return bound
