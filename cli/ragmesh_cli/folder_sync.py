"""``ragmesh ingest DIR --sync`` and ``--dry-run``: compare a folder with what the collection
holds from it.

"Under that source": a folder walk gives each file the source_uri ``file://<absolute path>``
(ragmesh_cli.documents), so a folder's documents are those whose latest submission's
source_uri starts with the folder's own URI plus '/'. A document is stale when it is under the
folder, its file no longer exists there, and no file of this walk has its doc id. Documents
ingested from another folder (another prefix, even with the same relative doc id: the latest
submission's source_uri decides), corpus records and documents submitted through the API
without a file:// source never match, so a sync never deletes them. Stale documents go through
the normal DeleteDocuments path: their chunks leave the index, sparse and object stores. The
listing and the deletions go through ragmesh_client (``list_documents``, ``delete``).
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh_cli.documents import DEFAULT_MAX_FILE_BYTES
from ragmesh_client import AsyncClient, DocumentSummary

LIST_PAGE = 1000
DELETE_BATCH = 256
RPC_TIMEOUT_S = 60.0
# States whose document is on its way out already: nothing to delete.
_LEAVING = frozenset({"deleting", "deleted"})


@dataclass
class SyncPlan:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


def folder_prefix(root: Path) -> str:
    """The source_uri prefix of the files a walk of ``root`` submits (with the trailing '/':
    ``/docs`` must not match ``/docs-old``)."""
    return root.absolute().as_uri().rstrip("/") + "/"


def source_path(source_uri: str) -> Path | None:
    """The local file a file:// source_uri names, or None for any other URI."""
    parsed = urlparse(source_uri)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        return None
    return Path(unquote(parsed.path))


async def list_documents(client: AsyncClient, collection: str, prefix: str = "") -> list[DocumentSummary]:
    """Every document of ``collection`` (under ``prefix``), page by page from a cursor. Under a
    prefix (a folder) in source order (``list_folder``): each page is a range of the API's source
    index, so listing a folder costs the folder's size, not the collection's."""
    if prefix:
        pages = client.list_folder(collection, prefix, page_size=LIST_PAGE, timeout=RPC_TIMEOUT_S)
    else:
        pages = client.list_documents(collection, page_size=LIST_PAGE, timeout=RPC_TIMEOUT_S)
    return [summary async for summary in pages]


def stale_documents(
    listing: Iterable[DocumentSummary], roots: Sequence[Path], walked_ids: set[str]
) -> list[str]:
    """Doc ids under one of ``roots`` whose file is gone (see the module docstring)."""
    prefixes = tuple(folder_prefix(root) for root in roots)
    stale = []
    for doc in listing:
        if doc.state in _LEAVING or doc.doc_id in walked_ids or not doc.source_uri.startswith(prefixes):
            continue
        path = source_path(doc.source_uri)
        if path is not None and not path.exists():
            stale.append(doc.doc_id)
    return stale


async def delete_documents(client: AsyncClient, collection: str, doc_ids: Sequence[str]) -> None:
    for start in range(0, len(doc_ids), DELETE_BATCH):
        await client.delete(collection, list(doc_ids[start : start + DELETE_BATCH]), timeout=RPC_TIMEOUT_S)


def classify(docs: Iterable[ingestion_pb2.Document], listing: Iterable[DocumentSummary]) -> SyncPlan:
    """What submitting ``docs`` would do: add (no such document), update (other bytes or
    another source) or leave unchanged."""
    held = {doc.doc_id: doc for doc in listing if doc.state not in _LEAVING}
    plan = SyncPlan()
    for doc in docs:
        current = held.get(doc.doc_id)
        if current is None:
            plan.added.append(doc.doc_id)
        elif (
            current.content_sha256 != hashlib.sha256(doc.content).hexdigest()
            or current.source_uri != doc.source_uri
        ):
            plan.updated.append(doc.doc_id)
        else:
            plan.unchanged.append(doc.doc_id)
    return plan


def add_folder_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ragmesh ingest`` options for folders: size limit, sync, dry run, strict."""
    parser.add_argument(
        "--max-file-bytes",
        type=int,
        default=DEFAULT_MAX_FILE_BYTES,
        help="skip (and list) files larger than this; match the service's "
        f"RAGMESH_INGEST_MAX_DOCUMENT_BYTES (default {DEFAULT_MAX_FILE_BYTES})",
    )
    parser.add_argument(
        "--sync",
        action="store_true",
        help="then delete the collection's documents from these folders whose files are gone",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list what would be added, updated and deleted; change nothing"
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit non-zero when any file is skipped or rejected"
    )
