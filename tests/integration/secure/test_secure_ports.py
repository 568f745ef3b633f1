"""No port of the secure stack serves a stranger: every listening TCP port of every process the
stack started (found in /proc from the processes' sessions, not from stack.json) is asked for
data, objects and admin actions without credentials, over plaintext and over TLS without a
client certificate (portscan.py), and refuses; only health checks answer.

The scanner itself is checked first against servers that are open, so a scan that finds nothing
means the ports refused, not that the probes missed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest

from ragmesh_cli.stack import Stack

from . import portscan

pytestmark = pytest.mark.integration


class _OpenHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"tenant data")

    def log_message(self, *_args: Any) -> None:
        pass


class _AnswerEverything(grpc.GenericRpcHandler):
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(lambda request, context: b"")


@pytest.fixture()
def open_servers() -> Iterator[tuple[int, int]]:
    http = ThreadingHTTPServer((portscan.LOOPBACK, 0), _OpenHandler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    rpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rpc.add_generic_rpc_handlers((_AnswerEverything(),))
    rpc_port = rpc.add_insecure_port(f"{portscan.LOOPBACK}:0")
    rpc.start()
    try:
        yield http.server_address[1], rpc_port
    finally:
        http.shutdown()
        rpc.stop(0)


def test_the_scanner_sees_open_ports(open_servers: tuple[int, int]) -> None:
    http_port, rpc_port = open_servers
    reports = portscan.scan([http_port, rpc_port])
    assert any("HTTP GET /buckets/" in f.what for f in reports[http_port].findings), reports[http_port]
    assert any("answered OK" in f.what for f in reports[rpc_port].findings), reports[rpc_port]


def stack_ports(stack: Stack) -> dict[int, set[int]]:
    leaders = [c.pid for c in stack.components.values() if c.pid is not None]
    return portscan.listening_ports(portscan.session_members(leaders))


def test_no_port_of_the_secure_stack_serves_without_credentials(
    secure_stack: Stack, indexed: dict[str, list[str]]
) -> None:
    ports = stack_ports(secure_stack)
    # The scan found the stack: every port stack.json records for a running process, and more
    # (SeaweedFS's internal ports, pre-fork workers' metrics ports).
    recorded = {
        port: f"{comp.name} {role}"
        for comp in secure_stack.components.values()
        for role, port in comp.ports.items()
        # A secure NATS opens no monitoring port; llama.cpp serves no metrics.
        if (comp.kind, role) not in (("nats", "monitor"), ("llm", "metrics"))
    }
    assert set(recorded) <= set(ports), [recorded[p] for p in set(recorded) - set(ports)]
    assert len(ports) > len(recorded)
    reports = portscan.scan(ports, ca=secure_stack.client_tls().ca_file.read_bytes())
    findings = [str(f) for report in reports.values() for f in report.findings]
    assert not findings, "\n".join(findings)
    # Only the public APIs and the S3 API let a client without a certificate finish a TLS
    # handshake (they take keys instead); every other TLS port wants the certificate first.
    public = {
        secure_stack.component(name).port
        for name in secure_stack.names()
        if secure_stack.component(name).kind in ("gateway", "ingestion", "s3")
    }
    handshakes = {port for port, report in reports.items() if report.accepts_tls_without_certificate}
    assert handshakes == public, sorted(handshakes ^ public)
    # ... and the gRPC probes got through to the public gRPC servers, where the keys refused them.
    reached = {port for port, report in reports.items() if report.grpc_reached}
    apis = {secure_stack.component(name).port for name in ("gateway", "ingestion")}
    assert apis <= reached, f"gRPC probes reached {sorted(reached)}, not all of {sorted(apis)}"
