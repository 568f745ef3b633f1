"""Data at rest of the secure stack is its owner's alone: after a full ingest (documents in the
object store, chunk text in sparse, payloads in the index shards, NATS streams, logs), every
folder under the state dir is 0700 and every file 0600, and another local user (``nobody``)
reads none of them. The state dir sits in a folder anyone may enter (conftest.py), so only the
stack's own permissions stand in the way; a control file shows that ``nobody`` reads what is
left open."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragmesh_cli.stack import Stack

pytestmark = pytest.mark.integration

# Reads the first byte of each path on stdin (a folder: lists it); prints the ones it could.
READER = (
    'while IFS= read -r p; do if head -c 1 -- "$p" >/dev/null 2>&1 || ls -- "$p" >/dev/null 2>&1; '
    'then printf "%s\\n" "$p"; fi; done'
)


def entries(root: Path) -> Iterator[Path]:
    yield root
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            yield Path(folder) / name


def readable_by_nobody(paths: list[Path]) -> list[str]:
    """The paths user ``nobody`` can read or list."""
    nobody = pwd.getpwnam("nobody")
    done = subprocess.run(
        ["/bin/sh", "-c", READER],
        input="\n".join(map(str, paths)) + "\n",
        capture_output=True,
        text=True,
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        cwd="/",
        timeout=120,
        check=True,
    )
    return done.stdout.split()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root")


def test_every_folder_is_0700_and_every_file_0600(secure_stack: Stack, indexed: dict[str, list[str]]) -> None:
    opened = []
    kinds = set()
    for path in entries(secure_stack.state_dir):
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        kinds.add(path.relative_to(secure_stack.state_dir).parts[:1])
        if stat.S_IMODE(mode) & 0o077:
            opened.append(f"{path}: {stat.filemode(mode)}")
    assert not opened, "\n".join(opened)
    # The walk saw the data of every store, not an empty dir.
    assert {("s3",), ("sparse",), ("index-0",), ("nats",), ("logs",), ("secure",)} <= kinds, kinds


@needs_root
def test_another_user_reads_nothing(secure_stack: Stack, indexed: dict[str, list[str]]) -> None:
    paths = list(entries(secure_stack.state_dir))
    assert len(paths) > 50
    assert readable_by_nobody(paths) == []


@needs_root
def test_nobody_reads_what_is_left_open() -> None:
    with tempfile.TemporaryDirectory() as parent:
        Path(parent).chmod(0o755)
        control = Path(parent) / "open.txt"
        control.write_text("readable")
        control.chmod(0o644)
        assert readable_by_nobody([control]) == [str(control)]
