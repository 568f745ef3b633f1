"""What the pipeline (services/ingestion/pipeline.py) carries per claimed document: ``Job`` (its
event, claim, prepared chunks, previous record and outcome), ``PreparedChunk``, and
``JobFailure``, the caller-safe reason a document could not be indexed (``failure_of`` maps an
exception to one and logs the details instead).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from meshkit.rpc import tracing
from meshkit.rpc.client import DownstreamError
from meshkit.storage.objectstore import UNAVAILABLE_ERRORS
from ragmesh.common.v1 import common_pb2
from services.ingestion.chunking import ChunkDraft
from services.ingestion.events import IngestEvent
from services.ingestion.frontmatter import merged_metadata
from services.ingestion.lifecycle.entries import DocRecord, Versioned
from services.ingestion.lifecycle.outcomes import COUNTED, PERMANENT, TRANSIENT, Claim, FailureKind
from services.ingestion.lifecycle.retry import STATE_STORE_ERRORS

# The pipeline's logger: failure_of was split out of it, its log lines keep their name.
log = logging.getLogger("services.ingestion.pipeline")

# DownstreamError reasons that say the downstream is unwell, not that the document is bad.
TRANSIENT_DOWNSTREAM = frozenset({"unavailable", "deadline", "breaker_open"})


class JobFailure(Exception):
    """A document that could not be indexed. ``permanent``: retrying cannot help;
    ``transient``: infrastructure trouble, retried for a window without counting an attempt.
    The reason is shown to callers (status, dead letters): no internals in it."""

    def __init__(self, reason: str, *, permanent: bool, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent
        self.transient = transient and not permanent

    @property
    def kind(self) -> FailureKind:
        return PERMANENT if self.permanent else TRANSIENT if self.transient else COUNTED


def failure_of(exc: BaseException, stage: str, job: Job | None = None) -> JobFailure:
    """A caller-safe failure for an exception raised while ``stage`` ran; the details are
    logged (with the request id, through the logging context) instead."""
    if isinstance(exc, JobFailure):
        return exc
    if isinstance(exc, DownstreamError):
        transient = exc.reason in TRANSIENT_DOWNSTREAM
        failure = JobFailure(
            f"{exc.target} {exc.reason.replace('_', ' ')}", permanent=False, transient=transient
        )
    elif isinstance(exc, STATE_STORE_ERRORS):
        failure = JobFailure("state store unavailable", permanent=False, transient=True)
    elif isinstance(exc, UNAVAILABLE_ERRORS):
        failure = JobFailure("object store unavailable", permanent=False, transient=True)
    else:
        failure = JobFailure(f"internal error while {stage}", permanent=False)
    log.warning(
        "document step failed",
        extra={
            "stage": stage,
            "doc_id": job.event.doc_id if job else "",
            "reason": failure.reason,
            "error": repr(exc),
        },
    )
    return failure


@dataclass
class PreparedChunk:
    chunk_id: str
    draft: ChunkDraft
    vector: list[float] | None = None


@dataclass
class Job:
    """One claimed event and what the pipeline learns about it."""

    event: IngestEvent
    claim: Claim
    chunks: list[PreparedChunk] = field(default_factory=list)
    title: str = ""
    # Metadata from the document's text (front matter, tags); the caller's keys override it.
    document_metadata: dict[str, str] = field(default_factory=dict)
    record: Versioned | None = None
    failure: JobFailure | None = None
    # The record was written (its previous object may be cleaned up).
    committed: bool = False
    # The span of the event being processed (None with tracing off), ended when it is settled.
    trace: tracing.Incoming | None = None

    @property
    def key(self) -> str:
        return self.event.key

    def source(self) -> common_pb2.DocumentSource:
        """Title, source URI and metadata, stored with the document in both stores."""
        return common_pb2.DocumentSource(
            title=self.title,
            source_uri=self.event.source_uri,
            metadata=merged_metadata(self.document_metadata, self.event.metadata),
        )

    @property
    def fence(self) -> int:
        return self.claim.fence

    @property
    def lost(self) -> bool:
        return self.claim.lost

    @property
    def live(self) -> bool:
        return self.failure is None and not self.claim.lost

    @property
    def previous_record(self) -> DocRecord | None:
        return self.record.value if self.record else None

    @property
    def previous_chunk_ids(self) -> set[str]:
        record = self.previous_record
        return set(record.chunk_ids) if record else set()

    def new_chunks(self) -> list[PreparedChunk]:
        previous = self.previous_chunk_ids
        return [c for c in self.chunks if c.chunk_id not in previous]


Settle = Callable[[Job], Awaitable[None]]
