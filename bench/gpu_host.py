"""The machine under ``make gpu-check`` (bench.gpu_check): its work directory, child processes
with their logs (run to completion, or stopped with their process group), free loopback ports,
plain HTTP probes, and stage 1, the ``nvidia-smi`` probe for a GPU."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from bench.gpu_stages import StageFailed, StageSkipped

WORK_DIR = Path(".cache/gpu-check")
LOG_TAIL_CHARS = 1500


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:].strip()


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """SIGTERM to the process group (vLLM forks engine workers), then SIGKILL after ``grace_s``."""
    if process.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


def run_command(command: Sequence[str], timeout: float, log: Path, env: dict[str, str] | None = None) -> None:
    """Run to completion with output in ``log``; StageFailed on a timeout or a non-zero exit,
    with the end of the log as the reason."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"$ {' '.join(command)}\n".encode())
        out.flush()
        process = subprocess.Popen(
            list(command), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_process(process, grace_s=5)
            raise StageFailed(
                f"{Path(command[0]).name} timed out after {timeout:.0f}s (log: {log})"
            ) from None
    if code != 0:
        raise StageFailed(f"{Path(command[0]).name} exited {code} (log: {log}): {log_tail(log, 600)}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


_CUDA_VERSION = re.compile(r"CUDA Version:\s*([0-9.]+)")


def parse_gpus(csv: str) -> list[dict[str, str]]:
    """``nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`` rows."""
    gpus = []
    for line in csv.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
    return gpus


def probe_gpu(timeout: float) -> dict[str, Any]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise StageSkipped("no NVIDIA GPU: nvidia-smi is not on PATH")
    query = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        listed = subprocess.run(query, capture_output=True, text=True, timeout=timeout, check=False)
        banner = subprocess.run([smi], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StageSkipped(f"no usable NVIDIA GPU: nvidia-smi hung for {timeout:.0f}s") from exc
    gpus = parse_gpus(listed.stdout) if listed.returncode == 0 else []
    if not gpus:
        raise StageSkipped(
            f"no NVIDIA GPU: nvidia-smi exited {listed.returncode}: {listed.stderr.strip()[:300]}"
        )
    found = _CUDA_VERSION.search(banner.stdout)
    return {"gpus": gpus, "driver_cuda": found.group(1) if found else ""}


def http_ok(url: str, timeout: float = 2.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bytes(response.read()) if response.status == 200 else None
    except (urllib.error.URLError, OSError, TimeoutError):
        return None
