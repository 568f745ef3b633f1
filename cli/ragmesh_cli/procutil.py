"""Low-level process and port helpers for the local stack supervisor (Linux: reads /proc)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from meshkit.core.fsutil import replace_private

LOOPBACK = "127.0.0.1"
# What the stack writes under its state dir is its owner's alone: the documents' text, the
# index's payloads and the object store's volumes are every tenant's data.
PRIVATE_UMASK = 0o077
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
# Ports picked by hand (pairs) stay below the kernel's ephemeral range (32768+ by default), so an
# outgoing connection cannot grab one between our check and the server's bind.
_PAIR_LOW, _PAIR_HIGH, _PAIR_OFFSET = 10_000, 22_000, 10_000


def find_binary(name: str) -> str:
    """``name`` next to the running interpreter (the venv's bin/), else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    from shutil import which

    found = which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found next to {sys.executable} nor on PATH (is the venv set up?)"
        )
    return found


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports, all held open together while choosing so none repeats."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port_pair(taken: set[int]) -> tuple[int, int]:
    """A free port P with P+10000 free too. SeaweedFS derives some gRPC ports as http port + 10000
    even when told otherwise, so both must be usable."""
    for _ in range(2000):
        port = random.randint(_PAIR_LOW, _PAIR_HIGH)
        pair = port + _PAIR_OFFSET
        if port in taken or pair in taken:
            continue
        if _port_is_free(port) and _port_is_free(pair):
            taken.update((port, pair))
            return port, pair
    raise RuntimeError("no free port pair found")


def free_port_run(count: int, taken: set[int]) -> int:
    """The first of ``count`` consecutive free ports (pre-fork workers serve /metrics on
    port + worker index)."""
    for _ in range(2000):
        first = random.randint(_PAIR_LOW, _PAIR_HIGH - count)
        run = range(first, first + count)
        if any(port in taken for port in run):
            continue
        if all(_port_is_free(port) for port in run):
            taken.update(run)
            return first
    raise RuntimeError(f"no run of {count} free ports found")


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if there is no such
    process. Recorded with the pid so a recycled pid is never mistaken for our process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[19])


def _process_state(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2 :].split()[0]


def _reap(pid: int) -> None:
    """Collect a dead child of ours so it stops showing up as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int | None, start_time: int | None) -> bool:
    """True when ``pid`` runs and is the same process we started (same start time)."""
    if not pid:
        return False
    state = _process_state(pid)
    if state is None:
        return False
    if state in ("Z", "X"):
        _reap(pid)
        return False
    return start_time is None or process_start_time(pid) == start_time


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid`` (every process was started in its own session),
    falling back to the pid alone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def terminate(targets: Iterable[tuple[int, int | None]], grace_s: float) -> list[int]:
    """SIGTERM each (pid, start_time), wait up to ``grace_s`` for all, SIGKILL the rest.
    Returns the pids that had to be killed."""
    alive = [(pid, st) for pid, st in targets if pid_alive(pid, st)]
    for pid, _ in alive:
        signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [(pid, st) for pid, st in alive if pid_alive(pid, st)]
    for pid, _ in alive:
        signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    remaining = list(alive)
    while remaining and time.monotonic() < deadline:
        time.sleep(0.05)
        remaining = [(pid, st) for pid, st in remaining if pid_alive(pid, st)]
    return [pid for pid, _ in alive]


def spawn(
    argv: list[str], env: Mapping[str, str], log_path: Path, cwd: Path, header: str
) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached (own session, survives the CLI), stdout+stderr appended to
    ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        log.write(f"\n=== {stamp} {header}: {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            umask=PRIVATE_UMASK,
        )


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Whatever this process creates meanwhile is its owner's alone (the umask is per process:
    the stack's own writes, not a library caller's, run under this)."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def make_private(root: Path) -> int:
    """Take every group and other permission off ``root`` and everything under it (folders
    0700, files 0600), for state written before the stack kept it private. Symbolic links are
    neither followed nor changed. Returns how many entries were changed."""
    changed = 0
    # A folder is visited as its own walk step; links to folders are listed in dirs, never files.
    for folder, _dirs, files in os.walk(root):
        for path in (folder, *(os.path.join(folder, name) for name in files)):
            with contextlib.suppress(FileNotFoundError):
                changed += _strip_group_other(path)
    return changed


def _strip_group_other(path: str) -> int:
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode) or not stat.S_IMODE(mode) & 0o077:
        return 0
    os.chmod(path, stat.S_IMODE(mode) & ~0o077)
    return 1


def write_text_atomic(path: Path, text: str, mode: int = PRIVATE_FILE_MODE) -> None:
    """Write ``text`` so readers see the old file or the new one, never half of it; private
    (0600) unless told otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_private(path, text.encode("utf-8"), mode)


def write_json_atomic(path: Path, data: Any, mode: int = PRIVATE_FILE_MODE) -> None:
    """Write JSON so readers see the old file or the new one, never half of it."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode)
