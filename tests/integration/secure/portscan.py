"""What a stranger on the machine gets from a stack's ports: every listening TCP port of a set of
processes (read from /proc, not from stack.json), each asked, without any credential, over
plaintext and over TLS without a client certificate:

- HTTP/1.1 requests on paths that serve data, objects or admin actions in the servers the stack
  runs (SeaweedFS's filer, master and volume server, NATS monitoring, Prometheus metrics, the
  LLM server's API), and a write and a delete on the object store;
- gRPC: every method of every ragmesh contract, with an empty request.

A port *serves* a stranger when an HTTP request other than a health check gets a 2xx answer, or
a gRPC method gets anything but a refusal (UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED, or
no connection at all).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import socket
import ssl
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

import ragmesh

LOOPBACK = "127.0.0.1"
TIMEOUT_S = 2.0
# Paths that serve objects, listings, cluster state or admin actions in one of the stack's servers.
HTTP_PROBES: tuple[tuple[str, str], ...] = (
    ("GET", "/"),
    ("GET", "/metrics"),
    ("GET", "/buckets/"),
    ("GET", "/buckets/ragmesh-documents/?pretty=y"),
    ("GET", "/dir/status"),
    ("GET", "/cluster/status"),
    ("GET", "/vol/status"),
    ("GET", "/status"),
    ("GET", "/ragmesh-documents"),
    ("GET", "/connz?subs=1"),
    ("GET", "/jsz?streams=true&consumers=true"),
    ("GET", "/varz"),
    ("GET", "/v1/models"),
    ("GET", "/slots"),
    ("GET", "/props"),
    ("POST", "/v1/chat/completions"),
    ("PUT", "/buckets/ragmesh-documents/portscan-probe.txt"),
    ("DELETE", "/buckets/ragmesh-documents/portscan-probe.txt"),
)
# Answers that give nothing away: health, and the names of the LLM server's models.
HEALTH_PATHS = frozenset({"/health", "/v1/health", "/healthz", "/models", "/v1/models"})
REFUSED_GRPC = frozenset(
    {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED}
)


@dataclass(frozen=True)
class Finding:
    port: int
    transport: str
    what: str

    def __str__(self) -> str:
        return f"port {self.port} over {self.transport}: {self.what}"


# ------------------------------------------------------------------ the processes and their ports


def _session_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[3])


def session_members(leaders: Iterable[int]) -> set[int]:
    """Every process in the sessions of ``leaders`` (the stack starts each component as the
    leader of its own session, so pre-fork workers and sandboxes are found too)."""
    sessions = set(leaders)
    return {int(p) for p in os.listdir("/proc") if p.isdigit() and _session_of(int(p)) in sessions}


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    with contextlib.suppress(FileNotFoundError, PermissionError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def _listening_by_inode() -> dict[int, int]:
    """Socket inode -> port of every listening TCP socket (IPv4 and IPv6)."""
    listening: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as handle:
            for line in list(handle)[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    listening[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return listening


def listening_ports(pids: Iterable[int]) -> dict[int, set[int]]:
    """Port -> the pids listening on it."""
    listening = _listening_by_inode()
    ports: dict[int, set[int]] = {}
    for pid in pids:
        for inode in _socket_inodes(pid):
            if inode in listening:
                ports.setdefault(listening[inode], set()).add(pid)
    return ports


# ------------------------------------------------------------------ HTTP


def _no_verify() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    # gRPC servers close a TLS connection that did not negotiate HTTP/2.
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    has_body: bool


def _read_all(sock: socket.socket, limit: int = 64 * 1024) -> bytes:
    data = b""
    with contextlib.suppress(OSError, ssl.SSLError):
        while len(data) < limit:
            chunk = sock.recv(limit - len(data))
            if not chunk:
                break
            data += chunk
    return data


def _parse(reply: bytes) -> HttpAnswer | None:
    head, _, body = reply.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return None
    chunked = b"transfer-encoding: chunked" in head.lower()
    empty = body.strip() in (b"", b"0") if chunked else not body
    return HttpAnswer(int(parts[1]), not empty)


def _http_answer(port: int, method: str, path: str, tls: bool) -> HttpAnswer | None:
    """What one request without credentials got; None when no HTTP answer came."""
    body = b"probe" if method in ("PUT", "POST") else b""
    request = (
        f"{method} {path} HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    try:
        with socket.create_connection((LOOPBACK, port), timeout=TIMEOUT_S) as raw:
            sock = _no_verify().wrap_socket(raw, server_hostname="localhost") if tls else raw
            sock.sendall(request)
            return _parse(_read_all(sock))
    except (OSError, ssl.SSLError):
        return None


def _serves(method: str, path: str, answer: HttpAnswer) -> bool:
    """A 2xx answer serves the stranger, unless it is a health check: a health path, or an
    empty answer to a read (SeaweedFS's S3 /status)."""
    if not 200 <= answer.status < 300 or path.split("?")[0] in HEALTH_PATHS:
        return False
    return method != "GET" or answer.has_body


def http_findings(port: int, tls: bool) -> list[Finding]:
    transport = "TLS without a client certificate" if tls else "plaintext"
    findings = []
    for method, path in HTTP_PROBES:
        answer = _http_answer(port, method, path, tls)
        if answer is None and (method, path) == HTTP_PROBES[0]:
            return []  # no HTTP on this port over this transport
        if answer is not None and _serves(method, path, answer):
            findings.append(Finding(port, transport, f"HTTP {method} {path} answered {answer.status}"))
    return findings


# ------------------------------------------------------------------ gRPC


def ragmesh_methods() -> list[str]:
    """``/package.Service/Method`` of every RPC in the generated ragmesh contracts."""
    methods: list[str] = []
    for info in pkgutil.walk_packages(ragmesh.__path__, "ragmesh."):
        if not info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(info.name)
        for service in module.DESCRIPTOR.services_by_name.values():
            methods += [f"/{service.full_name}/{m.name}" for m in service.methods]
    return sorted(methods)


def _channel(port: int, tls: bool, ca: bytes | None) -> grpc.Channel:
    target = f"{LOOPBACK}:{port}"
    if not tls:
        return grpc.insecure_channel(target)
    # A TLS client without a certificate. It trusts the mesh CA (a certificate, not a secret:
    # anyone may hold it), since gRPC cannot skip the server's verification.
    return grpc.secure_channel(
        target,
        grpc.ssl_channel_credentials(root_certificates=ca),
        options=[("grpc.ssl_target_name_override", "localhost")],
    )


def _connected(channel: grpc.Channel) -> bool:
    try:
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT_S)
    except grpc.FutureTimeoutError:
        return False
    return True


def _http_refusal(exc: grpc.RpcError) -> bool:
    """An HTTP/2 server that is no gRPC server (the S3 API) refused the request with a 4xx."""
    details = exc.details() or ""
    return exc.code() == grpc.StatusCode.UNKNOWN and "http2 header with status: 4" in details


def grpc_findings(port: int, tls: bool, methods: list[str], ca: bytes | None = None) -> list[Finding]:
    transport = "gRPC over TLS without a client certificate" if tls else "gRPC plaintext"
    findings = []
    with _channel(port, tls, ca) as channel:
        if not _connected(channel):
            return []
        for method in methods:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                call(b"", timeout=TIMEOUT_S)
            except grpc.RpcError as exc:
                code = exc.code()
                if code in REFUSED_GRPC or code == grpc.StatusCode.UNAVAILABLE:
                    continue
                if _http_refusal(exc):
                    continue
                what = f"{method} ran and answered {code.name}: {exc.details()}"
                findings.append(Finding(port, transport, what))
            else:
                findings.append(Finding(port, transport, f"{method} answered OK"))
    return findings


# ------------------------------------------------------------------ the scan


def _tls_handshake_without_certificate(port: int) -> bool:
    """Whether a TLS client without a certificate gets through the handshake (TLS 1.3 servers
    refuse a missing certificate only after it, so one read follows)."""
    try:
        with (
            socket.create_connection((LOOPBACK, port), timeout=TIMEOUT_S) as raw,
            _no_verify().wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            sock.settimeout(0.3)
            with contextlib.suppress(TimeoutError, socket.timeout):
                if sock.recv(1) == b"":
                    return False
    except (OSError, ssl.SSLError):
        return False
    return True


@dataclass(frozen=True)
class PortReport:
    port: int
    accepts_tls_without_certificate: bool
    findings: tuple[Finding, ...]
    # gRPC methods that got an answer (a refusal) over TLS: the probe reached a gRPC server.
    grpc_reached: bool = False


def scan_port(port: int, methods: list[str], ca: bytes | None) -> PortReport:
    findings = [*http_findings(port, tls=False), *grpc_findings(port, tls=False, methods=methods)]
    open_tls = _tls_handshake_without_certificate(port)
    reached = False
    if open_tls:
        findings += http_findings(port, tls=True)
        with _channel(port, True, ca) as channel:
            reached = _connected(channel)
        findings += grpc_findings(port, tls=True, methods=methods, ca=ca)
    return PortReport(port, open_tls, tuple(findings), reached)


def scan(ports: Iterable[int], ca: bytes | None = None) -> dict[int, PortReport]:
    """Every port's report; ``ca``: the CA a TLS gRPC client trusts (the mesh's)."""
    methods = ragmesh_methods()
    with ThreadPoolExecutor(max_workers=16) as pool:
        reports = list(pool.map(lambda port: scan_port(port, methods, ca), sorted(ports)))
    return {report.port: report for report in reports}
