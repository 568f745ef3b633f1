"""Channels from the CLI to the mesh: TLS (and mTLS) from the RAGMESH_TLS_* settings, and the
API key (``--api-key`` or RAGMESH_API_KEY) sent with every call as ``authorization: Bearer``.

Every command that talks to a service opens its channel here, so one place decides how the CLI
authenticates; the key goes into call metadata only, never into output or logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from grpc import aio

from meshkit.addresses import grpc_target
from meshkit.auth import AUTHORIZATION_HEADER
from meshkit.client import channel_options
from meshkit.settings import MeshSettings
from meshkit.tls import ClientTLS
from meshkit.tls import open_channel as open_tls_channel

# Set from --api-key; wins over RAGMESH_API_KEY.
_api_key_override: str | None = None


def use_api_key(key: str | None) -> None:
    global _api_key_override
    _api_key_override = key or None


def api_key() -> str:
    return _api_key_override if _api_key_override is not None else MeshSettings().api_key


def client_tls() -> ClientTLS | None:
    """TLS settings of the CLI's environment (None: plaintext)."""
    return ClientTLS.from_settings(MeshSettings())


class ApiKeyInterceptor(aio.UnaryUnaryClientInterceptor, aio.UnaryStreamClientInterceptor):
    """Adds the API key to the metadata of every unary and server-streaming call."""

    def __init__(self, key: str) -> None:
        self._header = (AUTHORIZATION_HEADER, f"Bearer {key}")

    def _with_key(self, details: aio.ClientCallDetails) -> aio.ClientCallDetails:
        metadata = aio.Metadata(*(details.metadata or ()), self._header)
        return aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._with_key(client_call_details), request)

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._with_key(client_call_details), request)


def open_channel(address: str, options: Sequence[tuple[str, Any]] | None = None) -> aio.Channel:
    """A channel to a mesh address (one host:port, replicas, or dns:///name:port), with TLS and
    the API key when configured."""
    key = api_key()
    return open_tls_channel(
        grpc_target(address),
        channel_options() if options is None else options,
        client_tls(),
        # grpc-stubs leave aio.ClientInterceptor a placeholder type that only a cast satisfies.
        [cast(aio.ClientInterceptor, ApiKeyInterceptor(key))] if key else None,
    )
