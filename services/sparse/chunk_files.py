"""The chunk text files that ripgrep scans for the exact leg: one file per chunk,
``<dir>/<2 hex>/<chunk_id>.txt``, line 1 the title and line 2 the body, each on one line. Kept in
ripgrep mode only: the phrase mode (the default) reads the tantivy index, and a file per chunk
costs a filesystem block and an inode each (5.5 KB per chunk at a million chunks)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from services.sparse.records import ChunkRecord
from services.sparse.schema import one_line


class ChunkFiles:
    """Chunk text as ``<dir>/<2 hex>/<chunk_id>.txt``: line 1 the title, line 2 the body."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, chunk_id: str) -> Path:
        return self.root / chunk_id[:2] / f"{chunk_id}.txt"

    @staticmethod
    def render(record: ChunkRecord) -> str:
        # NUL would make ripgrep treat the file as binary and skip it.
        return f"{one_line(record.title)}\n{one_line(record.text)}\n".replace("\x00", " ")

    def write(self, records: Iterable[ChunkRecord]) -> None:
        for record in records:
            target = self.path(record.chunk_id)
            target.parent.mkdir(parents=True, exist_ok=True)
            # Dot-prefixed: ripgrep skips hidden files, so a half-written tmp is never scanned.
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(self.render(record), encoding="utf-8")
            os.replace(tmp, target)

    def remove(self, chunk_ids: Iterable[str]) -> None:
        for chunk_id in chunk_ids:
            with contextlib.suppress(FileNotFoundError):
                self.path(chunk_id).unlink()

    def chunk_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return [p.stem for p in self.root.glob("*/*.txt")]

    @property
    def complete_marker(self) -> Path:
        """Present once every committed chunk has its file (hidden: ripgrep skips it)."""
        return self.root / ".complete"


class NoChunkFiles(ChunkFiles):
    """The phrase mode's: no file is written, and none is there to remove."""

    def write(self, records: Iterable[ChunkRecord]) -> None:
        return None

    def remove(self, chunk_ids: Iterable[str]) -> None:
        return None

    def chunk_ids(self) -> list[str]:
        return []
