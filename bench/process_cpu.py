"""CPU each process of a running stack spends per gateway search, under a gateway load test.

    .venv/bin/python -m bench.process_cpu --state-dir STATE --collection scifact --concurrency 1 --json

Runs ``ragmesh loadtest gateway --no-rerank`` against the stack recorded in ``--state-dir``,
reads every component's CPU seconds (user + system, from ``/proc/PID/stat``, its child
processes included: a pre-forked gateway's workers) a second after the load starts and a
second before it ends, and divides by the searches served in between. Where the mesh's CPU goes
decides what to make cheaper (docs/BENCHMARKS.md, "Two waits that cost CPU or time for nothing"
and "FAISS's OpenMP threads"). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ragmesh_cli.stack import Stack

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# Processes whose CPU is not the read path's (the load test's own client is not a component).
SKIPPED_KINDS = ("nats", "s3")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` alone (fields 14 and 15 of /proc/PID/stat; the
    command name, field 2, may hold spaces, so fields are counted after its ')'); None when it
    is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its live children."""
    return sum(cpu or 0.0 for cpu in map(process_cpu_s, [pid, *_children(pid)]))


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def per_search_ms(before: dict[str, float], after: dict[str, float], searches: float) -> dict[str, float]:
    """CPU milliseconds per search of each process present in both snapshots."""
    return {
        name: round((after[name] - before[name]) * 1000 / searches, 2)
        for name in sorted(before.keys() & after.keys())
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--dataset", default="../shared/bench/scifact")
    parser.add_argument("--collection", default="scifact")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=int, default=20, help="Seconds of load (at least 4).")
    parser.add_argument("--json", action="store_true", help="Print one JSON object as the last line.")
    args = parser.parse_args()

    stack = Stack.load(args.state_dir)
    pids = {
        name: c.pid
        for name in stack.names()
        if (c := stack.component(name)).pid is not None and c.kind not in SKIPPED_KINDS
    }
    command = [str(Path(sys.executable).with_name("ragmesh")), "--state-dir", str(args.state_dir)]
    command += ["loadtest", "gateway", "--dataset", args.dataset, "--collection", args.collection]
    command += ["--split", "test", "--concurrency", str(args.concurrency), "--duration", str(args.duration)]
    load = subprocess.Popen(
        [*command, "--warmup", "0", "--no-rerank", "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1)
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(max(args.duration - 2, 1))
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    measured_s = time.monotonic() - started
    report = json.loads(load.communicate()[0])
    searches = report["throughput_rps"] * measured_s
    cpu = per_search_ms(before, after, searches)
    if not args.json:
        for name, ms in cpu.items():
            print(f"{name:12s} {ms:7.2f} ms CPU per search")
    summary = {
        "bench": "process_cpu",
        "concurrency": args.concurrency,
        "searches_per_s": report["throughput_rps"],
        **{f"{q}_ms": report["latency_ms"][q] for q in ("p50", "p95", "p99")},
        "cpu_ms_per_search": cpu,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
