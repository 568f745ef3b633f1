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

Both cost the folder's size, not the collection's: a sync lists the folder's documents by their
source prefix, and so does a dry run over folders, which then looks up only the files it found
no document for there (held from another source, submitting them would update them). A dry run
that names files or corpus records lists the whole collection.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh_cli.documents import DEFAULT_MAX_FILE_BYTES
from ragmesh_client import AsyncClient, DocumentSummary, NotFoundError

LIST_PAGE = 1000
DELETE_BATCH = 256
# Status calls in flight while a dry run looks up documents it did not find under the folders.
LOOKUP_IN_FLIGHT = 16
LOOKUP_BATCH = 1024
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


def only_folders(paths: Sequence[Path]) -> list[Path] | None:
    """The folders, when every path is one (a dry run then lists only what is under them)."""
    roots = [path for path in paths if path.is_dir()]
    return roots if roots and len(roots) == len(paths) else None


async def list_under(client: AsyncClient, collection: str, roots: Sequence[Path]) -> list[DocumentSummary]:
    """The documents whose latest source is under one of ``roots``: the folders' size, not the
    collection's."""
    listing: list[DocumentSummary] = []
    for root in roots:
        listing.extend(await list_documents(client, collection, folder_prefix(root)))
    return listing


async def held(client: AsyncClient, collection: str, doc_ids: Sequence[str]) -> set[str]:
    """Those of ``doc_ids`` the collection holds (and is not deleting), one status call each, a
    few at once: a status call with an unknown id fails as a whole (NOT_FOUND). A dry run over
    folders asks this of the files it found no document for under them; those held came from
    another source, and submitting the file would update them."""
    slots = asyncio.Semaphore(LOOKUP_IN_FLIGHT)

    async def lookup(doc_id: str) -> str | None:
        async with slots:
            try:
                (status,) = await client.document_status(collection, [doc_id], timeout=RPC_TIMEOUT_S)
            except NotFoundError:
                return None
        return None if status.state in _LEAVING else doc_id

    found: set[str] = set()
    for start in range(0, len(doc_ids), LOOKUP_BATCH):
        batch = doc_ids[start : start + LOOKUP_BATCH]
        found.update(d for d in await asyncio.gather(*(lookup(d) for d in batch)) if d is not None)
    return found


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
