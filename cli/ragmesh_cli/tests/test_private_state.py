"""The stack keeps its state dir private: a repair of state written before it did, and the umask
its processes start with."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from ragmesh_cli import procutil


def modes_under(root: Path) -> dict[str, int]:
    found = {root.name: stat.S_IMODE(root.lstat().st_mode)}
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = Path(folder) / name
            if not path.is_symlink():
                found[name] = stat.S_IMODE(path.lstat().st_mode)
    return found


def test_existing_state_is_made_private(tmp_path: Path) -> None:
    """State written before the stack kept it private is repaired (Stack.up runs this first)."""
    data = tmp_path / "state" / "sparse" / "chunks"
    data.mkdir(parents=True)
    (data / "chunk.txt").write_text("tenant text")
    (data / "chunk.txt").chmod(0o644)
    for folder in (data, data.parent, data.parent.parent):
        folder.chmod(0o755)
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("not the stack's")
    outside.chmod(0o644)
    (data / "link").symlink_to(outside)
    assert procutil.make_private(tmp_path / "state") == 4
    modes = modes_under(tmp_path / "state")
    assert modes == {"state": 0o700, "sparse": 0o700, "chunks": 0o700, "chunk.txt": 0o600}
    # A link is not followed: what it points to is not the stack's to change.
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644


def test_a_second_repair_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    procutil.make_private(tmp_path)
    assert procutil.make_private(tmp_path) == 0


def test_processes_start_with_a_private_umask(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "child.log"
    made = tmp_path / "made.txt"
    code = f"open({str(made)!r}, 'w').write('x')"
    proc = procutil.spawn([sys.executable, "-c", code], dict(os.environ), log, tmp_path, header="test")
    assert proc.wait(timeout=30) == 0
    assert stat.S_IMODE(made.stat().st_mode) == 0o600


def test_private_umask_is_restored() -> None:
    before = os.umask(0o022)
    try:
        with procutil.private_umask():
            assert os.umask(0o077) == 0o077
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(before)


def test_json_is_written_private_by_default(tmp_path: Path) -> None:
    procutil.write_json_atomic(tmp_path / "state.json", {"a": 1})
    assert stat.S_IMODE((tmp_path / "state.json").stat().st_mode) == 0o600
