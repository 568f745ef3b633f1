"""This shard's checkpoints in the object store (``index/shard-<n>-of-<count>/<collection>/``), so
a replica with an empty disk (or a quarantined collection) comes back from there plus the log.

Every file a manifest names is uploaded once, as a content-addressed blob ``files/<sha256>``
(a sealed segment's files go up when the first checkpoint naming them is uploaded, never
again; replicas sealing the same rows write the same bytes and share them). The checkpoint
itself is a small tar holding only its manifest, uploaded and pointed at as before
(meshkit.replication.snapshots: ``<log position>-<replica>.tar`` and ``latest``), so what an
upload sends grows with what changed. A restore downloads the manifest, then every blob it
names into place, checked against its sha256.

Blobs are collected when the manifests that named them are gone: each replica deletes the blobs
it saw named that neither kept manifest (the two newest) names any more; after publishing, an
uploader checks its blobs are all there (another replica's collection may have raced it) and
puts back any missing. Snapshot tars of format 1 (one tar per snapshot, before segments) are
still restored.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import tarfile
import uuid
from pathlib import Path
from typing import Any

from meshkit.core.fsutil import fsync_dir, write_atomic
from meshkit.domain.ids import sha256_file
from meshkit.replication.snapshots import Pointer, RemoteSnapshots
from meshkit.settings import IndexSettings
from meshkit.storage.objectstore import ObjectNotFound, ObjectStore
from services.index.legacy import install_legacy_tar
from services.index.segment_files import FileRef
from services.index.snapshots import CURRENT, META, SNAPSHOTS, SnapshotError, check_paths, manifest_refs

BLOBS = "files/"


class SnapshotRemote:
    def __init__(
        self, store: ObjectStore, bucket: str, shard: int, shard_count: int, replica: str | None = None
    ) -> None:
        self.store = store
        self.bucket = bucket
        self.remote = RemoteSnapshots(store, bucket, f"index/shard-{shard}-of-{shard_count}/")
        # Names this replica's tars, so replicas of one shard never overwrite each other's.
        self.replica = replica or uuid.uuid4().hex[:8]
        # collection -> digests of blobs named by manifests this process has seen.
        self._seen: dict[str, set[str]] = {}
        self.uploaded_bytes = 0

    @property
    def prefix(self) -> str:
        return self.remote.prefix

    @classmethod
    def from_settings(cls, settings: IndexSettings) -> SnapshotRemote:
        return cls(
            ObjectStore.from_settings(settings),
            settings.snapshots_bucket,
            settings.index_shard,
            settings.index_shard_count,
        )

    def _blobs(self, collection: str) -> str:
        return f"{self.prefix}{collection}/{BLOBS}"

    async def latest(self) -> dict[str, Pointer]:
        return await self.remote.latest()

    async def pointer(self, collection: str) -> Pointer | None:
        return await self.remote.pointer(collection)

    async def _present(self, collection: str) -> set[str]:
        prefix = self._blobs(collection)
        return {k[len(prefix) :] for k in await self.store.list_keys(self.bucket, prefix)}

    async def _put_missing(self, collection: str, collection_dir: Path, refs: list[FileRef]) -> None:
        present = await self._present(collection)
        for ref in {r.sha256: r for r in refs}.values():
            if ref.sha256 not in present:
                await self.store.put_file(
                    self.bucket, self._blobs(collection) + ref.sha256, str(collection_dir / ref.path)
                )
                self.uploaded_bytes += ref.size

    async def upload(
        self, collection: str, snapshot_dir: Path, log_pos: int, log_id: str, work_dir: Path
    ) -> Pointer:
        """Upload the files of the checkpoint in ``snapshot_dir`` that the store lacks, then its
        manifest, and point ``latest`` at it (``work_dir``: the collection's directory)."""
        manifest = json.loads((snapshot_dir / META).read_bytes())
        refs = manifest_refs(manifest)
        await self.remote.ensure_bucket()
        await self._put_missing(collection, work_dir, refs)
        archive = work_dir / f".upload-{uuid.uuid4().hex[:8]}.tar"
        try:
            await asyncio.to_thread(_pack, snapshot_dir, work_dir, archive)
            pointer = await self.remote.upload(collection, archive, log_pos, log_id, self.replica)
        finally:
            archive.unlink(missing_ok=True)
        await self._put_missing(collection, work_dir, refs)
        await self._collect(collection, {r.sha256 for r in refs})
        return pointer

    async def _collect(self, collection: str, current: set[str]) -> None:
        """Delete the blobs this process saw named that no kept manifest names any more."""
        keep = set(current)
        prefix = f"{self.prefix}{collection}/"
        for key in await self.store.list_keys(self.bucket, prefix):
            if key.endswith(".tar") and "/" not in key[len(prefix) :]:
                try:
                    keep |= {
                        r.sha256 for r in manifest_refs(_manifest_of(await self.store.get(self.bucket, key)))
                    }
                except (ObjectNotFound, SnapshotError, KeyError, ValueError, tarfile.TarError):
                    continue
        seen = self._seen.setdefault(collection, set())
        for digest in sorted(seen - keep):
            await self.store.delete(self.bucket, self._blobs(collection) + digest)
        self._seen[collection] = keep

    async def restore(self, collection: str, collection_dir: Path) -> Pointer:
        """Download the latest checkpoint of ``collection`` into a fresh ``collection_dir`` and
        make it current; returns its pointer (where in the log it ends)."""
        await asyncio.to_thread(_fresh_dir, collection_dir)
        archive = collection_dir / ".restore.tar"
        try:
            pointer = await self.remote.download(collection, archive)
            names = await asyncio.to_thread(_member_names, archive)
            if META in names:  # one tar per snapshot, before segments
                await asyncio.to_thread(install_legacy_tar, collection_dir, archive)
                return pointer
            rel, manifest = await asyncio.to_thread(_read_packed, archive)
            refs = manifest_refs(manifest)
            check_paths(refs)
            for ref in {r.path: r for r in refs}.values():
                await self._fetch(collection, collection_dir, ref)
            await asyncio.to_thread(_place_manifest, collection_dir, rel, archive)
        finally:
            archive.unlink(missing_ok=True)
        self._seen.setdefault(collection, set()).update(r.sha256 for r in refs)
        return pointer

    async def _fetch(self, collection: str, collection_dir: Path, ref: FileRef) -> None:
        dest = collection_dir / ref.path
        await asyncio.to_thread(dest.parent.mkdir, parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.download")
        await self.store.get_file(self.bucket, self._blobs(collection) + ref.sha256, str(tmp))
        digest = await asyncio.to_thread(sha256_file, tmp)
        if digest != ref.sha256:
            tmp.unlink(missing_ok=True)
            raise SnapshotError(f"{ref.path}: downloaded sha256 {digest} does not match the manifest")
        await asyncio.to_thread(_durable_rename, tmp, dest)


def _pack(snapshot_dir: Path, collection_dir: Path, dest: Path) -> None:
    """A tar of the checkpoint's manifest alone, under its path in the collection directory."""
    rel = snapshot_dir.relative_to(collection_dir).as_posix()
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(snapshot_dir / META, arcname=f"{rel}/{META}", recursive=False)


def _member_names(archive: Path) -> set[str]:
    with tarfile.open(archive, "r") as tar:
        return set(tar.getnames())


def _manifest_of(raw: bytes) -> dict[str, Any]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(f"/{META}"):
                source = tar.extractfile(member)
                assert source is not None
                return dict(json.loads(source.read()))
    raise SnapshotError("checkpoint archive without a manifest")


def _read_packed(archive: Path) -> tuple[str, dict[str, Any]]:
    rel, raw = _packed_bytes(archive)
    return rel, dict(json.loads(raw))


def _packed_bytes(archive: Path) -> tuple[str, bytes]:
    """The checkpoint directory a packed manifest belongs to, and the manifest's bytes."""
    with tarfile.open(archive, "r") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        if len(members) != 1 or not members[0].name.endswith(f"/{META}"):
            raise SnapshotError("checkpoint archive must hold one manifest")
        rel = members[0].name[: -len(META) - 1]
        parts = rel.split("/")
        if len(parts) != 2 or parts[0] != SNAPSHOTS or parts[1] in ("", ".", ".."):
            raise SnapshotError(f"checkpoint archive names {rel!r}")
        source = tar.extractfile(members[0])
        assert source is not None
        return rel, source.read()


def _place_manifest(collection_dir: Path, rel: str, archive: Path) -> None:
    """Write the downloaded manifest last (its files are all in place) and make it current."""
    _rel, raw = _packed_bytes(archive)
    directory = collection_dir / rel
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{META}.download"
    tmp.write_bytes(raw)
    _durable_rename(tmp, directory / META)
    write_atomic(collection_dir / CURRENT, f"{rel}\n".encode())


def _durable_rename(tmp: Path, dest: Path) -> None:
    with tmp.open("rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)  # leftovers of an earlier, failed restore
    path.mkdir(parents=True)
