"""What the size bench reads about the stack's processes and files: every process of a component
(its session: the stack starts each component in its own), their resident memory (VmRSS) and
proportional share (Pss from smaps_rollup), CPU time and bytes written (/proc/<pid>/io), and the
bytes a directory holds on disk."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ragmesh_cli.stack import Stack

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def session_pids(leaders: Iterable[int]) -> dict[int, list[int]]:
    """Every live process of each session led by ``leaders`` (the stack spawns each component with
    start_new_session, so its pid is its session id, and its workers and children share it)."""
    wanted = set(leaders)
    found: dict[int, list[int]] = {leader: [] for leader in wanted}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (in parentheses) may hold spaces: the fields after it are fixed.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        session = int(fields[3])
        if session in wanted:
            found[session].append(int(stat.parent.name))
    return found


def component_pids(stack: Stack, kind: str) -> list[int]:
    """Every process of every component of ``kind`` (all replicas, shards and workers)."""
    leaders = [c.pid for c in stack.components.values() if c.kind == kind and c.pid]
    return [pid for pids in session_pids(leaders).values() for pid in pids]


def name_pids(stack: Stack, name: str) -> list[int]:
    pid = stack.component(name).pid
    return session_pids([pid]).get(pid, []) if pid else []


@dataclass(frozen=True)
class Usage:
    """Summed over a set of processes; a process that went away counts 0."""

    rss_bytes: int = 0
    pss_bytes: int = 0
    cpu_s: float = 0.0
    write_bytes: int = 0
    processes: int = 0
    # Peak resident memory of each process since it started (VmHWM), summed.
    peak_rss_bytes: int = 0

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.rss_bytes - other.rss_bytes,
            self.pss_bytes - other.pss_bytes,
            self.cpu_s - other.cpu_s,
            self.write_bytes - other.write_bytes,
            self.processes,
            self.peak_rss_bytes - other.peak_rss_bytes,
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.rss_bytes + other.rss_bytes,
            self.pss_bytes + other.pss_bytes,
            self.cpu_s + other.cpu_s,
            self.write_bytes + other.write_bytes,
            self.processes + other.processes,
            self.peak_rss_bytes + other.peak_rss_bytes,
        )


def _kib_field(text: str, name: str) -> int:
    for line in text.splitlines():
        if line.startswith(name):
            return int(line.split()[1]) * 1024
    return 0


def process_usage(pid: int, memory: bool = True) -> Usage | None:
    """One process's figures (None when it is gone). ``memory=False`` skips smaps_rollup (which
    walks every mapping: cheap, but not free on a process of several GiB)."""
    proc = Path(f"/proc/{pid}")
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime + stime
        io = (proc / "io").read_text()
        rss = pss = peak = 0
        if memory:
            status = (proc / "status").read_text()
            rss, peak = _kib_field(status, "VmRSS:"), _kib_field(status, "VmHWM:")
            pss = _kib_field((proc / "smaps_rollup").read_text(), "Pss:")
    except (OSError, IndexError, ValueError):
        return None
    write_bytes = 0
    for line in io.splitlines():
        if line.startswith("write_bytes:"):
            write_bytes = int(line.split()[1])
    return Usage(rss, pss, cpu, write_bytes, 1, peak)


def usage_of(pids: Iterable[int], memory: bool = True) -> Usage:
    total = Usage()
    for pid in pids:
        one = process_usage(pid, memory)
        if one is not None:
            total = total + one
    return total


def kinds_usage(stack: Stack, kinds: Iterable[str], memory: bool = True) -> dict[str, Usage]:
    return {kind: usage_of(component_pids(stack, kind), memory) for kind in kinds}


def self_usage() -> Usage:
    """This process (the bench: generator, request building, load driver), memory left out."""
    times = os.times()
    return Usage(cpu_s=times.user + times.system, processes=1)


@dataclass(frozen=True)
class DiskUsage:
    allocated_bytes: int = 0  # what du counts: blocks
    apparent_bytes: int = 0  # file sizes
    files: int = 0


def disk_usage(path: Path) -> DiskUsage:
    """Bytes under ``path`` (files only, hard links once), walked with scandir (a sparse store holds a
    file per chunk: a million of them at 1M chunks)."""
    allocated = apparent = files = 0
    seen: set[tuple[int, int]] = set()
    pending = [path]
    while pending:
        current = pending.pop()
        try:
            entries = list(os.scandir(current))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while walking (a snapshot pruned, a WAL segment dropped)
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1:
                if key in seen:
                    continue
                seen.add(key)
            allocated += st.st_blocks * 512
            apparent += st.st_size
            files += 1
    return DiskUsage(allocated, apparent, files)


def data_dirs(stack: Stack, kind: str) -> list[Path]:
    """The data directory of every component of ``kind`` (index shards, sparse replicas)."""
    variable = {"index": "RAGMESH_INDEX_DATA_DIR", "sparse": "RAGMESH_SPARSE_DATA_DIR"}[kind]
    return [Path(c.env[variable]) for c in stack.components.values() if c.kind == kind and variable in c.env]


def disk_of(paths: Iterable[Path]) -> DiskUsage:
    total = DiskUsage()
    for path in paths:
        one = disk_usage(path)
        total = DiskUsage(
            total.allocated_bytes + one.allocated_bytes,
            total.apparent_bytes + one.apparent_bytes,
            total.files + one.files,
        )
    return total


def machine_room(path: Path) -> tuple[int, int]:
    """(bytes free on the filesystem holding ``path``, MemAvailable bytes)."""
    st = os.statvfs(path)
    available = 0
    with contextlib.suppress(OSError):
        available = _kib_field(Path("/proc/meminfo").read_text(), "MemAvailable:")
    return st.f_bavail * st.f_frsize, available


def per_chunk(value: float, chunks: int) -> float | None:
    return round(value / chunks, 1) if chunks else None


def cores(cpu: Mapping[str, float], seconds: float) -> dict[str, float]:
    """CPU seconds per part over ``seconds`` of wall time, as cores busy."""
    return {k: round(v / seconds, 3) if seconds > 0 else 0.0 for k, v in cpu.items()}
