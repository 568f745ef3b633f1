"""What the replicated stores (index shards, sparse) answer about documents, in the same shape:
a replacement's outcome and a document's listing entry."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplaceResult:
    """The outcome of replacing documents' chunks: what was written and removed, the chunk ids
    asked to keep that the store did not hold, and the documents whose write was fenced off."""

    upserted: int
    removed: int
    missing_chunk_ids: list[str]
    stale_doc_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DocumentEntry:
    """A stored document: its id, the fence of its last write, its chunks."""

    doc_id: str
    fence: int
    chunk_ids: list[str]
