"""The mutations a collection accepts, as plain values, and their encoding: in the shard's
replicated log (with the collection they are for) and in a collection's WAL (with the log
position they were applied at).

Chunk payloads (text, location) and document sources (title, source_uri, metadata) travel in
the JSON header; records written before payloads existed simply have none.

A record is the *request* (logical operation), not its effect: replaying it against the state
it was first applied to gives the same result, which keeps records small and lets the replay
(and every replica) reuse the exact code path of a live write.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_OP_UPSERT = 1
_OP_REPLACE = 2
_OP_DELETE = 3
_PREFIX = struct.Struct("<BI")  # op, header length


@dataclass(frozen=True)
class Payload:
    """What a chunk shows besides its vector: its text and where it sits in its document."""

    text: str = ""
    heading_path: tuple[str, ...] = ()
    ordinal: int = 0
    char_start: int = 0
    char_end: int = 0

    def to_json(self) -> list[Any]:
        return [self.text, list(self.heading_path), self.ordinal, self.char_start, self.char_end]

    @staticmethod
    def from_json(raw: list[Any]) -> Payload:
        text, heading_path, ordinal, start, end = raw
        return Payload(str(text), tuple(str(h) for h in heading_path), int(ordinal), int(start), int(end))


@dataclass(frozen=True)
class Source:
    """A document's title, source URI and metadata."""

    title: str = ""
    source_uri: str = ""
    metadata: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "uri": self.source_uri, "meta": dict(self.metadata)}

    @staticmethod
    def from_json(raw: dict[str, Any]) -> Source:
        meta = raw.get("meta", {})
        return Source(
            str(raw.get("title", "")),
            str(raw.get("uri", "")),
            tuple(sorted((str(k), str(v)) for k, v in meta.items())),
        )


@dataclass(frozen=True)
class ChunkBatch:
    """Chunks with their vectors; row i of ``vectors`` belongs to ``chunk_ids[i]``. ``payloads``
    is empty (none sent) or lines up with the ids."""

    chunk_ids: list[str]
    doc_ids: list[str]
    vectors: np.ndarray  # (n, dimension) float32, C-contiguous
    payloads: list[Payload] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.chunk_ids)
        if len(self.doc_ids) != n or self.vectors.ndim != 2 or self.vectors.shape[0] != n:
            raise ValueError("chunk_ids, doc_ids and vectors rows must line up")
        if self.payloads and len(self.payloads) != n:
            raise ValueError("payloads must line up with chunk_ids")

    @staticmethod
    def empty(dimension: int) -> ChunkBatch:
        return ChunkBatch([], [], np.zeros((0, dimension), dtype=np.float32))


@dataclass(frozen=True)
class Upsert:
    chunks: ChunkBatch


@dataclass(frozen=True)
class Replacement:
    doc_id: str
    upserts: ChunkBatch
    keep_chunk_ids: list[str]
    # The writer's fencing token (0: unfenced); see CollectionIndex.replace_documents.
    fence: int = 0
    # The document's title, source and metadata (None: keep what is stored).
    source: Source | None = None


@dataclass(frozen=True)
class Replace:
    documents: list[Replacement]


@dataclass(frozen=True)
class Delete:
    chunk_ids: list[str]
    doc_ids: list[str]


Mutation = Upsert | Replace | Delete


@dataclass(frozen=True)
class Record:
    """A decoded record: the mutation, the collection it is for (log entries) and the log
    position it was applied at (WAL records); empty / 0 where the record has none."""

    mutation: Mutation
    collection: str = ""
    pos: int = 0
    # The shard count of the layout that wrote a log entry (0: not said), and its placement.
    shard_count: int = 0
    placement: str = ""


def placement(shard_count: int) -> str:
    """How a layout places documents on its shards, recorded with its data directories,
    snapshots and log entries: "" with one shard, else "document" (a document and all its chunks
    on meshkit.domain.ids.document_shard). Data of several shards without it placed each chunk by
    its id, before documents were kept whole, and is refused rather than mixed in."""
    return "document" if shard_count > 1 else ""


class CorruptRecord(ValueError):
    """A payload that passed its checksum but does not decode: a bug or a format change."""


def op_name(mutation: Mutation) -> str:
    return {Upsert: "upsert", Replace: "replace", Delete: "delete"}[type(mutation)]


def encode(mutation: Mutation, *, collection: str = "", pos: int = 0, shard_count: int = 0) -> bytes:
    """Op byte, JSON header (ids, fences, collection, log position), then every vector as raw
    little-endian float32."""
    if isinstance(mutation, Upsert):
        op = _OP_UPSERT
        header: dict[str, object] = {
            "chunk_ids": mutation.chunks.chunk_ids,
            "doc_ids": mutation.chunks.doc_ids,
        }
        if mutation.chunks.payloads:
            header["payloads"] = [p.to_json() for p in mutation.chunks.payloads]
        blobs = [mutation.chunks.vectors]
    elif isinstance(mutation, Replace):
        op = _OP_REPLACE
        header = {"docs": [_replacement_header(r) for r in mutation.documents]}
        blobs = [r.upserts.vectors for r in mutation.documents]
    else:
        op = _OP_DELETE
        header = {"chunk_ids": mutation.chunk_ids, "doc_ids": mutation.doc_ids}
        blobs = []
    if collection:
        header["collection"] = collection
    if pos:
        header["pos"] = pos
    if shard_count:
        header["shards"] = shard_count
    if placement(shard_count):
        header["placement"] = placement(shard_count)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    parts = [_PREFIX.pack(op, len(head)), head]
    parts.extend(np.ascontiguousarray(b, dtype="<f4").tobytes() for b in blobs)
    return b"".join(parts)


def _replacement_header(r: Replacement) -> dict[str, object]:
    doc: dict[str, object] = {
        "doc_id": r.doc_id,
        "chunk_ids": r.upserts.chunk_ids,
        "keep": r.keep_chunk_ids,
        "fence": r.fence,
    }
    if r.upserts.payloads:
        doc["payloads"] = [p.to_json() for p in r.upserts.payloads]
    if r.source is not None:
        doc["source"] = r.source.to_json()
    return doc


def _payloads(raw: Any) -> list[Payload]:
    return [Payload.from_json(p) for p in raw or []]


def decode(payload: bytes, dimension: int) -> Mutation:
    return decode_record(payload, dimension).mutation


def decode_record(payload: bytes, dimension: int) -> Record:
    try:
        op, head_len = _PREFIX.unpack_from(payload, 0)
        start = _PREFIX.size
        header = json.loads(payload[start : start + head_len])
        raw = memoryview(payload)[start + head_len :]
        collection = str(header.get("collection", ""))
        pos = int(header.get("pos", 0))
        shard_count = int(header.get("shards", 0))
        placed = str(header.get("placement", ""))
        mutation: Mutation
        if op == _OP_UPSERT:
            vectors = _vectors(raw, len(header["chunk_ids"]), dimension)
            _expect_consumed(raw, vectors)
            payloads = _payloads(header.get("payloads"))
            mutation = Upsert(
                ChunkBatch(list(header["chunk_ids"]), list(header["doc_ids"]), vectors, payloads)
            )
        elif op == _OP_REPLACE:
            mutation = _decode_replace(header, raw, dimension)
        elif op == _OP_DELETE:
            mutation = Delete(list(header["chunk_ids"]), list(header["doc_ids"]))
        else:
            raise CorruptRecord(f"unknown mutation op {op}")
    except (struct.error, ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, CorruptRecord):
            raise
        raise CorruptRecord(f"undecodable mutation payload: {exc}") from exc
    return Record(mutation, collection, pos, shard_count, placed)


def _decode_replace(header: dict[str, Any], raw: memoryview, dimension: int) -> Replace:
    documents = []
    offset = 0
    for doc in header["docs"]:
        chunk_ids = [str(c) for c in doc["chunk_ids"]]
        vectors = _vectors(raw[offset:], len(chunk_ids), dimension)
        offset += vectors.nbytes
        doc_id = str(doc["doc_id"])
        keep = [str(c) for c in doc["keep"]]
        fence = int(doc.get("fence", 0))  # absent in records written before fences
        # Payloads and sources are absent in records written before they existed.
        batch = ChunkBatch(chunk_ids, [doc_id] * len(chunk_ids), vectors, _payloads(doc.get("payloads")))
        source = Source.from_json(doc["source"]) if "source" in doc else None
        documents.append(Replacement(doc_id, batch, keep, fence, source))
    if offset != len(raw):
        raise ValueError(f"{len(raw) - offset} trailing bytes after the vectors")
    return Replace(documents)


def _vectors(raw: memoryview, rows: int, dimension: int) -> np.ndarray:
    size = rows * dimension * 4
    if len(raw) < size:
        raise ValueError(f"expected {size} vector bytes, found {len(raw)}")
    flat = np.frombuffer(raw[:size], dtype="<f4").astype(np.float32)
    return flat.reshape(rows, dimension)


def _expect_consumed(raw: memoryview, vectors: np.ndarray) -> None:
    if vectors.nbytes != len(raw):
        raise ValueError(f"{len(raw) - vectors.nbytes} trailing bytes after the vectors")
