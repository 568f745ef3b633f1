"""Editing an API keys file in place (``ragmesh keys add/revoke``, ``ragmesh up --secure``),
safely while the services that read it are running.

``LockedKeysFile`` holds an exclusive lock (``flock`` on ``.<name>.lock`` beside the file) for
the whole read-modify-write, so two editors cannot lose each other's change. It reads the file
and validates it with the services' own parser: a file the services would refuse is refused here
too, before anything is changed. Entries are kept exactly as written (every field, in order);
``save`` validates the result again and puts it in place atomically (a temporary file in the same
directory, mode 0600, fsynced, then renamed over the old one), so a service polling the file sees
the old version or the new one, never half of one. Error messages name the file and the problem,
never a key or a digest.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from meshkit.core.fsutil import replace_private
from meshkit.rpc.auth import KeysFileError, parse_keys, read_keys_text

Entry = dict[str, Any]
FILE_MODE = 0o600


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def read_entries(path: Path) -> list[Entry]:
    """The entries of a valid keys file as written; [] when there is no file yet."""
    if not path.exists():
        return []
    text = read_keys_text(path)
    parse_keys(text, str(path))  # the services' own validation, with its messages
    entries: list[Entry] = json.loads(text)["keys"]
    return entries


def render(entries: list[Entry]) -> str:
    return json.dumps({"keys": entries}, indent=2) + "\n"


def write_entries(path: Path, entries: list[Entry]) -> None:
    """Validate ``entries`` as a keys file, then replace ``path`` with them atomically (0600)."""
    text = render(entries)
    parse_keys(text, str(path))
    try:
        replace_private(path, text.encode("utf-8"), FILE_MODE)
    except OSError as exc:
        raise KeysFileError(f"cannot write the API keys file {str(path)!r}: {exc.strerror}") from None


class LockedKeysFile:
    """``with LockedKeysFile(path) as keys:`` the file's entries, locked until the block ends;
    change ``keys.entries`` (or use ``add``/``remove``) and ``save()``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries: list[Entry] = []
        self._original: list[Entry] = []
        self._lock_fd: int | None = None

    def __enter__(self) -> LockedKeysFile:
        if not self.path.parent.is_dir():
            raise KeysFileError(f"{self.path}: the directory {str(self.path.parent)!r} does not exist")
        fd = os.open(lock_path(self.path), os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.entries = read_entries(self.path)
        except BaseException:
            os.close(fd)  # closing the descriptor releases the lock
            raise
        self._lock_fd = fd
        self._original = copy.deepcopy(self.entries)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def entry(self, name: str) -> Entry | None:
        return next((e for e in self.entries if e.get("name") == name), None)

    def has_digest(self, sha256: str) -> bool:
        return any(str(e.get("sha256", "")).lower() == sha256.lower() for e in self.entries)

    def add(self, entry: Entry) -> None:
        """Append ``entry``; KeysFileError when its name is taken."""
        if self.entry(entry["name"]) is not None:
            raise KeysFileError(
                f"{self.path}: a key named {entry['name']!r} already exists (revoke it first, or "
                "choose another name)"
            )
        self.entries.append(entry)

    def remove(self, name: str) -> Entry:
        """Take out the entry named ``name``; KeysFileError when there is none."""
        found = self.entry(name)
        if found is None:
            raise KeysFileError(f"{self.path}: no key named {name!r}")
        self.entries.remove(found)
        return found

    def save(self) -> bool:
        """Write the entries if they changed; True when the file was replaced."""
        if self._lock_fd is None:
            raise RuntimeError("LockedKeysFile.save outside its 'with' block")
        if self.entries == self._original and self.path.exists():
            return False
        write_entries(self.path, self.entries)
        self._original = copy.deepcopy(self.entries)
        return True
