"""How every process connects to NATS: the server list, this service's credentials and TLS.

    nc = await nats.connect(**connect_options(settings), name="ingestion-api", ...)

- ``RAGMESH_NATS_USER`` / ``RAGMESH_NATS_PASSWORD``: the service's own NATS user, whose permissions
  the server config limits to the subjects and streams it uses (docs/SECURITY.md). The user's
  request replies come back under its own inbox prefix (``inbox_prefix``), so a user never needs
  the right to read the shared ``_INBOX.>``, where other services' replies travel.
- ``tls://`` URLs: TLS, the server verified against ``RAGMESH_TLS_CA_FILE`` (else the system CAs).

The password goes to the NATS client only, never to a log or an error message.
"""

from __future__ import annotations

import ssl
from typing import Any

from meshkit.settings import MeshSettings

TLS_SCHEME = "tls://"


def inbox_prefix(user: str) -> str:
    """The reply-subject prefix of a NATS user; the server config grants each user its own."""
    return f"_INBOX_{user}"


def servers_of(settings: MeshSettings) -> list[str]:
    return [url.strip() for url in settings.nats_url.split(",") if url.strip()]


def tls_context(settings: MeshSettings) -> ssl.SSLContext:
    """A client context verifying the server against the mesh CA (the system's without one)."""
    ca = settings.tls_ca_file
    return ssl.create_default_context(cafile=str(ca) if ca is not None else None)


def connect_options(settings: MeshSettings) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect``: servers, credentials, inbox prefix and TLS."""
    servers = servers_of(settings)
    options: dict[str, Any] = {"servers": servers}
    if settings.nats_user:
        options.update(
            user=settings.nats_user,
            password=settings.nats_password,
            inbox_prefix=inbox_prefix(settings.nats_user),
        )
    if any(url.startswith(TLS_SCHEME) for url in servers):
        options["tls"] = tls_context(settings)
    return options
