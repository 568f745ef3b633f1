"""Live reload of the API keys file: a public service (gateway, ingestion API) picks up added,
changed and revoked keys without a restart.

Every ``api_keys_reload_s`` seconds the reloader compares the file's (mtime_ns, size, inode) with
what it last saw; on a change it parses and validates the file like the start does and swaps the
guard's keys at once (``Guard.replace_keys``). A file that does not parse, or is gone, changes
nothing: the previous keys stay in force, the error is logged (the parser's messages never quote
the file's values) and counted in ``ragmesh_auth_keys_reloads_total{outcome="invalid"}``, once
per version of the file. The inode is part of the signature because the file is replaced by a
rename (``ragmesh keys``, a Kubernetes Secret volume's symlink swap): the mtime and size of a
replacement can equal the old ones.

Each process reloads on its own, pre-fork workers included: a revoked key is refused by every
process within one interval (plus the time of a parse).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from meshkit.rpc.auth import Guard, KeysFileError, Rate, default_rate_of, load_keys
from meshkit.rpc.metrics import AUTH_KEYS_RELOADS
from meshkit.settings import MeshSettings

log = logging.getLogger("meshkit.rpc.keyreload")


@dataclass(frozen=True)
class FileSignature:
    """What tells one version of a file from the next without reading it."""

    mtime_ns: int
    size: int
    inode: int


def signature_of(path: Path) -> FileSignature | None:
    """The file's signature; None when it cannot be stat'ed (gone, unreadable directory)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileSignature(st.st_mtime_ns, st.st_size, st.st_ino)


class KeysReloader:
    """Keeps ``guard``'s keys equal to the last valid version of ``path``."""

    def __init__(self, guard: Guard, path: Path, interval_s: float, default_rate: Rate | None = None) -> None:
        self.guard = guard
        self.path = path
        self.interval_s = interval_s
        self.default_rate = default_rate
        # The first poll reads the file once more whatever its signature, so a change between
        # the start's read and this reloader's first look is not missed (an unchanged file
        # changes nothing).
        self.signature: FileSignature | None = None
        self._looked = False
        self._task: asyncio.Task[None] | None = None

    def poll(self) -> bool:
        """Look at the file once; True when new keys were put in force."""
        signature = signature_of(self.path)
        if self._looked and signature == self.signature:
            return False
        self.signature, self._looked = signature, True
        if signature is None:
            self._refuse("the file cannot be read (missing?)")
            return False
        # Stat before read: a write in between shows as a new signature at the next poll.
        try:
            keys = load_keys(self.path, self.default_rate)
        except KeysFileError as exc:
            self._refuse(str(exc))
            return False
        change = self.guard.replace_keys(keys)
        if not change:
            return False
        AUTH_KEYS_RELOADS.labels(self.guard.service, "ok").inc()
        log.info(
            "API keys reloaded",
            extra={
                "keys_file": str(self.path),
                "added": list(change.added),
                "removed": list(change.removed),
                "changed": list(change.changed),
                "api_keys": len(keys),
            },
        )
        if not keys:
            log.warning("the API keys file lists no keys: every call will be refused")
        return True

    def _refuse(self, reason: str) -> None:
        AUTH_KEYS_RELOADS.labels(self.guard.service, "invalid").inc()
        log.error(
            "API keys file refused: the previous keys stay in force until it is fixed",
            extra={"keys_file": str(self.path), "reason": reason},
        )

    async def run(self) -> None:
        """Poll until cancelled; a poll that fails unexpectedly is logged, not fatal."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                # Off the event loop: a slow disk must not hold up the calls being served.
                await asyncio.to_thread(self.poll)
            except Exception:
                log.exception("API keys reload failed; the previous keys stay in force")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="api-keys-reload")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


def reloader_for(guard: Guard | None, settings: MeshSettings) -> KeysReloader | None:
    """The reloader of a guarded service's keys file; None without a guard or with reload off
    (api_keys_reload_s = 0)."""
    if guard is None or settings.api_keys_file is None or settings.api_keys_reload_s <= 0:
        return None
    return KeysReloader(guard, settings.api_keys_file, settings.api_keys_reload_s, default_rate_of(settings))
