"""The load test's human report."""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------- output


def format_report(service: str, report: dict[str, Any]) -> str:
    lat = report["latency_ms"]
    if report["mode"] == "open":
        shape = f"open loop at {report['target_rate']:g} req/s (max {report['max_outstanding']} outstanding)"
    else:
        shape = f"closed loop, concurrency {report['concurrency']}"
    errors = ", ".join(f"{code} {n}" for code, n in report["errors"].items()) or "none"
    rows = [
        ("target", f"{service}  {report['method']} at {report['address']}"),
        ("mode", f"{shape}, {report['channels']} channel(s)"),
        ("window", f"{report['duration_s']:g}s measured after {report['warmup_s']:g}s warmup"),
        ("requests", f"{report['requests']} (ok {report['ok']}, errors {report['requests'] - report['ok']})"),
        ("throughput", f"{report['throughput_rps']:.1f} ok/s"),
        ("sent", _sent_line(report)),
        (
            "latency ms",
            "  ".join(f"{k} {_num(lat[k])}" for k in ("p50", "p95", "p99", "max")),
        ),
        ("errors", errors),
        ("client CPU", f"{_num(report['client_cpu_percent'])}% of one core"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    cpu = report["client_cpu_percent"]
    if cpu is not None and cpu >= 90.0:
        lines.append("warning: the driver used a whole core; it may be the bottleneck (see make bench)")
    return "\n".join(lines)


def _sent_line(report: dict[str, Any]) -> str:
    achieved = f"{report['achieved_rate_rps']:.1f} req/s"
    if report["mode"] != "open":
        return achieved
    lag = report["start_lag_ms"]
    return (
        f"{achieved} of {report['target_rate']:g} targeted; late starts {report['late_starts']}, "
        f"unsent {report['unsent']}, start lag p99 {_num(lag['p99'])}ms max {_num(lag['max'])}ms"
    )


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
