"""Snapshots of a store's collections in the object store, so a replica with an empty disk can
come back (index shards and sparse share this; each packs and installs its own files).

Layout under the snapshots bucket, ``<prefix>`` being e.g. ``index/shard-1-of-2/`` or ``sparse/``::

    <prefix><collection>/<log position>-<replica>.tar   one packed snapshot
    <prefix><collection>/latest                          pointer: key, sha256, size, log position, log

The tar goes up first and ``latest`` is switched after it, so a reader following ``latest``
always finds a complete object. Every replica of a shard uploads to the same place: a replica
skips its upload when ``latest`` already covers its position, and the tar names carry the
replica so two of them never overwrite each other's object.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from meshkit.domain.ids import sha256_file
from meshkit.storage.objectstore import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

LATEST = "latest"
# Tars kept per collection: the newest, and the one before for a reader already downloading it.
_KEEP_OBJECTS = 2


@dataclass(frozen=True)
class Pointer:
    """What ``latest`` says: the object to fetch and the log position the snapshot covers."""

    key: str
    sha256: str
    size: int
    log_pos: int
    log_id: str

    @classmethod
    def parse(cls, raw: bytes) -> Pointer:
        data = json.loads(raw)
        # Pointers written before the replicated log have no position: replay from the start.
        return cls(
            key=str(data["key"]),
            sha256=str(data["sha256"]),
            size=int(data.get("size", 0)),
            log_pos=int(data.get("log_pos", 0)),
            log_id=str(data.get("log", "")),
        )

    def encode(self) -> bytes:
        return json.dumps(
            {
                "key": self.key,
                "sha256": self.sha256,
                "size": self.size,
                "log_pos": self.log_pos,
                "log": self.log_id,
            }
        ).encode()


class RemoteSnapshots:
    def __init__(self, store: ObjectStore, bucket: str, prefix: str) -> None:
        self.store = store
        self.bucket = bucket
        self.prefix = prefix if prefix.endswith("/") else f"{prefix}/"
        self._bucket_ready = False

    async def ensure_bucket(self) -> None:
        if not self._bucket_ready:
            await self.store.ensure_bucket(self.bucket)
            self._bucket_ready = True

    def _latest_key(self, collection: str) -> str:
        return f"{self.prefix}{collection}/{LATEST}"

    async def latest(self) -> dict[str, Pointer]:
        """Collection -> its latest pointer, for every collection under the prefix."""
        await self.ensure_bucket()
        found: dict[str, Pointer] = {}
        for key in await self.store.list_keys(self.bucket, self.prefix):
            parts = key[len(self.prefix) :].split("/")
            if len(parts) == 2 and parts[1] == LATEST:
                found[parts[0]] = Pointer.parse(await self.store.get(self.bucket, key))
        return found

    async def pointer(self, collection: str) -> Pointer | None:
        await self.ensure_bucket()
        try:
            return Pointer.parse(await self.store.get(self.bucket, self._latest_key(collection)))
        except ObjectNotFound:
            return None

    async def upload(
        self, collection: str, archive: Path, log_pos: int, log_id: str, replica: str
    ) -> Pointer:
        """Upload a packed snapshot and point ``latest`` at it."""
        await self.ensure_bucket()
        key = f"{self.prefix}{collection}/{log_pos:020d}-{replica}.tar"
        digest = await asyncio.to_thread(sha256_file, archive)
        await self.store.put_file(self.bucket, key, str(archive))
        size = (await asyncio.to_thread(archive.stat)).st_size
        pointer = Pointer(key, digest, size, log_pos, log_id)
        await self.store.put(
            self.bucket, self._latest_key(collection), pointer.encode(), content_type="application/json"
        )
        await self._drop_old(collection, key)
        return pointer

    async def _drop_old(self, collection: str, current: str) -> None:
        keys = sorted(
            k
            for k in await self.store.list_keys(self.bucket, f"{self.prefix}{collection}/")
            if k.endswith(".tar")
        )
        for key in keys[: max(0, len(keys) - _KEEP_OBJECTS)]:
            if key != current:
                await self.store.delete(self.bucket, key)

    async def download(self, collection: str, dest: Path) -> Pointer:
        """Fetch the latest snapshot of ``collection`` into ``dest``, checked against its pointer."""
        pointer = await self.pointer(collection)
        if pointer is None:
            raise ObjectNotFound(f"{self.bucket}/{self._latest_key(collection)}")
        await self.store.get_file(self.bucket, pointer.key, str(dest))
        digest = await asyncio.to_thread(sha256_file, dest)
        if digest != pointer.sha256:
            raise ValueError(f"{pointer.key}: sha256 {digest} does not match latest ({pointer.sha256})")
        return pointer
