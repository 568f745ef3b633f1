"""A process killed at any step of a checkpoint, a seal, a compaction or a merge of files comes
back (current checkpoint + WAL replay) to the same state as a replica that applied the same
writes and never crashed; until the new checkpoint is current, the previous one stays current
and intact.

The kill is simulated at the n-th durable step (each fsync, rename or replace: the points where
what a crash leaves behind changes), for every n the job takes: the step raises, no cleanup
runs (a killed process cleans nothing up), the files stay as they are, and the index is
reopened from them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.index import mutations as mut
from services.index.snapshots import current_snapshot_dir, read_meta, verify_manifest
from services.index.store import CollectionIndex

from .conftest import cid, open_index, random_vectors
from .test_segments import write_docs

SETTINGS: dict[str, Any] = {"index_type": "flat", "segment_rows": 100, "compact_deleted_ratio": 0.2}
QUERIES = random_vectors(8, seed=99)


class Killed(BaseException):
    """The process died here (not an Exception: nothing may catch it and go on)."""


class Steps:
    """Counts durable steps; raises Killed at step ``kill_at`` (never when None)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kill_at: int | None) -> None:
        self.count = 0
        self.kill_at = kill_at
        for name in ("fsync", "rename", "replace"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._wrap(real))
        # A killed process runs no cleanup: temporary directories stay where they are.
        monkeypatch.setattr(shutil, "rmtree", self._rmtree(shutil.rmtree))

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            if self.count == self.kill_at:
                raise Killed(f"killed at step {self.count}")
            self.count += 1
            return real(*args, **kwargs)

        return step

    def _rmtree(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def rmtree(path: Any, *args: Any, **kwargs: Any) -> Any:
            if self.kill_at is not None and self.count >= self.kill_at:
                return None
            return real(path, *args, **kwargs)

        return rmtree


def history(index: CollectionIndex) -> None:
    """Writes that leave sealed, frozen and growing segments, deletes in all of them, a
    committed checkpoint and WAL records after it."""
    write_docs(index, random_vectors(350, seed=1))
    index.rebuild()
    index.snapshot()
    index.delete([], ["doc-2", "doc-33"])
    old = index._s.chunk_ids_of("doc-4")
    new = mut.ChunkBatch([cid("doc-4", 900)], ["doc-4"], random_vectors(1, seed=2))
    index.replace_documents([mut.Replacement("doc-4", new, old[:3], 7, mut.Source("t", "u", (("k", "v"),)))])
    write_docs(index, random_vectors(80, seed=3), first_doc=40)  # freezes the growing segment
    index.upsert(mut.ChunkBatch([cid("doc-0", 0)], ["doc-0"], random_vectors(1, seed=4)))
    index.delete([], [f"doc-{d}" for d in range(10, 20)])  # a sealed segment past the deleted ratio


def more(index: CollectionIndex) -> None:
    write_docs(index, random_vectors(30, seed=5), first_doc=70)
    index.delete([cid("doc-41", 15)], ["doc-6"])


def assert_same(a: CollectionIndex, b: CollectionIndex) -> None:
    sa, sb = a.stats(), b.stats()
    assert (sa.chunks, sa.documents, sa.sequence) == (sb.chunks, sb.documents, sb.sequence)
    listing = a.list_documents("", 10_000)
    assert listing == b.list_documents("", 10_000)
    ids = [c for entry in listing for c in entry.chunk_ids]
    assert a.get_chunks(ids) == b.get_chunks(ids)
    for q in QUERIES:
        assert [h.chunk_id for h in a.search(q, 20)] == [h.chunk_id for h in b.search(q, 20)]


def reference(root: Path) -> CollectionIndex:
    index = open_index(root, **SETTINGS)
    history(index)
    return index


def died(index: CollectionIndex) -> None:
    index._wal.close()  # the kernel closes a dead process's files


JOBS: dict[str, Callable[[CollectionIndex], object]] = {
    "checkpoint": lambda index: index.snapshot(),
    # seal the frozen segment, compact the segment past its deleted ratio
    "rebuild": lambda index: index.rebuild(),
}


def count_steps(tmp_path: Path, job: str, monkeypatch: pytest.MonkeyPatch) -> int:
    index = reference(tmp_path / "count")
    with monkeypatch.context() as patch:
        steps = Steps(patch, None)
        JOBS[job](index)
    return steps.count


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_kill_at_any_step_recovers_to_the_uncrashed_state(
    tmp_path: Path, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = count_steps(tmp_path, job, monkeypatch)
    assert total > 10
    expected = reference(tmp_path / "expected")
    for kill_at in range(total):
        root = tmp_path / f"kill-{kill_at}"
        index = reference(root)
        current = current_snapshot_dir(root / "docs")
        with monkeypatch.context() as patch, pytest.raises(Killed):
            Steps(patch, kill_at)
            JOBS[job](index)
        died(index)
        now = current_snapshot_dir(root / "docs")
        assert now is not None
        if job != "checkpoint":
            assert now == current  # background work never moves CURRENT
        verify_manifest(root / "docs", read_meta(now))  # the previous checkpoint or the new one: whole
        reopened = open_index(root, **SETTINGS)
        assert_same(reopened, expected)
        # It goes on like the replica that never crashed.
        for replica in (reopened, expected):
            more(replica)
        reopened.rebuild()
        reopened.snapshot()
        assert_same(reopened, expected)
        reopened.close()
        assert_same(open_index(root, **SETTINGS), expected)
        expected = reference(tmp_path / f"expected-{kill_at}")


def test_a_failed_checkpoint_is_retried_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that fails (disk full) and is retried writes what the failed one had to."""
    index = reference(tmp_path / "a")
    expected = reference(tmp_path / "b")
    with monkeypatch.context() as patch:

        def full(*args: Any, **kwargs: Any) -> None:
            raise OSError("No space left on device")

        patch.setattr(np, "save", full)
        with pytest.raises(OSError):
            index.snapshot()
    index.snapshot()
    index.close()
    assert_same(open_index(tmp_path / "a", **SETTINGS), expected)
