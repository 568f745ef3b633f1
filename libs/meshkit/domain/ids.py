"""Names and ids: validation rules shared by every service, content-addressed chunk ids and
the chunk-to-shard rule."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

from meshkit.core.errors import invalid_argument, resource_exhausted

MAX_DOC_ID_CHARS = 256
MAX_COLLECTION_CHARS = 63
MAX_CHUNK_ID_CHARS = 64

# Checked with fullmatch: "$" alone also matches before a trailing newline ("docs\n").
_COLLECTION_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_DOC_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._:=@+-]+$")
_CHUNK_ID_RE = re.compile(r"^[0-9a-f]{32}$")


def validate_collection(name: str) -> str:
    if not name:
        raise invalid_argument("collection is required")
    if len(name) > MAX_COLLECTION_CHARS or not _COLLECTION_RE.fullmatch(name):
        raise invalid_argument(
            f"collection {name[:80]!r} is invalid: 1-{MAX_COLLECTION_CHARS} chars of [a-z0-9_-], "
            "starting with a letter or digit"
        )
    return name


def doc_id_problem(doc_id: str) -> str | None:
    """Why ``doc_id`` is not acceptable, or None. Path-like ids that could escape a directory
    or collide after normalisation ('a/../b', '/etc/passwd', 'a//b') are refused."""
    if not doc_id:
        return "doc_id is empty"
    if len(doc_id) > MAX_DOC_ID_CHARS:
        return f"doc_id is {len(doc_id)} chars, the limit is {MAX_DOC_ID_CHARS}"
    for segment in doc_id.split("/"):
        if segment in ("", ".", ".."):
            return f"doc_id {doc_id[:80]!r} has an empty, '.' or '..' path segment"
        if not _DOC_SEGMENT_RE.fullmatch(segment):
            return f"doc_id {doc_id[:80]!r} has characters outside [A-Za-z0-9._:=@+-/]"
    return None


def validate_doc_id(doc_id: str) -> str:
    problem = doc_id_problem(doc_id)
    if problem:
        raise invalid_argument(problem)
    return doc_id


def validate_chunk_id(chunk_id: str) -> str:
    if not _CHUNK_ID_RE.fullmatch(chunk_id):
        raise invalid_argument(f"chunk_id {chunk_id[:80]!r} is not 32 lowercase hex chars")
    return chunk_id


def chunk_id_for(collection: str, doc_id: str, text: str) -> str:
    """Deterministic, content-addressed: the same text in the same document always gets the
    same id, so re-ingesting unchanged content finds its chunks already indexed."""
    h = hashlib.sha256()
    for part in (collection, doc_id, text):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:32]


# Virtual buckets a collection's documents are spread over (see bucket_of).
BUCKETS = 1024


def bucket_of(doc_id: str, buckets: int = BUCKETS) -> int:
    """The virtual bucket of a document: a stable hash of its id (sha256, so every process and
    every store agrees), modulo ``buckets``. Rows carry it so that a bucket's rows can be found
    and moved between shards as one."""
    digest = hashlib.sha256(doc_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % max(1, buckets)


def document_shard(doc_id: str, shard_count: int) -> int:
    """The shard that owns a document and all its chunks, in the index and in sparse alike: its
    virtual bucket, modulo the shard count, so that a document's chunks live together (one
    shard per document write, filter or hydration) and a bucket moves as one."""
    return bucket_of(doc_id) % max(1, shard_count)


def sparse_shard_name(shard: int, shard_count: int) -> str:
    """A sparse shard's name (process, data dir, client target, degradation): "sparse" while
    there is one, as the store was called before it was sharded, else "sparse-<shard>"."""
    return "sparse" if shard_count == 1 else f"sparse-{shard}"


def doc_key(collection: str, doc_id: str) -> str:
    """A key safe for NATS KV and object names: doc ids may hold characters KV keys do not."""
    return f"{collection}.{hashlib.sha256(doc_id.encode('utf-8')).hexdigest()[:40]}"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks (model files and snapshots can be large)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Longest caller-chosen id (a passage or source id, usually a chunk id) a request may carry.
MAX_ITEM_ID_CHARS = 512


def check_item_list(ids: Sequence[str], field: str, limit: int) -> None:
    """A request's list of caller-identified items (passages, sources): at most ``limit`` of
    them (RESOURCE_EXHAUSTED), each id 1..MAX_ITEM_ID_CHARS characters and unique
    (INVALID_ARGUMENT), named by ``field`` in the messages."""
    if len(ids) > limit:
        raise resource_exhausted(f"{len(ids)} {field} in one call; the limit is {limit}")
    seen: set[str] = set()
    for i, item_id in enumerate(ids):
        if not item_id or len(item_id) > MAX_ITEM_ID_CHARS:
            raise invalid_argument(f"{field}[{i}].id must be 1..{MAX_ITEM_ID_CHARS} characters")
        if item_id in seen:
            raise invalid_argument(f"{field}[{i}].id {item_id!r} is repeated")
        seen.add(item_id)


# ListDocuments paging (index and sparse): documents per page when the caller asks for 0, and at most.
DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 10_000


def document_page(page_size: int, page_token: str) -> tuple[int, str]:
    """A ListDocuments page: its size and the doc id it starts after (the token is the last doc id
    of the previous page, '' for the first)."""
    if page_size > MAX_PAGE_SIZE:
        raise resource_exhausted(f"page_size is {page_size}, the limit is {MAX_PAGE_SIZE}")
    if page_token and doc_id_problem(page_token):
        raise invalid_argument("page_token is not one a ListDocuments page returned")
    return page_size or DEFAULT_PAGE_SIZE, page_token
