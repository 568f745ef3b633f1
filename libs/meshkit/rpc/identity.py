"""Service identities and per-method caller allow-lists for the internal services.

With ``RAGMESH_SERVICE_AUTH=mtls`` every mesh process holds a certificate from the mesh CA whose URI
SAN names its identity (``spiffe://ragmesh/<identity>``, CN ``<identity>``). An internal server
requires a client certificate at the TLS handshake, so a caller without one never gets a
connection; the handshake also proves the caller holds the certificate's key. Each internal
service declares next to its servicer which identities may call each of its methods
(``Callers``), and the server interceptor checks the verified identity before the handler runs:

- no ragmesh identity in the certificate (or two): UNAUTHENTICATED;
- an identity the method does not admit: PERMISSION_DENIED, naming the identity and the method;
- a method with no rule: PERMISSION_DENIED for everyone (fail closed: a method added to a
  contract is nobody's until someone says who may call it).

Health checks and reflection are not checked (probes; they reveal no data). The public services
(gateway, ingestion API) authenticate callers with API keys instead (meshkit.rpc.auth). Who calls
whom is in docs/SECURITY.md.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography import x509

from meshkit.core.errors import permission_denied, unauthenticated
from meshkit.rpc.metrics import IDENTITY_REQUESTS

log = logging.getLogger("meshkit.rpc.identity")

SPIFFE_PREFIX = "spiffe://ragmesh/"

GATEWAY = "gateway"
INGESTION = "ingestion"
INGESTION_WORKER = "ingestion-worker"
EMBEDDER = "embedder"
INDEX = "index"
SPARSE = "sparse"
PLANNER = "planner"
RERANKER = "reranker"
EXTRACTOR = "extractor"
NARRATOR = "narrator"
# Operators: the CLI, load tests, consistency checks.
OPS = "ops"

MESH_IDENTITIES: tuple[str, ...] = (
    GATEWAY,
    INGESTION,
    INGESTION_WORKER,
    EMBEDDER,
    INDEX,
    SPARSE,
    PLANNER,
    RERANKER,
    EXTRACTOR,
    NARRATOR,
    OPS,
)
_IDENTITY_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
# The auth-context property where gRPC puts a verified peer certificate's URI SANs.
PEER_URI_PROPERTY = "peer_uri"
NO_IDENTITY_LABEL = "-"

# Method name (as in the contract, e.g. "Search") -> the identities that may call it.
Callers = Mapping[str, frozenset[str]]


def allow(*identities: str) -> frozenset[str]:
    """The identities a method admits; a name outside the mesh's is a declaration bug."""
    unknown = sorted(set(identities) - set(MESH_IDENTITIES))
    if unknown:
        raise ValueError(f"unknown identities {unknown}; the mesh has {list(MESH_IDENTITIES)}")
    return frozenset(identities)


def spiffe_id(identity: str) -> str:
    if not _IDENTITY_RE.fullmatch(identity):
        raise ValueError(f"identity {identity[:80]!r} is not 1-63 chars of [a-z0-9-]")
    return SPIFFE_PREFIX + identity


def identity_of_uri(uri: str) -> str | None:
    """``gateway`` for ``spiffe://ragmesh/gateway``; None for any other URI."""
    if not uri.startswith(SPIFFE_PREFIX):
        return None
    name = uri[len(SPIFFE_PREFIX) :]
    return name if _IDENTITY_RE.fullmatch(name) else None


def _one_identity(uris: Iterable[str]) -> str | None:
    found = {name for name in map(identity_of_uri, uris) if name is not None}
    # A certificate naming two identities is refused rather than read as either.
    return found.pop() if len(found) == 1 else None


def peer_identity(auth_context: Mapping[str, Iterable[bytes]]) -> str | None:
    """The ragmesh identity of a call's verified client certificate, or None (no certificate,
    no ragmesh URI SAN, or more than one)."""
    uris = auth_context.get(PEER_URI_PROPERTY) or ()
    return _one_identity(u.decode("utf-8", "replace") for u in uris)


def certificate_identity(pem: bytes) -> str | None:
    """The ragmesh identity a PEM certificate names (its first certificate, for a chain)."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    return _one_identity(sans.get_values_for_type(x509.UniformResourceIdentifier))


class IdentityGuard:
    """Checks the caller identity of every call to one internal service."""

    def __init__(self, service: str, callers: Callers) -> None:
        self.service = service
        self.callers = dict(callers)

    def check(self, method: str, auth_context: Mapping[str, Iterable[bytes]]) -> str:
        """The caller's identity, or a ServiceError (UNAUTHENTICATED, PERMISSION_DENIED)."""
        identity = peer_identity(auth_context)
        if identity is None:
            IDENTITY_REQUESTS.labels(self.service, NO_IDENTITY_LABEL, "unauthenticated").inc()
            raise unauthenticated(
                f"{self.service}.{method} needs a mesh client certificate naming one "
                f"{SPIFFE_PREFIX}<identity>"
            )
        allowed = self.callers.get(method)
        if allowed is None or identity not in allowed:
            IDENTITY_REQUESTS.labels(self.service, identity, "permission_denied").inc()
            why = "no identity may call it (no rule)" if allowed is None else "it is not among its callers"
            raise permission_denied(f"identity {identity!r} may not call {self.service}.{method}: {why}")
        IDENTITY_REQUESTS.labels(self.service, identity, "ok").inc()
        return identity


def check_declaration(service: str, callers: Callers, methods: Iterable[str]) -> list[str]:
    """Problems of a service's declaration against its contract's methods: methods without a
    rule (nobody could call them) and rules for methods the contract does not have."""
    methods = set(methods)
    problems = [f"{service}.{m} has no caller rule" for m in sorted(methods - set(callers))]
    extra = sorted(set(callers) - methods)
    problems += [f"{service} has a rule for {m}, which its contract lacks" for m in extra]
    return problems


def describe(callers: Callers) -> dict[str, Any]:
    """The declaration as plain data (sorted), for docs and logs."""
    return {method: sorted(ids) for method, ids in sorted(callers.items())}
