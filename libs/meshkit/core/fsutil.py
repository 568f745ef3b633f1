"""Small durable-file helpers: data is only "written" once it and its directory entry are fsynced."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

PRIVATE_FILE_MODE = 0o600


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with path.open("rb+") as f:
        os.fsync(f.fileno())


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a reader sees the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def replace_private(path: Path, data: bytes, mode: int = PRIVATE_FILE_MODE) -> None:
    """Replace ``path`` with ``data`` (mode ``mode`` from the first byte, 0600 by default), so a
    reader sees the old or the new content, and it survives a crash once this returns. A
    temporary file of its own (not a fixed name) lets two writers of one path not collide."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
