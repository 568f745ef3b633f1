"""The ingestion API and its workers (services/ingestion)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from meshkit.settings.embedder import default_embedder_tokenizer
from meshkit.settings.mesh import MeshSettings


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
    reindex_batch_documents: int = Field(
        256,
        ge=1,
        le=10_000,
        description="Most documents one ReindexCollection call submits to the new generation (or deletes "
        "from the old one): each call stays short, the CLI calls again.",
    )
    reindex_retire_delay_s: float = Field(
        15.0,
        ge=0,
        description="Seconds after a reindex switch before the old generation is deleted: longer than "
        "the gateways' record cache (gateway_collection_cache_s) plus a search's deadline, so no "
        "reader is still searching it.",
    )
    ingest_replay_batch: int = Field(
        256,
        ge=1,
        le=10_000,
        description="Most dead letters one ReplayDeadLetters call handles (then a cursor).",
    )
    ingest_index_dir: Path | None = Field(
        None,
        description="Where the ingestion API keeps its status index (SQLite: every document's state, "
        "source and hashes in (collection, doc id) order, counts per collection and state, the status "
        "bucket's sequence applied), derived from the status bucket and rebuilt from it when missing. "
        "One per API process. Default: <state_dir>/ingestion-index.",
    )
    ingest_index_start_wait_s: float = Field(
        5.0,
        ge=0,
        description="How long the ingestion API's start waits for its status index to catch up with the "
        "status bucket before it serves anyway; until caught up, the calls answered from the index "
        "(collection status, listings, reindex) are refused with UNAVAILABLE and a retry hint.",
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
        default_factory=default_embedder_tokenizer,
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

    def index_dir(self) -> Path:
        """The directory of the API's status index (ingest_index_dir, else under state_dir)."""
        return self.ingest_index_dir or self.state_dir / "ingestion-index"

    def retry_backoffs(self) -> list[float]:
        return [float(x) for x in self.ingest_retry_backoff_s.split(",") if x.strip()]
