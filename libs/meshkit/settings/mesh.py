"""The block every process of the mesh reads: process, limits, TLS, and the address of every
service (each service reads it plus its own module's class)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "RAGMESH_"
# Variables that no longer exist -> what replaced them.
RENAMED_VARIABLES = {"RAGMESH_SPARSE_ADDRESS": "RAGMESH_SPARSE_ADDRESSES"}


class MeshSettings(BaseSettings):
    """Settings shared by every process of the mesh."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # --- process ---
    host: str = Field("127.0.0.1", description="Address the gRPC server binds to.")
    port: int = Field(0, description="gRPC port of this process (0: pick a free one).")
    metrics_port: int = Field(0, description="Prometheus /metrics port (0: disabled).")
    state_dir: Path = Field(Path(".ragmesh"), description="Logs, pids and service data live here.")
    log_level: str = Field("INFO", description="Python log level.")
    log_format: Literal["json", "text"] = Field("json", description="Structured JSON or plain text logs.")
    shutdown_grace_s: float = Field(10.0, description="How long SIGTERM waits for in-flight calls.")
    # --- tracing (meshkit.rpc.tracing; docs/OBSERVABILITY.md): off unless one of the two is set ---
    trace_file: Path | None = Field(
        None,
        description="Append every finished span as one JSON line to this file (all processes may share "
        "one file: each batch is one O_APPEND write); unset: no file. 'ragmesh up --trace-file' sets it.",
    )
    otlp_endpoint: str = Field(
        "",
        description="OpenTelemetry collector to export spans to over OTLP/gRPC, e.g. http://127.0.0.1:4317 "
        "(http://: plaintext; https://: TLS verified against tls_ca_file, else the system CAs); "
        "empty: no OTLP export.",
    )
    trace_sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of new traces recorded when tracing is on; a call that arrives inside a trace "
        "follows its caller's decision.",
    )
    max_message_bytes: int = Field(
        64 * 1024 * 1024,
        description="Largest gRPC message accepted or sent; each service accepts less where its largest "
        "legal request is smaller (docs/SECURITY.md, request-size limits).",
    )
    max_concurrent_rpcs: int = Field(
        0,
        ge=0,
        description="Calls one server process runs at once; beyond it new calls get RESOURCE_EXHAUSTED at "
        "once. 0: the service's own default (docs/SECURITY.md: 256 on the public services, more on the "
        "internal stages, which take the gateway's fan-out).",
    )
    health_port: int = Field(
        0,
        ge=0,
        description="A second, plaintext port serving only grpc.health.v1, for probes that cannot present a "
        "mesh certificate (the kubelet's gRPC probes) when the main port requires one; 0: none.",
    )
    workers: int = Field(
        1,
        ge=1,
        description="Worker processes serving this process's port (pre-fork, SO_REUSEPORT: the kernel "
        "spreads connections, not calls, so it pays where many clients connect, e.g. the gateway; scale a "
        "stage behind a few gRPC channels with replicas). Stateless services only (embedder, reranker, "
        "planner, extractor, narrator, gateway); needs a fixed port. Worker i serves /metrics on "
        "metrics_port + i. A worker that dies takes the group down with a non-zero exit, for the "
        "supervisor (ragmesh up, Kubernetes) to restart.",
    )
    worker_index: int | None = Field(
        None, ge=0, description="Set by the pre-fork parent in each worker process; never set by hand."
    )

    # --- downstream addresses: host:port, replicas comma separated (IP literals), or dns:///name:port ---
    embedder_address: str = Field("127.0.0.1:50051", description="Embedder service.")
    index_addresses: str = Field(
        "127.0.0.1:50052",
        description="Index shards, comma separated, in shard order; replicas of one shard separated by | "
        "(a:1|a:2,b:1: shard 0 on two replicas, shard 1 on one), or one dns:///name:port per shard.",
    )
    sparse_addresses: str = Field(
        "127.0.0.1:50053",
        description="Sparse (BM25 + exact) shards, in the form of index_addresses (shards comma separated, "
        "replicas of one shard separated by |); a document lives on shard "
        "meshkit.domain.ids.document_shard(doc_id, shards).",
    )
    ingestion_address: str = Field("127.0.0.1:50054", description="Ingestion API service.")
    planner_address: str = Field("127.0.0.1:50055", description="Query planner service.")
    gateway_address: str = Field("127.0.0.1:50056", description="Search gateway service.")
    reranker_address: str = Field("127.0.0.1:50057", description="Reranker (cross-encoder) service.")
    extractor_address: str = Field("127.0.0.1:50058", description="Fact extractor service.")
    narrator_address: str = Field("127.0.0.1:50059", description="Narrator (cited answers) service.")

    # --- client policy for outgoing calls ---
    client_timeout_s: float = Field(10.0, description="Deadline of an outgoing call with no caller deadline.")
    client_retry_attempts: int = Field(3, description="Attempts for idempotent calls on UNAVAILABLE.")
    client_retry_backoff_s: float = Field(0.1, description="First retry backoff; doubles, jittered.")
    breaker_fail_max: int = Field(5, description="Consecutive failures that open a downstream's breaker.")
    breaker_reset_s: float = Field(10.0, description="Seconds an open breaker waits before a trial call.")

    # --- NATS JetStream ---
    nats_url: str = Field(
        "nats://127.0.0.1:4222",
        description="NATS server URL(s), comma separated; tls://... connects with TLS, verified against "
        "tls_ca_file.",
    )
    nats_user: str = Field(
        "", description="NATS user of this service (per-service credentials and permissions); '' for none."
    )
    nats_password: str = Field("", description="Password of nats_user (never logged).", repr=False)
    nats_stream_replicas: int = Field(
        1,
        ge=1,
        le=5,
        description="Replicas of every JetStream stream and KV bucket ragmesh creates (3 on a 3-node "
        "NATS cluster, as the Kubernetes manifests run; 1 for a single server).",
    )

    # --- object store (S3 API) ---
    s3_endpoint: str = Field("127.0.0.1:8333", description="S3 endpoint host:port.")
    s3_access_key: str = Field("ragmesh", description="S3 access key.")
    s3_secret_key: str = Field("ragmesh-secret", description="S3 secret key (never logged).", repr=False)
    s3_secure: bool = Field(
        False, description="Use HTTPS for S3, verified against tls_ca_file when set (else the system CAs)."
    )
    s3_region: str = Field("us-east-1", description="S3 region name.")
    documents_bucket: str = Field("ragmesh-documents", description="Raw documents.")
    snapshots_bucket: str = Field("ragmesh-snapshots", description="Index and sparse snapshots.")
    models_bucket: str = Field("ragmesh-models", description="Model directories.")

    # --- security (docs/SECURITY.md) ---
    service_auth: Literal["off", "mtls"] = Field(
        "off",
        description="mtls: every gRPC server serves TLS; internal services require a mesh client certificate "
        "(spiffe://ragmesh/<identity>) and admit per method only the identities allowed to call it; the "
        "gateway and the ingestion API require API keys (RAGMESH_API_KEYS_FILE) and no certificate; clients "
        "present this process's certificate. off: as configured by the other TLS settings, no identities.",
    )
    api_keys_file: Path | None = Field(
        None,
        description="JSON file of API keys (sha256 digests, collections, rates) checked by the gateway and "
        "the ingestion API; unset: no auth (local development only).",
    )
    api_keys_reload_s: float = Field(
        2.0,
        ge=0,
        description="How often the gateway and the ingestion API check api_keys_file for changes and load "
        "them without a restart (an invalid file keeps the previous keys); 0: read at start only.",
    )
    api_key_rate_per_s: float = Field(
        0.0, ge=0, description="Default requests/s per API key when its entry sets none (0: unlimited)."
    )
    api_key_burst: int = Field(0, ge=0, description="Default burst per API key (0: one second's worth).")
    api_key: str = Field(
        "",
        description="API key this client (the CLI) presents to the gateway and ingestion (never logged).",
        repr=False,
    )
    tls_cert_file: Path | None = Field(None, description="Server: PEM certificate chain; set: serve TLS.")
    tls_key_file: Path | None = Field(None, description="Server: PEM private key of tls_cert_file.")
    tls_client_ca_file: Path | None = Field(
        None,
        description="Server: PEM CA bundle; set: require client certificates signed by it (mTLS). With "
        "service_auth=mtls, default: tls_ca_file.",
    )
    tls_ca_file: Path | None = Field(
        None, description="Client: PEM CA bundle; set: connect with TLS, verifying servers against it."
    )
    tls_client_cert_file: Path | None = Field(
        None,
        description="Client: PEM certificate presented to servers that require one (mTLS). With "
        "service_auth=mtls, default: tls_cert_file (one certificate per service, server and client).",
    )
    tls_client_key_file: Path | None = Field(
        None, description="Client: PEM private key of tls_client_cert_file."
    )
    tls_server_name: str = Field(
        "", description="Client: name the server certificate must carry (default: the host dialled)."
    )

    @model_validator(mode="after")
    def _no_renamed_variables(self) -> MeshSettings:
        # An old variable left in a deployment would otherwise be ignored silently, and every
        # process would dial the default address.
        for old, new in RENAMED_VARIABLES.items():
            if os.environ.get(old):
                raise ValueError(f"{old} was renamed to {new} (shards comma separated, replicas |)")
        return self

    def index_address_list(self) -> list[str]:
        """One address per shard, in shard order, each in the form every other address setting takes
        (replicas comma separated): ``a:1|a:2,b:1`` gives ``["a:1,a:2", "b:1"]``."""
        return shard_address_list(self.index_addresses)

    def sparse_address_list(self) -> list[str]:
        """The sparse shards' addresses, as index_address_list gives the index's."""
        return shard_address_list(self.sparse_addresses)


def shard_address_list(value: str) -> list[str]:
    """``a:1|a:2,b:1`` -> ``["a:1,a:2", "b:1"]``: one address per shard, replicas comma separated."""
    shards = [a.strip() for a in value.split(",") if a.strip()]
    return [",".join(r.strip() for r in shard.split("|") if r.strip()) for shard in shards]
