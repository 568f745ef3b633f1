"""The values a sparse collection takes and gives back: chunk records (what is indexed and what
a read returns), document sources, the replacement of a document's chunks and its result,
listing entries and search hits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChunkRecord:
    chunk_id: str
    doc_id: str
    title: str
    text: str
    # Serialised ragmesh.common.v1.ChunkLocation: kept opaque so this layer needs no protos.
    location: bytes = b""


@dataclass(frozen=True)
class DocumentSourceInfo:
    source_uri: str = ""
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class DocumentUpdate:
    doc_id: str
    upserts: Sequence[ChunkRecord]
    keep_chunk_ids: Sequence[str]
    # The writer's fencing token (0: unfenced).
    fence: int = 0
    # The document's source URI and metadata (None: keep what is stored).
    source: DocumentSourceInfo | None = None


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    doc_id: str
    score: float
    matched_keywords: tuple[str, ...] = field(default=())
