"""Stage 3 of ``make gpu-check`` (bench.gpu_check), the checking side: runs bench/gpu_onnx.py in
the onnx venv and turns its figures into CUDA against the CPU, side by side."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.gpu_host import WORK_DIR, run_command
from bench.gpu_stages import StageFailed


def onnx_command(
    python: str, providers: Sequence[str], requests: int, max_seconds: float, out: Path
) -> list[str]:
    return [
        python,
        "-m",
        "bench.gpu_onnx",
        "--providers",
        ",".join(providers),
        "--requests",
        str(requests),
        "--max-seconds",
        str(max_seconds),
        "--out",
        str(out),
    ]


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 2)


def onnx_side_by_side(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each model's figures per provider and CUDA against the CPU: ``*_speedup`` is CPU latency
    over CUDA latency, ``*_ratio`` CUDA throughput over CPU throughput (above 1: CUDA wins)."""
    cuda, cpu = results.get("cuda", {}), results.get("cpu", {})
    rerank = {p: r["reranker"] for p, r in results.items() if "reranker" in r}
    embed = {p: r["embedder"] for p, r in results.items() if "embedder" in r}
    out: dict[str, Any] = {"reranker": dict(rerank), "embedder": dict(embed)}
    if "reranker" in cuda and "reranker" in cpu:
        out["reranker"]["p50_speedup"] = ratio(cpu["reranker"]["p50_ms_35"], cuda["reranker"]["p50_ms_35"])
        out["reranker"]["pairs_per_s_ratio"] = ratio(
            cuda["reranker"]["pairs_per_s"], cpu["reranker"]["pairs_per_s"]
        )
    if "embedder" in cuda and "embedder" in cpu:
        out["embedder"]["query_p50_speedup"] = ratio(
            cpu["embedder"]["query_p50_ms"], cuda["embedder"]["query_p50_ms"]
        )
        out["embedder"]["texts_per_s_ratio"] = ratio(
            cuda["embedder"]["texts_per_s"], cpu["embedder"]["texts_per_s"]
        )
    errors = {p: r["error"] for p, r in results.items() if "error" in r}
    if errors:
        out["errors"] = errors
    if "cuda" in results:
        out["cuda_sessions"] = cuda.get("session_providers", {})
    return out


def run_onnx(
    python: str, providers: Sequence[str], args: argparse.Namespace, timeout: float
) -> dict[str, Any]:
    out = WORK_DIR / "onnx.json"
    out.unlink(missing_ok=True)
    # The worker's own time cap per provider leaves room for loading and the other provider.
    per_provider = max(10.0, min(args.measure_s, (timeout - 30) / max(1, len(providers))))
    command = onnx_command(python, providers, args.requests, per_provider, out)
    run_command(command, timeout, WORK_DIR / "onnx.log")
    report = json.loads(out.read_text())
    data = {k: report[k] for k in ("onnxruntime", "cpu_count", "preload_dlls") if k in report}
    data |= onnx_side_by_side(report["results"])
    if "errors" in data:
        raise StageFailed(
            "; ".join(f"{p}: {e}" for p, e in data["errors"].items()) + f" | {json.dumps(data)}"
        )
    return data
