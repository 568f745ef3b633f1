"""This shard's snapshots in the object store (``index/shard-<n>-of-<count>/<collection>/``), so a
replica with an empty disk (or a quarantined collection) comes back from there plus the log.
The layout and the pointer are meshkit.replication.snapshots'; this module packs and installs the
index's own snapshot directories."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

from meshkit.replication.snapshots import Pointer, RemoteSnapshots
from meshkit.settings import IndexSettings
from meshkit.storage.objectstore import ObjectStore
from services.index.snapshots import install_packed, pack


class SnapshotRemote:
    def __init__(
        self, store: ObjectStore, bucket: str, shard: int, shard_count: int, replica: str | None = None
    ) -> None:
        self.remote = RemoteSnapshots(store, bucket, f"index/shard-{shard}-of-{shard_count}/")
        # Names this replica's tars, so replicas of one shard never overwrite each other's.
        self.replica = replica or uuid.uuid4().hex[:8]

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

    async def latest(self) -> dict[str, Pointer]:
        return await self.remote.latest()

    async def pointer(self, collection: str) -> Pointer | None:
        return await self.remote.pointer(collection)

    async def upload(
        self, collection: str, snapshot_dir: Path, log_pos: int, log_id: str, work_dir: Path
    ) -> Pointer:
        """Pack and upload one snapshot, then point ``latest`` at it."""
        archive = work_dir / f".upload-{uuid.uuid4().hex[:8]}.tar"
        try:
            await asyncio.to_thread(pack, snapshot_dir, archive)
            return await self.remote.upload(collection, archive, log_pos, log_id, self.replica)
        finally:
            archive.unlink(missing_ok=True)

    async def restore(self, collection: str, collection_dir: Path) -> Pointer:
        """Download the latest snapshot of ``collection`` into a fresh ``collection_dir`` and make
        it current; returns its pointer (where in the log it ends)."""
        await asyncio.to_thread(_fresh_dir, collection_dir)
        archive = collection_dir / ".restore.tar"
        try:
            pointer = await self.remote.download(collection, archive)
            await asyncio.to_thread(install_packed, collection_dir, archive)
        finally:
            archive.unlink(missing_ok=True)
        return pointer


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)  # leftovers of an earlier, failed restore
    path.mkdir(parents=True)
