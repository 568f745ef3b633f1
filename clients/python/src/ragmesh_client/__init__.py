"""ragmesh-client: typed sync and asyncio clients for the ragmesh gateway (search, ask, streamed
ask) and ingestion API (ingest, status, listing, delete, dead letters, reindex), with deadlines on every call,
retries only for safe reads, API keys and TLS.

    from ragmesh_client import Client
    with Client.from_env() as rm:
        print(rm.ask("default", "How do I rotate an API key?").text)
"""

from ragmesh_client._convert import Filter
from ragmesh_client.aio import AsyncClient
from ragmesh_client.client import Client
from ragmesh_client.config import TLS, ClientConfig, RetryPolicy, Timeouts
from ragmesh_client.errors import (
    DeadlineExceededError,
    DocumentsRejectedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RagmeshError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)
from ragmesh_client.types import (
    EXISTS,
    Answer,
    AskDelta,
    AskEvent,
    AskProgress,
    Citation,
    CollectionCalibration,
    CollectionStatus,
    DeadLetter,
    DeadLetterPage,
    Degradation,
    Document,
    DocumentStatus,
    DocumentSummary,
    Exists,
    IngestResult,
    Location,
    Not,
    ReindexProgress,
    ReplayResult,
    SearchResponse,
    SearchResult,
    Sentence,
    Source,
    Submitted,
)

__all__ = [
    "EXISTS",
    "TLS",
    "Answer",
    "AskDelta",
    "AskEvent",
    "AskProgress",
    "AsyncClient",
    "Citation",
    "Client",
    "ClientConfig",
    "CollectionCalibration",
    "CollectionStatus",
    "DeadLetter",
    "DeadLetterPage",
    "DeadlineExceededError",
    "Degradation",
    "Document",
    "DocumentStatus",
    "DocumentSummary",
    "DocumentsRejectedError",
    "Exists",
    "FailedPreconditionError",
    "Filter",
    "IngestResult",
    "InvalidArgumentError",
    "Location",
    "Not",
    "NotFoundError",
    "PermissionDeniedError",
    "RagmeshError",
    "ReindexProgress",
    "ReplayResult",
    "ResourceExhaustedError",
    "RetryPolicy",
    "SearchResponse",
    "SearchResult",
    "Sentence",
    "Source",
    "Submitted",
    "Timeouts",
    "UnauthenticatedError",
    "UnavailableError",
]
