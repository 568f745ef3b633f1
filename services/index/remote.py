"""Snapshots in the object store, so a replica with an empty disk can come back.

Layout in the snapshots bucket::

    index/shard-<n>-of-<count>/<collection>/<sequence>.tar   one packed snapshot
    index/shard-<n>-of-<count>/<collection>/latest           {"key", "sequence", "sha256", "size"}

The tar goes up first and ``latest`` is switched after it, so a reader following ``latest``
always finds a complete object. The previous tar is kept for a reader already downloading it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import uuid
from pathlib import Path

from meshkit.ids import sha256_file
from meshkit.objectstore import ObjectStore
from meshkit.settings import IndexSettings
from services.index.snapshots import install_packed, pack

log = logging.getLogger(__name__)

LATEST = "latest"
_KEEP_OBJECTS = 2


class SnapshotRemote:
    def __init__(self, store: ObjectStore, bucket: str, shard: int, shard_count: int) -> None:
        self.store = store
        self.bucket = bucket
        self.prefix = f"index/shard-{shard}-of-{shard_count}/"
        self._bucket_ready = False

    @classmethod
    def from_settings(cls, settings: IndexSettings) -> SnapshotRemote:
        return cls(
            ObjectStore.from_settings(settings),
            settings.snapshots_bucket,
            settings.index_shard,
            settings.index_shard_count,
        )

    async def ensure_bucket(self) -> None:
        if not self._bucket_ready:
            await self.store.ensure_bucket(self.bucket)
            self._bucket_ready = True

    async def latest_sequences(self) -> dict[str, int]:
        """Collection -> sequence of its latest uploaded snapshot, for this shard."""
        await self.ensure_bucket()
        found: dict[str, int] = {}
        for key in await self.store.list_keys(self.bucket, self.prefix):
            parts = key[len(self.prefix) :].split("/")
            if len(parts) == 2 and parts[1] == LATEST:
                pointer = json.loads(await self.store.get(self.bucket, key))
                found[parts[0]] = int(pointer["sequence"])
        return found

    async def upload(self, collection: str, snapshot_dir: Path, sequence: int, work_dir: Path) -> str:
        """Pack and upload one snapshot, then point ``latest`` at it; returns the object key."""
        await self.ensure_bucket()
        archive = work_dir / f".upload-{uuid.uuid4().hex[:8]}.tar"
        try:
            digest = await asyncio.to_thread(pack, snapshot_dir, archive)
            key = f"{self.prefix}{collection}/{sequence:020d}.tar"
            await self.store.put_file(self.bucket, key, str(archive))
            pointer = {"key": key, "sequence": sequence, "sha256": digest, "size": archive.stat().st_size}
            await self.store.put(
                self.bucket,
                f"{self.prefix}{collection}/{LATEST}",
                json.dumps(pointer).encode(),
                content_type="application/json",
            )
        finally:
            archive.unlink(missing_ok=True)
        await self._drop_old(collection, key)
        return key

    async def _drop_old(self, collection: str, current: str) -> None:
        keys = sorted(
            k
            for k in await self.store.list_keys(self.bucket, f"{self.prefix}{collection}/")
            if k.endswith(".tar")
        )
        for key in keys[: max(0, len(keys) - _KEEP_OBJECTS)]:
            if key != current:
                await self.store.delete(self.bucket, key)

    async def restore(self, collection: str, collection_dir: Path) -> int:
        """Download the latest snapshot of ``collection`` into an empty ``collection_dir`` and
        make it current; returns its sequence."""
        pointer = json.loads(await self.store.get(self.bucket, f"{self.prefix}{collection}/{LATEST}"))
        await asyncio.to_thread(_fresh_dir, collection_dir)
        archive = collection_dir / ".restore.tar"
        try:
            await self.store.get_file(self.bucket, pointer["key"], str(archive))
            digest = await asyncio.to_thread(sha256_file, archive)
            if digest != pointer["sha256"]:
                raise ValueError(
                    f"{pointer['key']}: sha256 {digest} does not match latest ({pointer['sha256']})"
                )
            await asyncio.to_thread(install_packed, collection_dir, archive)
        finally:
            archive.unlink(missing_ok=True)
        return int(pointer["sequence"])


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)  # leftovers of an earlier, failed restore
    path.mkdir(parents=True)
