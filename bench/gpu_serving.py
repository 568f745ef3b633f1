"""Stages 4 and 5 of ``make gpu-check`` (bench.gpu_check): the LLM to serve (a model directory,
a GGUF file, or a GGUF dequantised once into a Hugging Face directory), the ``vllm serve`` and
llama.cpp stand-in commands, offline environments, and starting a server until it is ready."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu_host import WORK_DIR, http_ok, log_tail, run_command, stop_process
from bench.gpu_stages import StageFailed, StageSkipped

SERVED_MODEL_NAME = "smollm2-135m-instruct"


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
