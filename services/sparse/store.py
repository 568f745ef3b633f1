"""The collections of one sparse replica, fed by the sparse replicated log (start-up,
positions, quarantine and restores are meshkit.replication.store's), and their snapshots in the object
store (``sparse/<collection>/``), from which a replica with an empty disk comes back.

Writes: the RPC appends its request (the ReplaceDocuments or Delete request itself, a part of
it when it is big) to its shard's log ``ragmesh.log.sparse.<shard>`` and waits until this replica
has applied it; every replica of the shard applies every entry in log order. Reads are local.

Sharding: a document and all its chunks live on shard ``document_shard(doc_id, count)``
(meshkit.domain.ids). Entries of a layout with more than one shard carry the shard count, and a
replica refuses entries written for another count, as the index does: the subject is per shard
number, and a log written before the count changed holds documents this layout places elsewhere.
Snapshots of such a layout live under ``sparse/shard-<i>-of-<n>/``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tarfile
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from meshkit.core.fsutil import fsync_dir
from meshkit.domain.ids import sparse_shard_name
from meshkit.replication.log import LogTransport, transport_for
from meshkit.replication.records import ReplaceResult
from meshkit.replication.snapshots import Pointer, RemoteSnapshots
from meshkit.replication.store import Decoded, ReplicatedStore
from meshkit.settings import SparseSettings
from meshkit.storage.objectstore import ObjectStore
from ragmesh.sparse.v1 import sparse_pb2
from services.sparse import metrics
from services.sparse.collection import Collection
from services.sparse.records import ChunkRecord, DocumentSourceInfo, DocumentUpdate
from services.sparse.state import STATE_FILE

log = logging.getLogger(__name__)

_OP_REPLACE = b"R"
_OP_DELETE = b"D"
# Prefix of an entry written by a layout of more than one shard: the count follows (2 bytes).
# One-shard entries carry none, as every entry did before sparse was sharded.
_OP_LAYOUT = b"N"
_SNAPSHOT_WORK = ".snapshots"


def data_dir(settings: SparseSettings) -> Path:
    if settings.sparse_data_dir:
        return settings.sparse_data_dir
    return settings.state_dir / sparse_shard_name(settings.sparse_shard, settings.sparse_shard_count)


def snapshot_prefix(shard: int, shard_count: int) -> str:
    return "sparse/" if shard_count == 1 else f"sparse/shard-{shard}-of-{shard_count}/"


def _layout(shard_count: int) -> bytes:
    return b"" if shard_count == 1 else _OP_LAYOUT + shard_count.to_bytes(2, "big")


def encode_replace(request: sparse_pb2.ReplaceDocumentsRequest, shard_count: int = 1) -> bytes:
    return _layout(shard_count) + _OP_REPLACE + request.SerializeToString()


def encode_delete(request: sparse_pb2.DeleteRequest, shard_count: int = 1) -> bytes:
    return _layout(shard_count) + _OP_DELETE + request.SerializeToString()


def split_layout(data: bytes) -> tuple[int, bytes]:
    """(the shard count an entry was written for, the entry without its layout prefix)."""
    if data[:1] == _OP_LAYOUT:
        return int.from_bytes(data[1:3], "big"), data[3:]
    return 1, data


@dataclass(frozen=True)
class Delete:
    chunk_ids: list[str]
    doc_ids: list[str]


def document_updates(documents: Any) -> list[DocumentUpdate]:
    """Log (and RPC) form to the collection's: requests were validated before they were logged."""
    updates = []
    for document in documents:
        records = [
            ChunkRecord(
                c.chunk_id,
                document.doc_id,
                c.title,
                c.text,
                c.location.SerializeToString() if c.HasField("location") else b"",
            )
            for c in document.upserts
        ]
        updates.append(
            DocumentUpdate(
                document.doc_id,
                records,
                list(document.keep_chunk_ids),
                document.fence,
                source_info(document),
            )
        )
    return updates


def source_info(document: Any) -> DocumentSourceInfo | None:
    """A replacement's source (None when it sent none: entries logged before sources existed
    and writers that keep the stored one)."""
    if not document.HasField("source"):
        return None
    source = document.source
    return DocumentSourceInfo(source.source_uri, tuple(sorted(source.metadata.items())))


class SparseRemote:
    """Sparse snapshots in the object store: a tar of the collection's index files and state."""

    def __init__(
        self, store: ObjectStore, bucket: str, replica: str | None = None, prefix: str = "sparse/"
    ) -> None:
        self.remote = RemoteSnapshots(store, bucket, prefix)
        self.replica = replica or uuid.uuid4().hex[:8]

    @classmethod
    def from_settings(cls, settings: SparseSettings) -> SparseRemote:
        prefix = snapshot_prefix(settings.sparse_shard, settings.sparse_shard_count)
        return cls(ObjectStore.from_settings(settings), settings.snapshots_bucket, prefix=prefix)

    async def latest(self) -> dict[str, Pointer]:
        return await self.remote.latest()

    async def pointer(self, collection: str) -> Pointer | None:
        return await self.remote.pointer(collection)

    async def upload(self, collection: str, copy_dir: Path, log_pos: int, log_id: str) -> Pointer:
        archive = copy_dir.with_suffix(".tar")
        try:
            await asyncio.to_thread(_pack, copy_dir, archive)
            return await self.remote.upload(collection, archive, log_pos, log_id, self.replica)
        finally:
            archive.unlink(missing_ok=True)

    async def restore(self, collection: str, collection_dir: Path) -> Pointer:
        await asyncio.to_thread(collection_dir.mkdir, parents=True)
        archive = collection_dir / ".restore.tar"
        try:
            pointer = await self.remote.download(collection, archive)
            await asyncio.to_thread(_unpack, archive, collection_dir)
        finally:
            archive.unlink(missing_ok=True)
        return pointer


def _pack(copy_dir: Path, archive: Path) -> None:
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(copy_dir / STATE_FILE, arcname=STATE_FILE, recursive=False)
        for path in sorted((copy_dir / "index").iterdir()):
            tar.add(path, arcname=f"index/{path.name}", recursive=False)


def _unpack(archive: Path, collection_dir: Path) -> None:
    """Unpack a snapshot tar: plain files only, ``state.sqlite`` and ``index/<file>``."""
    (collection_dir / "index").mkdir()
    with tarfile.open(archive, "r") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            allowed = member.name == STATE_FILE or (len(parts) == 2 and parts[0] == "index" and parts[1])
            if not member.isfile() or not allowed or ".." in parts:
                raise ValueError(f"unexpected member {member.name!r} in a sparse snapshot")
            source = tar.extractfile(member)
            assert source is not None
            with source, (collection_dir / member.name).open("wb") as target:
                shutil.copyfileobj(source, target, 1 << 20)
                target.flush()
    for directory in (collection_dir / "index", collection_dir):
        fsync_dir(directory)


class SparseStore(ReplicatedStore[Collection]):
    store = "sparse"

    def __init__(
        self,
        settings: SparseSettings,
        remote: SparseRemote | None = None,
        transport: LogTransport | None = None,
    ) -> None:
        if not 0 <= settings.sparse_shard < settings.sparse_shard_count:
            raise ValueError(
                f"sparse_shard {settings.sparse_shard} is outside 0..{settings.sparse_shard_count - 1}"
            )
        self.shard = settings.sparse_shard
        self.shard_count = settings.sparse_shard_count
        transport = transport or transport_for(
            settings,
            settings.sparse_log_stream,
            "sparse",
            self.shard,
            client_name=f"sparse-{self.shard}-{uuid.uuid4().hex[:6]}",
        )
        name = "sparse" if self.shard_count == 1 else f"sparse shard {self.shard}"
        super().__init__(settings, data_dir(settings), transport, remote, name)
        self.sparse_settings = settings
        self.snapshot_remote = remote
        self._changed_at: dict[str, float] = {}
        self._uploaded: dict[str, int] = {}
        self._snapshot_locks: dict[str, asyncio.Lock] = {}

    # ----- the collection type -----

    def open_collection(self, name: str) -> Collection:
        s = self.sparse_settings
        ripgrep = s.sparse_exact_mode == "ripgrep"
        return Collection.open(self.data_dir, name, s.sparse_writer_heap_bytes, s.sparse_title_boost, ripgrep)

    def has_local_data(self, name: str) -> bool:
        return Collection.exists(self.data_dir, name)

    def decode(self, data: bytes) -> Decoded:
        written_for, data = split_layout(data)
        if written_for != self.shard_count:
            raise ValueError(f"entry written for {written_for} shards, this layout has {self.shard_count}")
        op, body = data[:1], data[1:]
        try:
            if op == _OP_REPLACE:
                replace = sparse_pb2.ReplaceDocumentsRequest.FromString(body)
                return Decoded(replace.collection, document_updates(replace.documents), True)
            if op == _OP_DELETE:
                delete = sparse_pb2.DeleteRequest.FromString(body)
                return Decoded(delete.collection, Delete(list(delete.chunk_ids), list(delete.doc_ids)), False)
        except Exception as exc:  # protobuf's DecodeError
            raise ValueError(f"undecodable sparse log entry: {exc}") from exc
        raise ValueError(f"unknown sparse log entry op {op!r}")

    def apply_mutation(self, collection: Collection, mutation: Any, pos: int) -> Any:
        started = time.perf_counter()
        if isinstance(mutation, Delete):
            removed = collection.delete(mutation.chunk_ids, mutation.doc_ids, pos)
            metrics.COMMIT_SECONDS.labels("delete").observe(time.perf_counter() - started)
            metrics.CHUNKS_WRITTEN.labels("remove").inc(removed)
            return removed
        result = collection.replace_documents(mutation, pos)
        metrics.COMMIT_SECONDS.labels("replace").observe(time.perf_counter() - started)
        metrics.CHUNKS_WRITTEN.labels("upsert").inc(result.upserted)
        metrics.CHUNKS_WRITTEN.labels("remove").inc(result.removed)
        metrics.MISSING_KEEPS.inc(len(result.missing_chunk_ids))
        return result

    async def after_apply(self, collection: Collection, result: Any) -> None:
        self._changed_at.setdefault(collection.name, time.monotonic())

    # ----- operations -----

    async def replace_documents(
        self, request: sparse_pb2.ReplaceDocumentsRequest, timeout_s: float
    ) -> ReplaceResult:
        """Documents packed into log entries of bounded size (each document's change is atomic;
        a big document is one entry of several parts)."""
        budget = self.transport.max_message_bytes
        groups: list[list[sparse_pb2.DocumentReplacement]] = [[]]
        size = 0
        for document in request.documents:
            doc_size = document.ByteSize()
            if groups[-1] and size + doc_size > budget:
                groups.append([])
                size = 0
            groups[-1].append(document)
            size += doc_size
        entries = [
            encode_replace(
                sparse_pb2.ReplaceDocumentsRequest(collection=request.collection, documents=g),
                self.shard_count,
            )
            for g in groups
        ]
        results = await asyncio.gather(*(self.submit(request.collection, e, timeout_s) for e in entries))
        done = [r for r in results if isinstance(r, ReplaceResult)]
        return ReplaceResult(
            upserted=sum(r.upserted for r in done),
            removed=sum(r.removed for r in done),
            missing_chunk_ids=[c for r in done for c in r.missing_chunk_ids],
            stale_doc_ids=[d for r in done for d in r.stale_doc_ids],
        )

    async def delete(self, request: sparse_pb2.DeleteRequest, timeout_s: float) -> int:
        result = await self.submit(request.collection, encode_delete(request, self.shard_count), timeout_s)
        return int(result or 0)

    # ----- snapshots -----

    async def snapshot(self, name: str) -> bool:
        """Snapshot one collection to the object store now; whether the store holds it."""
        collection = self.get(name)
        async with self._snapshot_locks.setdefault(name, asyncio.Lock()):
            return await self._snapshot(collection)

    async def _snapshot(self, collection: Collection) -> bool:
        remote = self.snapshot_remote
        if remote is None or not self.sparse_settings.sparse_upload_snapshots:
            return False
        name = collection.name
        changed_at = self._changed_at.pop(name, None)
        work = self.data_dir / _SNAPSHOT_WORK / f"{name}-{uuid.uuid4().hex[:8]}"
        try:
            log_pos = await asyncio.to_thread(
                collection.copy_for_snapshot,
                work,
                partial(self.log.positions.of, name),
                self.log.positions.log_id,
            )
            if self._uploaded.get(name) == log_pos:
                return True
            current = await remote.pointer(name)
            log_id = self.log.positions.log_id
            if current is None or current.log_id != log_id or current.log_pos < log_pos:
                await remote.upload(name, work, log_pos, log_id)
        except Exception as exc:
            if changed_at is not None:
                self._changed_at.setdefault(name, changed_at)  # try again next interval
            metrics.SNAPSHOT_UPLOADS.labels("error").inc()
            log.warning(
                "sparse snapshot upload failed; will retry", extra={"collection": name, "error": str(exc)}
            )
            return False
        finally:
            await asyncio.to_thread(shutil.rmtree, work, True)
        metrics.SNAPSHOT_UPLOADS.labels("ok").inc()
        self._uploaded[name] = log_pos
        return True

    async def _snapshot_quietly(self, collection: Collection) -> None:
        async with self._snapshot_locks.setdefault(collection.name, asyncio.Lock()):
            await self._snapshot(collection)

    async def on_tick(self) -> None:
        interval = self.sparse_settings.sparse_snapshot_interval_s
        now = time.monotonic()
        for name, changed_at in list(self._changed_at.items()):
            collection = self.collections.get(name)
            if collection is None:
                self._changed_at.pop(name, None)
            elif now - changed_at >= interval:
                self.spawn(name, "snapshot", partial(self._snapshot_quietly, collection))

    async def before_stop(self) -> None:
        for name in list(self._changed_at):
            collection = self.collections.get(name)
            if collection is not None:
                await self._snapshot_quietly(collection)

    async def start(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.data_dir / _SNAPSHOT_WORK, True)
        await super().start()
        # What changed before this start may not be in the object store yet (a crash, or data
        # from before snapshots): one interval from now each collection is checked (its upload
        # is skipped when the store already covers its position).
        for name in self.collections:
            self._changed_at.setdefault(name, time.monotonic())
        log.info(
            "sparse store ready",
            extra={
                "collections": len(self.collections),
                "quarantined": sorted(self.quarantined),
                "log_position": self.log.positions.cursor,
            },
        )
