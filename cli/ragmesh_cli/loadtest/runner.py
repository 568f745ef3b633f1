"""The load driver: closed and open loops over pre-serialised requests, the recorder, and the run's
report (throughput, latency percentiles, errors by status, late starts)."""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grpc import aio

from meshkit.rpc.client import channel_options
from ragmesh_cli.channels import open_channel
from ragmesh_cli.stats import latency_summary_ms, percentile

# A start later than its schedule by more than the event loop's ordinary timer jitter (well under
# 1 ms on an idle loop) means the driver or the outstanding cap held it back.
LATE_START_S = 0.002
CONNECT_TIMEOUT_S = 10.0


def scheduled_count(rate: float, seconds: float) -> int:
    """Requests an open loop schedules in [0, seconds): i / rate < seconds."""
    return max(0, math.ceil(seconds * rate - 1e-9))


# ---------------------------------------------------------------------------- driving


@dataclass(frozen=True)
class DriveOptions:
    concurrency: int | None = None
    rate: float | None = None
    max_outstanding: int = 1000
    duration_s: float = 10.0
    warmup_s: float = 0.0
    timeout_s: float = 30.0
    channels: int = 1
    progress_s: float = 0.0

    def validate(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of --concurrency and --rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("--concurrency must be >= 1")
        if self.rate is not None and not self.rate > 0:
            raise ValueError("--rate must be > 0")
        checks = (
            (self.max_outstanding >= 1, "--max-outstanding must be >= 1"),
            (self.duration_s > 0, "--duration must be > 0"),
            (self.warmup_s >= 0, "--warmup must be >= 0"),
            (self.timeout_s > 0, "--timeout must be > 0"),
            (self.channels >= 1, "--channels must be >= 1"),
            (self.progress_s >= 0, "--progress must be >= 0"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class Recorder:
    """Outcomes of the calls started in the measured window, plus rolling figures for progress."""

    measure_start: float
    measure_end: float
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    started: int = 0
    start_lags: list[float] = field(default_factory=list)
    late_starts: int = 0
    in_flight: int = 0
    # Since the last progress line, whatever the window.
    interval_latencies: list[float] = field(default_factory=list)
    interval_errors: int = 0
    # Process CPU and wall clock when the measured window opened.
    cpu_mark: float = field(default_factory=_cpu_seconds)
    wall_mark: float = field(default_factory=time.perf_counter)

    def measured(self, scheduled: float) -> bool:
        return self.measure_start <= scheduled < self.measure_end

    def on_start(self, scheduled: float, sent: float) -> None:
        self.in_flight += 1
        if self.measured(scheduled):
            self.started += 1
            lag = sent - scheduled
            self.start_lags.append(lag)
            if lag > LATE_START_S:
                self.late_starts += 1

    def on_done(self, scheduled: float, done: float, code: str | None) -> None:
        self.in_flight -= 1
        if code is None:
            self.interval_latencies.append(done - scheduled)
        else:
            self.interval_errors += 1
        if not self.measured(scheduled):
            return
        if code is None:
            self.latencies.append(done - scheduled)
        else:
            self.errors[code] += 1


async def _call_once(
    call: aio.UnaryUnaryMultiCallable, request: bytes, scheduled: float, timeout_s: float, rec: Recorder
) -> None:
    sent = time.perf_counter()
    rec.on_start(scheduled, sent)
    code: str | None = None
    try:
        await call(request, timeout=timeout_s)
    except aio.AioRpcError as exc:
        code = exc.code().name
    except Exception as exc:  # a load driver reports odd client failures instead of dying on them
        code = f"CLIENT_{type(exc).__name__}"
    rec.on_done(scheduled, time.perf_counter(), code)


async def _closed_loop(
    calls: Sequence[aio.UnaryUnaryMultiCallable],
    requests: Sequence[bytes],
    opts: DriveOptions,
    rec: Recorder,
) -> None:
    workers = opts.concurrency or 1

    async def worker(w: int) -> None:
        call, i = calls[w % len(calls)], w
        while (now := time.perf_counter()) < rec.measure_end:
            await _call_once(call, requests[i % len(requests)], now, opts.timeout_s, rec)
            i += workers

    await asyncio.gather(*(worker(w) for w in range(workers)))


async def _open_loop(
    calls: Sequence[aio.UnaryUnaryMultiCallable],
    requests: Sequence[bytes],
    opts: DriveOptions,
    rec: Recorder,
    t0: float,
) -> int:
    """Send request i at t0 + i/rate; return how many measured requests were never sent."""
    rate = opts.rate or 1.0
    slots = asyncio.Semaphore(opts.max_outstanding)
    tasks: set[asyncio.Task[None]] = set()

    def finished(task: asyncio.Task[None]) -> None:
        slots.release()
        tasks.discard(task)

    i = 0
    while (scheduled := t0 + i / rate) < rec.measure_end:
        now = time.perf_counter()
        if now >= rec.measure_end:
            # A saturated driver leaves what is still overdue at the end unsent, rather than
            # bursting on past the window.
            break
        if scheduled > now:
            await asyncio.sleep(scheduled - now)
        if slots.locked():
            try:
                await asyncio.wait_for(slots.acquire(), max(0.0, rec.measure_end - time.perf_counter()))
            except TimeoutError:
                break
        else:
            await slots.acquire()
        task = asyncio.create_task(
            _call_once(calls[i % len(calls)], requests[i % len(requests)], scheduled, opts.timeout_s, rec)
        )
        tasks.add(task)
        task.add_done_callback(finished)
        i += 1
    if tasks:
        await asyncio.gather(*tasks)
    return max(
        0, scheduled_count(rate, rec.measure_end - t0) - scheduled_count(rate, opts.warmup_s) - rec.started
    )


async def _progress(rec: Recorder, t0: float, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        now = time.perf_counter()
        ordered = sorted(rec.interval_latencies)
        p50, p99 = percentile(ordered, 50.0), percentile(ordered, 99.0)
        phase = "warmup" if now < rec.measure_start else "measuring"
        print(
            f"[{now - t0:6.1f}s] {phase:9s} ok/s {len(ordered) / every_s:8.1f}  "
            f"p50 {_ms(p50)}  p99 {_ms(p99)}  errors {rec.interval_errors}  in flight {rec.in_flight}",
            file=sys.stderr,
            flush=True,
        )
        rec.interval_latencies, rec.interval_errors = [], 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000.0:.1f}ms"


def open_channels(address: str, count: int) -> list[aio.Channel]:
    # A local subchannel pool gives each channel its own HTTP/2 connection; with the global pool,
    # channels to one target with the same arguments would share one.
    options = [*channel_options(), ("grpc.use_local_subchannel_pool", 1)]
    return [open_channel(address, options) for _ in range(count)]


async def drive(
    address: str,
    method: str,
    requests: Sequence[bytes],
    opts: DriveOptions,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> dict[str, Any]:
    """Run one load test; the report as a JSON-ready dict (see ``format_report``)."""
    opts.validate()
    if not requests:
        raise ValueError("no requests to send")
    channels = open_channels(address, opts.channels)
    try:
        try:
            await asyncio.wait_for(
                asyncio.gather(*(ch.channel_ready() for ch in channels)), connect_timeout_s
            )
        except TimeoutError:
            raise RuntimeError(f"{address}: not reachable within {connect_timeout_s:g}s") from None
        # No serialisers: requests go out as prepared bytes and answers stay unparsed.
        calls = [
            ch.unary_unary(method, request_serializer=None, response_deserializer=None) for ch in channels
        ]
        t0 = time.perf_counter()
        rec = Recorder(measure_start=t0 + opts.warmup_s, measure_end=t0 + opts.warmup_s + opts.duration_s)
        helpers = [asyncio.create_task(_mark_window(rec))]
        if opts.progress_s:
            helpers.append(asyncio.create_task(_progress(rec, t0, opts.progress_s)))
        try:
            if opts.rate is not None:
                unsent: int | None = await _open_loop(calls, requests, opts, rec, t0)
            else:
                await _closed_loop(calls, requests, opts, rec)
                unsent = None
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
        report = _report(address, method, opts, rec, unsent)
    finally:
        await asyncio.gather(*(ch.close(None) for ch in channels))
    return report


async def _mark_window(rec: Recorder) -> None:
    await asyncio.sleep(max(0.0, rec.measure_start - time.perf_counter()))
    rec.cpu_mark, rec.wall_mark = _cpu_seconds(), time.perf_counter()


def _report(
    address: str, method: str, opts: DriveOptions, rec: Recorder, unsent: int | None
) -> dict[str, Any]:
    # CPU over wall from the window's start to the last answer: 100 is one core busy throughout.
    wall = time.perf_counter() - rec.wall_mark
    cpu_percent = (_cpu_seconds() - rec.cpu_mark) / wall * 100.0 if wall > 0 else None
    ok = len(rec.latencies)
    error_count = sum(rec.errors.values())
    requests = ok + error_count
    lags = sorted(rec.start_lags)
    report: dict[str, Any] = {
        "address": address,
        "method": method,
        "mode": "open" if opts.rate is not None else "closed",
        "concurrency": opts.concurrency,
        "target_rate": opts.rate,
        "max_outstanding": opts.max_outstanding if opts.rate is not None else None,
        "channels": opts.channels,
        "duration_s": opts.duration_s,
        "warmup_s": opts.warmup_s,
        "timeout_s": opts.timeout_s,
        "requests": requests,
        "ok": ok,
        "errors": dict(sorted(rec.errors.items())),
        "error_rate": round(error_count / requests, 6) if requests else 0.0,
        "throughput_rps": round(ok / opts.duration_s, 3),
        "achieved_rate_rps": round(rec.started / opts.duration_s, 3),
        "latency_ms": latency_summary_ms(rec.latencies),
        "client_cpu_percent": None if cpu_percent is None else round(cpu_percent, 1),
    }
    if opts.rate is not None:
        lag_p99, lag_max = percentile(lags, 99.0), lags[-1] if lags else None
        report["late_starts"] = rec.late_starts
        report["unsent"] = unsent
        report["start_lag_ms"] = {
            "p99": None if lag_p99 is None else round(lag_p99 * 1000.0, 3),
            "max": None if lag_max is None else round(lag_max * 1000.0, 3),
        }
    return report
