"""How a client reaches the mesh: addresses, API key, TLS, deadlines and the retry policy.

Auth and transport match the ``ragmesh`` CLI and the services' own clients (meshkit): the API key
travels as ``authorization: Bearer <key>`` call metadata (never in logs or errors), each call
carries a fresh ``x-request-id`` that the servers log and echo in their trailers, TLS verifies
the server against a CA bundle and presents a client certificate when one is given (mTLS).

Retries are declared once, as the channel's gRPC service config, for the calls that are safe to
repeat (reads: Search, Ask, AskStream before its first message, the status and dead-letter
listings) and only on UNAVAILABLE and RESOURCE_EXHAUSTED, with exponential backoff. Writes
(IngestDocuments, DeleteDocuments, ReplayDeadLetters) are never retried by the client.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

GATEWAY_SERVICE = "ragmesh.gateway.v1.GatewayService"
INGESTION_SERVICE = "ragmesh.ingestion.v1.IngestionService"
# Reads: repeating one changes nothing on the server.
SAFE_METHODS: dict[str, tuple[str, ...]] = {
    GATEWAY_SERVICE: ("Search", "Ask", "AskStream"),
    INGESTION_SERVICE: (
        "GetDocumentStatus",
        "GetCollectionStatus",
        "ListCollections",
        "ListDocuments",
        "ListDeadLetters",
        # Idempotent by design: a step recomputes its plan from the collection record and the
        # status view, so a repeated step never submits a document twice.
        "ReindexCollection",
        # Sets the record to the value sent: a repeat writes the same.
        "SetCollectionCalibration",
    ),
}
RETRYABLE_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")
AUTHORIZATION_HEADER = "authorization"
REQUEST_ID_HEADER = "x-request-id"
DEFAULT_GATEWAY = "127.0.0.1:50056"
DEFAULT_INGESTION = "127.0.0.1:50054"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_SCHEMES = frozenset({"dns", "ipv4", "ipv6", "unix", "unix-abstract", "vsock", "xds", "google-c2p"})


@dataclass(frozen=True)
class RetryPolicy:
    """gRPC's retry policy for the safe methods; ``max_attempts=1`` turns retries off.

    Retries are throttled per channel (gRPC's retryThrottling): every failed attempt spends a
    token, every success earns back ``throttle_token_ratio``, and with half the tokens gone no
    call retries, so an outage does not multiply the load on a struggling mesh."""

    max_attempts: int = 4
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 2.0
    backoff_multiplier: float = 2.0
    throttle_max_tokens: int = 10
    throttle_token_ratio: float = 0.1

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 5:
            raise ValueError("max_attempts must be 1..5 (gRPC caps retries at 5 attempts)")
        if self.initial_backoff_s <= 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("backoff must be > 0 and max_backoff_s >= initial_backoff_s")
        if self.backoff_multiplier < 1:
            raise ValueError("backoff_multiplier must be >= 1")

    def service_config(self) -> str:
        """The channel's service config: the policy on every safe method, nothing on the others."""
        names = [{"service": s, "method": m} for s, methods in SAFE_METHODS.items() for m in methods]
        method: dict[str, Any] = {"name": names}
        config: dict[str, Any] = {"methodConfig": [method]}
        if self.max_attempts > 1:
            method["retryPolicy"] = {
                "maxAttempts": self.max_attempts,
                "initialBackoff": f"{self.initial_backoff_s}s",
                "maxBackoff": f"{self.max_backoff_s}s",
                "backoffMultiplier": self.backoff_multiplier,
                "retryableStatusCodes": list(RETRYABLE_CODES),
            }
            config["retryThrottling"] = {
                "maxTokens": self.throttle_max_tokens,
                "tokenRatio": self.throttle_token_ratio,
            }
        return json.dumps(config)


@dataclass(frozen=True)
class Timeouts:
    """Default deadline of each kind of call, in seconds; every call also takes ``timeout=``."""

    search: float = 30.0
    ask: float = 120.0
    ingest: float = 60.0
    other: float = 30.0


@dataclass(frozen=True)
class TLS:
    """Verify the servers against ``ca_file``; present ``cert_file``/``key_file`` for mTLS.
    ``server_name`` overrides the name checked in the server's certificate."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str = ""

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be given together")

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


@dataclass(frozen=True)
class ClientConfig:
    gateway: str = DEFAULT_GATEWAY
    ingestion: str = DEFAULT_INGESTION
    api_key: str | None = field(default=None, repr=False)
    tls: TLS | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ClientConfig:
        """The settings the ragmesh CLI and services read: RAGMESH_GATEWAY_ADDRESS,
        RAGMESH_INGESTION_ADDRESS, RAGMESH_API_KEY, RAGMESH_TLS_CA_FILE,
        RAGMESH_TLS_CLIENT_CERT_FILE / _KEY_FILE, RAGMESH_TLS_SERVER_NAME."""
        env = os.environ if env is None else env

        def path(name: str) -> Path | None:
            value = env.get(f"RAGMESH_{name}", "").strip()
            return Path(value) if value else None

        ca = path("TLS_CA_FILE")
        tls = (
            TLS(
                ca,
                path("TLS_CLIENT_CERT_FILE"),
                path("TLS_CLIENT_KEY_FILE"),
                env.get("RAGMESH_TLS_SERVER_NAME", ""),
            )
            if ca is not None
            else None
        )
        values: dict[str, Any] = {
            "gateway": env.get("RAGMESH_GATEWAY_ADDRESS") or DEFAULT_GATEWAY,
            "ingestion": env.get("RAGMESH_INGESTION_ADDRESS") or DEFAULT_INGESTION,
            "api_key": env.get("RAGMESH_API_KEY") or None,
            "tls": tls,
        }
        values.update(overrides)
        return cls(**values)

    def channel_options(self) -> list[tuple[str, Any]]:
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2_000),
            ("grpc.enable_retries", 1),
            ("grpc.service_config", self.retry.service_config()),
            ("grpc.lb_policy_name", "round_robin"),
        ]
        if self.tls is not None and self.tls.server_name:
            options.append(("grpc.ssl_target_name_override", self.tls.server_name))
        return options

    def metadata(self, request_id: str) -> tuple[tuple[str, str], ...]:
        """Call metadata: the request id, and the API key when one is set."""
        if self.api_key:
            return ((REQUEST_ID_HEADER, request_id), (AUTHORIZATION_HEADER, f"Bearer {self.api_key}"))
        return ((REQUEST_ID_HEADER, request_id),)


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def grpc_target(address: str) -> str:
    """``host:port``, a target naming its resolver (``dns:///name:port``), or a comma separated
    list of IPv4 replicas (balanced round-robin)."""
    address = address.strip()
    if not address:
        raise ValueError("empty address: give host:port")
    scheme, sep, _ = address.partition(":")
    if sep and scheme.lower() in _SCHEMES:
        return address
    if "," in address:
        return "ipv4:" + ",".join(part.strip() for part in address.split(",") if part.strip())
    return address
