"""Reading the local stack's record, ``<state_dir>/stack.json`` (written by ``ragmesh up``,
ragmesh_cli.stack): every command that finds the stack through it reads it here."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ragmesh_cli import procutil

STATE_VERSION = 1
STATE_FILE = "stack.json"


class StackError(RuntimeError):
    """The stack could not be brought to the requested state; the message says why."""


def read_state(state_dir: Path) -> dict[str, Any] | None:
    """The recorded stack document, None when there is none; StackError for another version."""
    path = state_dir / STATE_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if data.get("version") != STATE_VERSION:
        raise StackError(f"{path} has version {data.get('version')}, expected {STATE_VERSION}")
    return data


def stack_is_running(state: dict[str, Any] | None) -> bool:
    """Whether any process recorded in a stack.json document still runs."""
    comps = (state or {}).get("components", [])
    return any(procutil.pid_alive(c.get("pid"), c.get("start_time")) for c in comps)


DEFAULT_STATE_DIR = ".ragmesh"


def state_dir_of(args: argparse.Namespace) -> Path:
    """The stack state directory a command works on: --state-dir, $RAGMESH_STATE_DIR, or ./.ragmesh."""
    given = getattr(args, "state_dir", None) or os.environ.get("RAGMESH_STATE_DIR") or DEFAULT_STATE_DIR
    return Path(given).absolute()
