"""The secure local stack the tests of this folder run against, as ``ragmesh up --secure`` runs
it (two index shards, two ingestion workers, two embedder replicas, a gateway of two processes,
the local LLM server, two tenants with an API key each), a tenant's view of it, and the status a
refused call got."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from meshkit.rpc.tls import ClientTLS
from ragmesh_cli.stack import ALL_SERVICES, Stack
from tests.integration.meshclients import Mesh

ALPHA, BETA = "alpha", "beta"
TENANTS = {"tenant-a": ([ALPHA], [ALPHA]), "tenant-b": ([BETA], [BETA])}


ALPHA_DOCS = {
    "rotation.md": "# Rotating API keys\n\nTo rotate an API key in ragmesh, mint a new key with ragmesh keys "
    "new, move every client to it, then remove the old entry from the keys file and restart the gateway.",
    "limits.md": "# Request limits\n\nEvery ragmesh server caps the calls it runs at once and refuses "
    "messages larger than its largest legal request with RESOURCE_EXHAUSTED.",
}


BROKEN = "broken.pdf"
BETA_SECRET = "The beta tenant's launch code word is zanzibarite; ragmesh keeps it in collection beta."


def start_secure_stack(state_dir: Path) -> Stack:
    """The stack under test: everything on, as ``ragmesh up --secure`` runs it."""
    stack = Stack(
        state_dir,
        workers=2,
        index_shards=2,
        services=ALL_SERVICES,
        secure=True,
        api_keys=TENANTS,
        # A replica list (one TLS name for several addresses) and pre-fork workers on one port.
        replicas={"embedder": 2},
        processes={"gateway": 2},
    )
    stack.up()
    return stack


def tenant(stack: Stack, name: str) -> Mesh:
    """A tenant's view: TLS without a certificate (it has none), its API key on every call."""
    return Mesh(
        stack, tls=ClientTLS(stack.client_tls().ca_file, server_name="localhost"), api_key=stack.api_key(name)
    )


async def refused(call: Awaitable[Any]) -> grpc.StatusCode:
    """The status a call was refused with (the test fails if it succeeded)."""
    try:
        reply = await call
    except aio.AioRpcError as exc:
        return exc.code()
    raise AssertionError(f"the call succeeded: {str(reply)[:300]}")
