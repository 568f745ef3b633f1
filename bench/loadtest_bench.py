"""The load driver's own ceiling: ``ragmesh loadtest``'s engine against a no-op gRPC server, so
the figures it reports for real services can be trusted (a service measured near this ceiling is
measured by the driver, not the service).

    make bench    # or: .venv/bin/python -m bench.loadtest_bench [--seconds 3] [--json]

The no-op server (bench/noop_service.py) runs in a subprocess, so client and server do not share
a GIL, and answers grpc.health.v1 Check at once. The driver runs closed loops at concurrency 1, 8
and 32 over one channel, 32 over 4 channels (one HTTP/2 connection can cap throughput), and an
open loop (one channel) at half the best one-channel throughput: does the scheduler hold a rate
it can reach, with low start lag?
Each run is measured for ``--seconds`` after a 1 s warmup; client and server CPU% show which side
saturated (100 = one core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.process_cpu import process_cpu_s
from ragmesh_cli.loadtest import TARGETS, DriveOptions, drive

RESULTS = Path("bench/results/loadtest.json")
WARMUP_S = 1.0
HEALTH = TARGETS["health"]
CHECK = b""  # HealthCheckRequest(service="") serialises to nothing
# (label, concurrency, channels)
CLOSED_RUNS = (("c=1", 1, 1), ("c=8", 8, 1), ("c=32", 32, 1), ("c=32, 4 channels", 32, 4))


def start_noop() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.noop_service", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"no-op service did not start (said {line!r})")
    return proc, f"127.0.0.1:{line.split()[1]}"


async def one_run(address: str, server_pid: int, opts: DriveOptions) -> dict[str, Any]:
    cpu0, wall0 = process_cpu_s(server_pid), time.perf_counter()
    report = await drive(address, HEALTH.method, [CHECK], opts)
    cpu1, wall = process_cpu_s(server_pid), time.perf_counter() - wall0
    server_cpu = None if cpu0 is None or cpu1 is None else round((cpu1 - cpu0) / wall * 100.0, 1)
    lat = report["latency_ms"]
    return {
        "ok_per_s": report["throughput_rps"],
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
        "errors": report["errors"],
        "client_cpu_percent": report["client_cpu_percent"],
        "server_cpu_percent": server_cpu,
        **({"achieved_rate_rps": report["achieved_rate_rps"]} if opts.rate else {}),
        **({"late_starts": report["late_starts"], "unsent": report["unsent"]} if opts.rate else {}),
    }


async def measure(address: str, server_pid: int, seconds: float) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for label, concurrency, channels in CLOSED_RUNS:
        opts = DriveOptions(
            concurrency=concurrency, duration_s=seconds, warmup_s=WARMUP_S, timeout_s=5.0, channels=channels
        )
        results[label] = await one_run(address, server_pid, opts)
        print(f"{label}: {results[label]['ok_per_s']:.0f} ok/s", file=sys.stderr, flush=True)
    # Half of what one channel sustained: a rate the driver should hold with room to spare.
    rate = round(max(r["ok_per_s"] for label, r in results.items() if "channels" not in label) / 2)
    opts = DriveOptions(rate=rate, duration_s=seconds, warmup_s=WARMUP_S, timeout_s=5.0)
    results[f"rate {rate}/s"] = await one_run(address, server_pid, opts)
    return results


def with_ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    best = max(r["ok_per_s"] for r in results.values()) or 1.0
    return {label: {**r, "vs_best": round(r["ok_per_s"] / best, 3)} for label, r in results.items()}


def print_table(results: dict[str, dict[str, Any]], seconds: float) -> None:
    print()
    print(
        "| driver run (no-op server) | ok/s | p50 ms | p99 ms | client CPU % | server CPU % | ok/s vs best |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, r in results.items():
        cpu = f"{_fmt(r['client_cpu_percent'], 0)} | {_fmt(r['server_cpu_percent'], 0)}"
        print(
            f"| {label} | {r['ok_per_s']:.0f} | {_fmt(r['p50_ms'], 2)} | {_fmt(r['p99_ms'], 2)} "
            f"| {cpu} | {r['vs_best']:.2f}x |"
        )
    for label, r in results.items():
        if "achieved_rate_rps" in r:
            print(
                f"\n{label}: achieved {r['achieved_rate_rps']:.0f} req/s, late starts {r['late_starts']}, "
                f"unsent {r['unsent']}"
            )
    errors = {label: r["errors"] for label, r in results.items() if r["errors"]}
    print(f"{seconds:g}s measured per run after {WARMUP_S:g}s warmup; errors: {errors or 'none'}")


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    proc, address = start_noop()
    try:
        results = with_ratios(asyncio.run(measure(address, proc.pid, args.seconds)))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    result = {"cpu_count": os.cpu_count(), "seconds": args.seconds, "warmup_s": WARMUP_S, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print_table(results, args.seconds)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
