"""``ragmesh ingest``: stream documents to IngestionService in batches (a few requests in
flight), then optionally wait until the collection has indexed them and report failures. It
calls the API through ragmesh_client, like every other command (``channels.ingestion_client``:
the CLI's address, TLS and API key).

Forgiving: a file that cannot be ingested (empty, unsupported, too large, not UTF-8...) is
skipped and listed with its reason, and a document the service rejects is listed with the
service's reason; the others go in. The exit code is non-zero only with ``--strict`` (any file
skipped or rejected) or when nothing went in. ``--sync`` then deletes the documents of the
folders whose files are gone, ``--dry-run`` only lists what would change
(ragmesh_cli.folder_sync)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from ragmesh.ingestion.v1 import ingestion_pb2
from ragmesh_cli import documents, folder_sync
from ragmesh_cli.channels import ingestion_client
from ragmesh_cli.documents import DetectFormat, InputError, WalkStats
from ragmesh_client import AsyncClient, Document, DocumentStatus
from ragmesh_client import IngestResult as Submissions

REQUEST_TIMEOUT_S = 300.0
STATUS_TIMEOUT_S = 60.0
COLLECTION_STATUS_TIMEOUT_S = 30.0
STATUS_CHUNK = 500
POLL_INTERVAL_S = 1.0
PENDING_STATES = frozenset({"queued", "processing", "deleting"})


@dataclass
class IngestResult:
    submitted: int = 0
    queued: int = 0
    unchanged: int = 0
    queued_ids: list[str] = field(default_factory=list)
    # (doc id, the service's reason) for documents the service refused.
    rejected: list[tuple[str, str]] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return self.queued + self.unchanged


@dataclass(frozen=True)
class FolderOptions:
    max_file_bytes: int = documents.DEFAULT_MAX_FILE_BYTES
    # Delete the folders' documents whose files are gone.
    sync: bool = False
    # List what would be added, updated (and with sync deleted); change nothing.
    dry_run: bool = False
    # Exit non-zero when any file was skipped or rejected.
    strict: bool = False


def load_detector() -> DetectFormat:
    """The ingestion service's own format detection, so the CLI and the service agree."""
    try:
        from meshkit.text.formats import detect_format
    except ImportError as exc:
        raise RuntimeError(f"format detection is unavailable (meshkit.text.formats: {exc})") from exc
    detector: DetectFormat = detect_format
    return detector


def _warn(message: str) -> None:
    tqdm.write(f"warning: {message}", file=sys.stderr)


def _next_batch(it: Iterator[list[ingestion_pb2.Document]]) -> list[ingestion_pb2.Document] | None:
    return next(it, None)


def client_document(doc: ingestion_pb2.Document) -> Document:
    """A walked document (``ragmesh_cli.documents`` gives contract messages, sized in batches by
    their wire size) as the client sends it: the same fields, the format by its name."""
    fmt = ingestion_pb2.DocumentFormat.Name(doc.format).removeprefix("DOCUMENT_FORMAT_").lower()
    return Document(
        doc_id=doc.doc_id,
        content=doc.content,
        title=doc.title,
        format=fmt,
        source_uri=doc.source_uri,
        metadata=dict(doc.metadata),
    )


async def submit(
    client: AsyncClient,
    collection: str,
    paths: Sequence[Path],
    detect: DetectFormat,
    stats: WalkStats,
    *,
    max_in_flight: int = 4,
    max_docs: int = documents.DEFAULT_BATCH_DOCS,
    max_bytes: int = documents.DEFAULT_BATCH_BYTES,
    max_file_bytes: int = documents.DEFAULT_MAX_FILE_BYTES,
) -> IngestResult:
    """Send every document under ``paths``; raises ragmesh_client.RagmeshError on the first failed
    request (requests already in flight are cancelled)."""
    documents.check_explicit_files(paths, detect)
    result = IngestResult()
    docs = documents.iter_documents(paths, detect, stats, _warn, max_file_bytes)
    batch_iter = documents.batches(docs, max_docs=max_docs, max_bytes=max_bytes)
    in_flight: set[asyncio.Task[Submissions]] = set()
    with tqdm(desc="submitted", unit="doc", file=sys.stderr) as bar:

        def account(task: asyncio.Task[Submissions]) -> None:
            reply = task.result()
            for item in reply:
                if item.outcome == "rejected":
                    result.rejected.append((item.doc_id, item.reason))
                elif item.outcome == "unchanged":
                    result.unchanged += 1
                else:
                    result.queued += 1
                    result.queued_ids.append(item.doc_id)
            bar.update(len(reply))

        try:
            while True:
                # File reading and parsing is blocking: keep it off the loop so replies are handled.
                batch = await asyncio.to_thread(_next_batch, batch_iter)
                if batch is None:
                    break
                result.submitted += len(batch)
                sent = client.ingest(
                    collection, [client_document(d) for d in batch], timeout=REQUEST_TIMEOUT_S
                )
                in_flight.add(asyncio.ensure_future(sent))
                if len(in_flight) >= max_in_flight:
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        account(task)
            while in_flight:
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    account(task)
        finally:
            for task in in_flight:
                task.cancel()
    return result


async def document_statuses(
    client: AsyncClient, collection: str, doc_ids: Sequence[str]
) -> list[DocumentStatus]:
    statuses: list[DocumentStatus] = []
    for start in range(0, len(doc_ids), STATUS_CHUNK):
        chunk = doc_ids[start : start + STATUS_CHUNK]
        statuses.extend(await client.document_status(collection, chunk, timeout=STATUS_TIMEOUT_S))
    return statuses


async def wait_indexed(
    client: AsyncClient, collection: str, doc_ids: Sequence[str], timeout_s: float
) -> list[DocumentStatus] | None:
    """Poll until nothing is queued or processing in the collection and none of ``doc_ids`` is
    pending; returns their final statuses, or None on timeout."""
    deadline = time.monotonic() + timeout_s
    with tqdm(desc="indexed", unit="doc", file=sys.stderr) as bar:
        while True:
            status = await client.collection_status(collection, timeout=COLLECTION_STATUS_TIMEOUT_S)
            bar.total = status.indexed + status.queued + status.processing + status.failed
            bar.n = status.indexed
            bar.set_postfix(queued=status.queued, processing=status.processing, failed=status.failed)
            bar.refresh()
            if status.queued == 0 and status.processing == 0:
                # Collection counts can lag a submit; the per-document states are authoritative.
                statuses = await document_statuses(client, collection, doc_ids)
                if not any(s.state in PENDING_STATES for s in statuses):
                    return statuses
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(POLL_INTERVAL_S)


def _print_summary(collection: str, result: IngestResult, stats: WalkStats) -> None:
    print(
        f"submitted {result.submitted} documents to collection {collection!r}: "
        f"{result.queued} queued, {result.unchanged} unchanged, {len(result.rejected)} rejected"
    )
    _print_skipped(stats)
    if result.rejected:
        print(f"{len(result.rejected)} documents rejected by the ingestion service:")
        for doc_id, reason in result.rejected:
            print(f"  {doc_id}: {reason}")


def _print_skipped(stats: WalkStats) -> None:
    if stats.skipped:
        print(f"skipped {len(stats.skipped)} files:")
        for skipped in stats.skipped:
            print(f"  {skipped.path}: {skipped.reason}")
    if stats.skipped_empty:
        print(f"skipped {stats.skipped_empty} corpus records with no text")
    if stats.duplicates:
        print(f"skipped {len(stats.duplicates)} duplicate doc ids")


def _print_failures(failed: Sequence[DocumentStatus]) -> None:
    print(f"{len(failed)} documents failed:")
    for status in failed:
        print(f"  {status.doc_id}: {status.reason or 'no reason given'} (attempts {status.attempts})")


def _print_ids(label: str, doc_ids: Sequence[str]) -> None:
    print(f"{label}: {len(doc_ids)}")
    for doc_id in doc_ids:
        print(f"  {doc_id}")


def _sync_roots(paths: Sequence[Path]) -> list[Path]:
    roots = [p for p in paths if p.is_dir()]
    if len(roots) != len(paths):
        raise InputError("--sync takes folders only: it deletes a folder's documents whose files are gone")
    return roots


async def _dry_run(
    client: AsyncClient,
    collection: str,
    paths: Sequence[Path],
    detect: DetectFormat,
    options: FolderOptions,
) -> int:
    documents.check_explicit_files(paths, detect)
    stats = WalkStats()
    roots = folder_sync.only_folders(paths)
    if roots is None:
        listing = await folder_sync.list_documents(client, collection)
    else:
        listing = await folder_sync.list_under(client, collection, roots)
    docs = documents.iter_documents(paths, detect, stats, _warn, options.max_file_bytes)
    plan = await asyncio.to_thread(folder_sync.classify, docs, listing)
    if roots is not None and plan.added:
        elsewhere = await folder_sync.held(client, collection, plan.added)
        plan.updated += [d for d in plan.added if d in elsewhere]
        plan.added = [d for d in plan.added if d not in elsewhere]
    if options.sync:
        plan.deleted = folder_sync.stale_documents(listing, _sync_roots(paths), stats.walked_ids)
    print(f"dry run for collection {collection!r}: nothing was changed")
    _print_ids("would add", plan.added)
    _print_ids("would update", plan.updated)
    print(f"unchanged: {len(plan.unchanged)}")
    if options.sync:
        _print_ids("would delete", plan.deleted)
    _print_skipped(stats)
    return 1 if options.strict and (stats.skipped or stats.duplicates) else 0


async def _sync(client: AsyncClient, collection: str, roots: Sequence[Path], stats: WalkStats) -> list[str]:
    """Delete the stale documents of ``roots``; their ids."""
    listing = []
    for root in roots:
        listing.extend(await folder_sync.list_documents(client, collection, folder_sync.folder_prefix(root)))
    stale = folder_sync.stale_documents(listing, roots, stats.walked_ids)
    if stale and not stats.walked_ids:
        # An empty folder (an unmounted share, a wrong path) must not empty the collection.
        print(
            f"not syncing: the folders hold no files, and {len(stale)} documents came from them; "
            "delete them with `ragmesh delete` if that is meant"
        )
        return []
    await folder_sync.delete_documents(client, collection, stale)
    _print_ids("deleted (files gone)", stale)
    return stale


async def run_ingest(
    address: str,
    collection: str,
    paths: Sequence[Path],
    *,
    wait: bool,
    timeout_s: float,
    detect: DetectFormat | None = None,
    max_in_flight: int = 4,
    options: FolderOptions | None = None,
) -> int:
    """The whole command; returns the exit code. The client's errors (RagmeshError) propagate
    (main prints them)."""
    options = options or FolderOptions()
    detector = detect or load_detector()
    roots = _sync_roots(paths) if options.sync else []
    stats = WalkStats()
    async with ingestion_client(address) as client:
        if options.dry_run:
            return await _dry_run(client, collection, paths, detector, options)
        result = await submit(
            client,
            collection,
            paths,
            detector,
            stats,
            max_in_flight=max_in_flight,
            max_file_bytes=options.max_file_bytes,
        )
        _print_summary(collection, result, stats)
        deleted = await _sync(client, collection, roots, stats) if options.sync else []
        code = _exit_code(result, stats, options)
        if not wait or not (result.queued_ids or deleted):
            return code
        statuses = await wait_indexed(client, collection, [*result.queued_ids, *deleted], timeout_s)
        if statuses is None:
            print(f"timed out after {timeout_s:.0f}s waiting for collection {collection!r} to be indexed")
            return 1
        failed = [s for s in statuses if s.state == "failed"]
        indexed = sum(1 for s in statuses if s.state == "indexed")
        print(f"indexed {indexed} of {len(result.queued_ids)} queued documents")
        if failed:
            _print_failures(failed)
            return 1
        return code


def _exit_code(result: IngestResult, stats: WalkStats, options: FolderOptions) -> int:
    if result.accepted == 0:
        print("nothing was ingested")
        return 1
    if options.strict and (stats.skipped or result.rejected or stats.duplicates):
        print("--strict: some files were skipped or rejected")
        return 1
    return 0
