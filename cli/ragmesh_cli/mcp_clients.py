"""The MCP server's gateway clients: one ragmesh_client per API key (bounded, the oldest
closed first), and the key an HTTP request carries. Shared by the server (mcp_server) and its
tools (mcp_tools), which must not import each other."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from typing import Any

from ragmesh_cli.channels import gateway_client
from ragmesh_client import AsyncClient

# Distinct keys (HTTP callers) whose client and verdict are kept; the oldest goes first.
MAX_KEYS = 64
# An evicted client's calls in flight get this long to finish (the longest deadline: ask's).
EVICT_GRACE_S = 130.0


class Clients:
    """One ragmesh_client per API key (bounded); ``fixed_key`` set: that key for every call."""

    def __init__(self, gateway: str, ingestion: str, fixed_key: str | None, http: bool) -> None:
        self.gateway, self.ingestion = gateway, ingestion
        self.fixed_key, self.http = fixed_key, http
        self._clients: OrderedDict[str, AsyncClient] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, key: str | None) -> AsyncClient:
        digest = hashlib.sha256((key or "").encode()).hexdigest()
        if digest not in self._clients:
            if len(self._clients) >= MAX_KEYS:
                _, oldest = self._clients.popitem(last=False)
                closing = asyncio.get_running_loop().create_task(oldest.close(grace=EVICT_GRACE_S))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
            self._clients[digest] = gateway_client(self.gateway, self.ingestion, key=key or "")
        self._clients.move_to_end(digest)
        return self._clients[digest]

    def for_headers(self, headers: Any) -> AsyncClient:
        """Over HTTP the request's key (already accepted by the middleware), else the fixed one."""
        if self.http:
            return self.get(key_from_headers(headers))
        return self.get(self.fixed_key)


def key_from_headers(headers: Any) -> str | None:
    """The ragmesh API key a request carries: ``Authorization: Bearer <key>`` or ``x-api-key``."""
    if not headers:
        return None
    scheme, _, token = (headers.get("authorization") or "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return (headers.get("x-api-key") or "").strip() or None
