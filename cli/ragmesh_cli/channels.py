"""Channels from the CLI to the mesh: TLS (and mTLS) from the RAGMESH_TLS_* settings, and the
API key (``--api-key`` or RAGMESH_API_KEY) sent with every call as ``authorization: Bearer``.

Against a secure local stack (``ragmesh up --secure``) the CLI needs none of them: what the
environment does not set comes from the stack's state dir (its CA, the ``ops`` certificate and
API key; ragmesh_cli.secure), so ``ragmesh ingest/search/ask/status`` work unchanged.

Every command that talks to a service opens its channel here, so one place decides how the CLI
authenticates; the key goes into call metadata only, never into output or logs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from grpc import aio

from meshkit.rpc.addresses import grpc_target
from meshkit.rpc.auth import AUTHORIZATION_HEADER
from meshkit.rpc.client import channel_options
from meshkit.rpc.tls import ClientTLS
from meshkit.rpc.tls import open_channel as open_tls_channel
from meshkit.settings import ENV_PREFIX, MeshSettings
from ragmesh_client import TLS, AsyncClient, RetryPolicy

# Set from --api-key; wins over RAGMESH_API_KEY.
_api_key_override: str | None = None
# Settings from the secure stack of the state dir (ragmesh_cli.secure.client_profile).
_profile: dict[str, Any] = {}


def use_api_key(key: str | None) -> None:
    global _api_key_override
    _api_key_override = key or None


def use_state_dir(state_dir: Path | None) -> None:
    """Take what the environment leaves unset from the secure stack recorded in ``state_dir``."""
    from ragmesh_cli.secure import client_profile
    from ragmesh_cli.state import read_state

    global _profile
    _profile = {}
    if state_dir is None or not (read_state(state_dir) or {}).get("secure"):
        return
    _profile = {
        name: value
        for name, value in (client_profile(state_dir) or {}).items()
        if f"{ENV_PREFIX}{name.upper()}" not in os.environ
    }


def settings() -> MeshSettings:
    """The CLI's settings: the environment, completed by the state dir's secure stack."""
    return MeshSettings(**_profile)


def api_key() -> str:
    return _api_key_override if _api_key_override is not None else settings().api_key


def client_tls() -> ClientTLS | None:
    """TLS settings of the CLI (None: plaintext)."""
    return ClientTLS.from_settings(settings())


class _ApiKey:
    """Adds the API key to the metadata of a call."""

    def __init__(self, key: str) -> None:
        self._header = (AUTHORIZATION_HEADER, f"Bearer {key}")

    def _with_key(self, details: aio.ClientCallDetails) -> aio.ClientCallDetails:
        metadata = aio.Metadata(*(details.metadata or ()), self._header)
        return aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class UnaryApiKeyInterceptor(_ApiKey, aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._with_key(client_call_details), request)


class StreamApiKeyInterceptor(_ApiKey, aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._with_key(client_call_details), request)


def api_key_interceptors(key: str) -> list[aio.ClientInterceptor]:
    """Interceptors that send ``key`` with every unary and server-streaming call. One object per
    kind: grpc.aio files an interceptor under the first kind it implements only, so one object
    for both would leave streaming calls (AskStream) without the key."""
    # grpc-stubs leave aio.ClientInterceptor a placeholder type that only a cast satisfies.
    return [
        cast(aio.ClientInterceptor, UnaryApiKeyInterceptor(key)),
        cast(aio.ClientInterceptor, StreamApiKeyInterceptor(key)),
    ]


def open_channel(address: str, options: Sequence[tuple[str, Any]] | None = None) -> aio.Channel:
    """A channel to a mesh address (one host:port, replicas, or dns:///name:port), with TLS and
    the API key when configured."""
    key = api_key()
    return open_tls_channel(
        grpc_target(address),
        channel_options() if options is None else options,
        client_tls(),
        api_key_interceptors(key) if key else None,
    )


def gateway_client(
    address: str, ingestion: str | None = None, *, key: str | None = None, retry: RetryPolicy | None = None
) -> AsyncClient:
    """A ragmesh_client to the gateway at ``address`` (and the ingestion API at ``ingestion``)
    with the CLI's TLS (the same as ``open_channel``'s), ``key`` (None: the CLI's API key; "":
    none) and ``retry`` (None: the client's default policy)."""
    key, tls = api_key() if key is None else key, client_tls()
    return AsyncClient(
        address or None,
        ingestion=ingestion,
        api_key=key or None,
        tls=None if tls is None else TLS(tls.ca_file, tls.cert_file, tls.key_file, tls.server_name),
        retry=retry,
    )


def ingestion_client(address: str, *, key: str | None = None) -> AsyncClient:
    """A ragmesh_client for the ingestion API at ``address`` only (its gateway channel, opened on
    first use, is never used)."""
    return gateway_client("", address, key=key)
