"""``ragmesh mcp``: ragmesh as Model Context Protocol tools for AI agents, over stdio (the agent
starts the process) or streamable HTTP (``--http HOST:PORT``, path ``/mcp``).

Tools: ``search`` (ranked passages), ``ask`` (a verified answer with numbered citations) and
``collection_status`` (lifecycle counts). Every tool calls the mesh through ragmesh_client, so
deadlines, safe retries, TLS and API keys are the client's, and the gateway and ingestion API
decide what a key may read (tenants see only their collections).

Transport security: ``--tls-cert`` and ``--tls-key`` serve HTTPS. Without them the listener must
be on loopback (the keys travel in each request's headers); ``--allow-plaintext`` is the explicit
way to serve plain HTTP elsewhere, behind a proxy that terminates TLS.

Keys: over stdio the server uses one key, ``--api-key`` or RAGMESH_API_KEY (or the secure local
stack's, as every CLI command). Over HTTP it uses the key of each request instead, sent as
``Authorization: Bearer <ragmesh API key>`` (or ``x-api-key``), and never one of its own: a
request is refused with 401 before any MCP handling unless the mesh accepts its key (checked
with an authenticated ListCollections, the verdict cached for ``KEY_CHECK_TTL_S``). Against a
mesh with auth off, requests without a key pass, as they would at the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import ipaddress
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragmesh_cli.mcp_clients import MAX_KEYS, Clients, key_from_headers
from ragmesh_client import RagmeshError, UnauthenticatedError

log = logging.getLogger("ragmesh.mcp")

KEY_CHECK_TTL_S = 30.0
# Key checks in flight at once: a flood of made-up keys costs the mesh at most this many calls
# at a time, the rest wait (their HTTP requests with them).
MAX_KEY_CHECKS = 8


class KeyCheck:
    """Whether the mesh accepts a key (None: no key), cached per key digest for a while."""

    def __init__(self, clients: Clients, ttl_s: float = KEY_CHECK_TTL_S) -> None:
        self.clients, self.ttl_s = clients, ttl_s
        self._verdicts: OrderedDict[str, tuple[bool, float]] = OrderedDict()
        self._gate = asyncio.Semaphore(MAX_KEY_CHECKS)

    async def accepts(self, key: str | None) -> bool:
        digest = hashlib.sha256((key or "").encode()).hexdigest()
        cached = self._verdicts.get(digest)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        try:
            async with self._gate:
                await self.clients.get(key).list_collections(timeout=10.0)
            verdict = True
        except UnauthenticatedError:
            verdict = False
        self._verdicts[digest] = (verdict, time.monotonic() + self.ttl_s)
        while len(self._verdicts) > MAX_KEYS:
            self._verdicts.popitem(last=False)
        return verdict


class RequireMeshKey:
    """ASGI middleware: HTTP requests whose key the mesh refuses get 401, nothing else."""

    def __init__(self, app: Any, check: KeyCheck) -> None:
        self.app, self.check = app, check

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        key = key_from_headers(headers)
        try:
            accepted = await self.check.accepts(key)
        except RagmeshError as exc:
            log.warning("key check failed: %s", exc)
            await _reply(send, 503, "the ragmesh mesh could not check the API key; retry later")
            return
        if not accepted:
            what = "a valid ragmesh API key" if key else "a ragmesh API key"
            await _reply(send, 401, f"this MCP server needs {what}: send 'Authorization: Bearer <key>'")
            return
        await self.app(scope, receive, send)


async def _reply(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="ragmesh"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True)
class Listener:
    """Where ``--http`` serves, and the TLS pair when it serves HTTPS."""

    host: str
    port: int
    tls_cert: Path | None = None
    tls_key: Path | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls_cert else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}/mcp"


def _host_port(spec: str) -> tuple[str, int]:
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--http {spec!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listener(spec: str, tls_cert: str | None, tls_key: str | None, allow_plaintext: bool = False) -> Listener:
    """The ``--http`` listener, refused (ValueError) when half a TLS pair is given, a file of it is
    missing, or it would take API keys in plain text off loopback without ``--allow-plaintext``."""
    host, port = _host_port(spec)
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if tls_cert and tls_key:
        for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
            if not Path(path).is_file():
                raise ValueError(f"{flag} {path}: no such file")
        return Listener(host, port, Path(tls_cert), Path(tls_key))
    if not _is_loopback(host) and not allow_plaintext:
        raise ValueError(
            f"--http {spec}: callers would send API keys in plain text off this machine; give "
            "--tls-cert and --tls-key, bind to 127.0.0.1, or pass --allow-plaintext behind a proxy "
            "that terminates TLS"
        )
    return Listener(host, port)


async def serve_http(server: Any, clients: Clients, where: Listener) -> None:
    import uvicorn

    app = RequireMeshKey(server.streamable_http_app(host=where.host), KeyCheck(clients))
    config = uvicorn.Config(
        app,
        host=where.host,
        port=where.port,
        log_level="warning",
        ssl_certfile=str(where.tls_cert) if where.tls_cert else None,
        ssl_keyfile=str(where.tls_key) if where.tls_key else None,
    )
    log.warning("ragmesh MCP tools at %s", where.url)
    await uvicorn.Server(config).serve()


def run_mcp(args: argparse.Namespace, gateway: str, ingestion: str) -> int:
    import anyio

    from ragmesh_cli.channels import api_key

    http = args.http is not None
    # Refuse a bad address or TLS pair before starting anything.
    where = listener(args.http, args.tls_cert, args.tls_key, args.allow_plaintext) if http else None
    from ragmesh_cli.mcp_tools import build_server

    clients = Clients(gateway, ingestion, None if http else api_key() or None, http)
    server = build_server(clients, args.collection)
    if where is not None:
        anyio.run(serve_http, server, clients, where)
    else:
        anyio.run(server.run_stdio_async)
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser, handler: Callable[..., int]) -> None:
    parser = sub.add_parser(
        "mcp",
        parents=[common],
        help="serve search, ask and collection status as MCP tools (stdio, or --http HOST:PORT)",
    )
    parser.add_argument("--collection", default="default", help="collection the tools use by default")
    parser.add_argument(
        "--http",
        default=None,
        metavar="HOST:PORT",
        help="serve streamable HTTP at http(s)://HOST:PORT/mcp instead of stdio; every request must "
        "carry a ragmesh API key the mesh accepts (Authorization: Bearer <key>)",
    )
    parser.add_argument("--tls-cert", metavar="PEM", help="--http: serve HTTPS with this certificate")
    parser.add_argument("--tls-key", metavar="PEM", help="--http: the certificate's private key")
    parser.add_argument(
        "--allow-plaintext",
        action="store_true",
        help="--http: serve plain HTTP on a non-loopback address (behind a proxy that terminates TLS)",
    )
    parser.set_defaults(func=handler)
