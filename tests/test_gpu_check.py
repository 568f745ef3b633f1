"""``make gpu-check``'s CPU-side logic (no GPU needed): arguments, the CUDA-fallback check on a
real CPU onnxruntime session, the side-by-side figures, the verdict and exit code, skip reasons,
and the venv, pip and vLLM commands it builds."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest

from bench import gpu_check, gpu_envs, gpu_host, gpu_narrator, gpu_onnx_stage, gpu_serving, gpu_stages
from bench.gpu_envs import EnvPlan
from bench.gpu_onnx import (
    count_nodes,
    node_placement,
    provider_check,
    sample_feeds,
    text_workload,
)
from bench.gpu_stages import (
    EXIT_FAILED,
    EXIT_PASSED,
    EXIT_SKIPPED,
    FAILED,
    PASSED,
    SKIPPED,
    Budget,
    Stage,
    StageFailed,
    StageSkipped,
)
from meshkit.inference.onnxrt import CPU_PROVIDER, CUDA_PROVIDER
from meshkit.settings import RerankerSettings

ROOT = Path(__file__).resolve().parents[1]
RERANKER_ONNX = RerankerSettings().reranker_model_dir / "model.onnx"


def stage(name: str, status: str, reason: str = "") -> Stage:
    return Stage(name, status, reason)


ALL_STAGES = ("gpu", "onnx_env", "vllm_env", "onnx", "llm_model", "vllm", "narrator")


# ---------------------------------------------------------------------------- arguments


def test_defaults_fit_the_eight_minute_budget() -> None:
    args = gpu_check.parse_args([])
    assert args.budget_s == 480
    assert not args.cpu_only and args.wheels is None and args.llm_load == "hf"
    assert args.out == gpu_check.RESULTS


def test_wheels_must_be_an_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--wheels", str(tmp_path / "missing")])
    assert gpu_check.parse_args(["--wheels", str(tmp_path)]).wheels == tmp_path


def test_installing_from_and_filling_a_wheel_directory_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--wheels", str(tmp_path), "--download-wheels", str(tmp_path)])


@pytest.mark.parametrize(
    "bad", [["--gpu-memory-utilization", "0"], ["--requests", "0"], ["--budget-s", "-1"]]
)
def test_out_of_range_numbers_are_refused(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        gpu_check.parse_args(bad)


# ---------------------------------------------------------------------------- the CUDA check


def cpu_session() -> ort.InferenceSession:
    return ort.InferenceSession(str(RERANKER_ONNX), providers=[CPU_PROVIDER])


def test_a_cpu_only_session_is_detected_as_cuda_not_used() -> None:
    session = cpu_session()
    check = provider_check(session)
    assert not check.cuda
    assert check.reason.startswith("CUDA not used")
    assert check.providers == [CPU_PROVIDER]


def test_the_profiled_placement_of_a_cpu_session_counts_only_cpu_nodes() -> None:
    session = cpu_session()
    nodes = node_placement(RERANKER_ONNX, [CPU_PROVIDER], sample_feeds(session))
    assert set(nodes) == {CPU_PROVIDER} and nodes[CPU_PROVIDER] > 10
    check = provider_check(session, nodes)
    assert not check.cuda and check.cuda_node_share == 0.0


class CudaFirstSession:
    """A session that lists CUDA first: what onnxruntime-gpu reports even when its nodes ran on
    the CPU (the int8 operators the CUDA provider leaves behind)."""

    def get_providers(self) -> list[str]:
        return [CUDA_PROVIDER, CPU_PROVIDER]


def test_cuda_listed_but_no_node_on_it_is_cuda_not_used() -> None:
    check = provider_check(CudaFirstSession(), {CPU_PROVIDER: 40})  # type: ignore[arg-type]
    assert not check.cuda and "every profiled node ran on" in check.reason


def test_cuda_with_nodes_on_it_passes_and_reports_its_share() -> None:
    check = provider_check(CudaFirstSession(), {CUDA_PROVIDER: 30, CPU_PROVIDER: 10})  # type: ignore[arg-type]
    assert check.cuda and check.reason == ""
    assert check.cuda_node_share == 0.75


def test_profile_events_are_counted_per_distinct_node() -> None:
    events = [
        {"cat": "Session", "name": "model_run"},
        {"cat": "Node", "name": "a_kernel_time", "args": {"node_index": "1", "provider": CUDA_PROVIDER}},
        {"cat": "Node", "name": "a_kernel_time", "args": {"node_index": "1", "provider": CUDA_PROVIDER}},
        {"cat": "Node", "name": "b_kernel_time", "args": {"node_index": "2", "provider": CPU_PROVIDER}},
        {"cat": "Node", "name": "c_fence", "args": {}},
    ]
    assert count_nodes(events) == {CUDA_PROVIDER: 1, CPU_PROVIDER: 1}


def test_the_workload_comes_from_the_repository_docs() -> None:
    work = text_workload([*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"])
    assert len(work.passages) >= 35
    candidates = work.candidates(3, 35)
    assert len(candidates) == 35 and len(set(candidates)) == 35
    assert all(len(p.split()) == 220 for p in candidates)


# ---------------------------------------------------------------------------- figures and verdict


def provider_figures(p50: float, pairs: float, query_ms: float, texts: float) -> dict[str, Any]:
    return {
        "reranker": {"p50_ms_35": p50, "pairs_per_s": pairs},
        "embedder": {"query_p50_ms": query_ms, "texts_per_s": texts},
    }


def test_side_by_side_ratios_say_how_much_cuda_wins() -> None:
    out = gpu_onnx_stage.onnx_side_by_side(
        {
            "cuda": provider_figures(20.0, 1750.0, 2.0, 3000.0),
            "cpu": provider_figures(500.0, 70.0, 8.0, 300.0),
        }
    )
    assert out["reranker"]["p50_speedup"] == 25.0
    assert out["reranker"]["pairs_per_s_ratio"] == 25.0
    assert out["embedder"]["query_p50_speedup"] == 4.0
    assert out["embedder"]["texts_per_s_ratio"] == 10.0
    assert out["reranker"]["cuda"]["p50_ms_35"] == 20.0 and out["reranker"]["cpu"]["p50_ms_35"] == 500.0
    assert "errors" not in out


def test_a_provider_error_is_carried_and_no_ratio_is_made_up() -> None:
    out = gpu_onnx_stage.onnx_side_by_side(
        {"cuda": {"error": "reranker: CUDA not used"}, "cpu": provider_figures(500.0, 70.0, 8.0, 300.0)}
    )
    assert out["errors"] == {"cuda": "reranker: CUDA not used"}
    assert "p50_speedup" not in out["reranker"]


def summary_of(stages: list[Stage], cpu_only: bool = False) -> dict[str, Any]:
    return gpu_stages.summarise(stages, cpu_only=cpu_only, started=time.monotonic(), budget_s=480)


def test_every_stage_passed_is_a_pass() -> None:
    summary = summary_of([stage(n, PASSED) for n in ALL_STAGES])
    assert summary["passed"] and summary["ran_on_gpu"]
    assert gpu_stages.exit_code(summary) == EXIT_PASSED


def test_no_gpu_is_not_a_pass_and_says_why() -> None:
    stages = [stage("gpu", SKIPPED, "no NVIDIA GPU: nvidia-smi is not on PATH")]
    stages += [stage(n, SKIPPED, "no GPU") for n in ALL_STAGES[1:3]]
    stages += [stage("onnx", PASSED)] + [stage(n, SKIPPED, "no GPU") for n in ALL_STAGES[4:]]
    summary = summary_of(stages)
    assert summary["status"] == SKIPPED and not summary["passed"] and not summary["ran_on_gpu"]
    assert summary["skipped"]["gpu"] == "no NVIDIA GPU: nvidia-smi is not on PATH"
    assert gpu_stages.exit_code(summary) == EXIT_SKIPPED


def test_cpu_only_passes_with_the_gpu_stages_skipped() -> None:
    stages = [stage(n, SKIPPED, "--cpu-only") for n in ALL_STAGES[:3]]
    stages += [stage("onnx", PASSED), stage("llm_model", SKIPPED, "--cpu-only")]
    stages += [stage("vllm", SKIPPED, "--cpu-only"), stage("narrator", PASSED)]
    summary = summary_of(stages, cpu_only=True)
    assert summary["passed"] and not summary["ran_on_gpu"]
    assert gpu_stages.exit_code(summary) == EXIT_PASSED


def test_one_failed_stage_fails_the_check() -> None:
    stages = [stage(n, PASSED) for n in ALL_STAGES]
    stages[3] = stage("onnx", FAILED, "cuda: reranker: CUDA not used")
    summary = summary_of(stages)
    assert summary["failed"] == ["onnx"] and summary["stages"]["onnx"]["reason"].startswith("cuda")
    assert gpu_stages.exit_code(summary) == EXIT_FAILED


def test_a_gpu_stage_skipped_on_a_gpu_machine_is_not_a_pass() -> None:
    stages = [stage(n, PASSED) for n in ALL_STAGES]
    stages[2] = stage("vllm_env", SKIPPED, "vllm could not be installed")
    assert gpu_stages.exit_code(summary_of(stages)) == EXIT_SKIPPED


def test_the_summary_is_one_json_line() -> None:
    summary = summary_of([stage(n, PASSED) for n in ALL_STAGES])
    line = json.dumps(summary, separators=(",", ":"))
    assert "\n" not in line and json.loads(line) == summary


# ---------------------------------------------------------------------------- stages and budget


def test_stage_outcomes_map_to_status_and_reason() -> None:
    budget = Budget(60)

    def skip(_: float) -> dict[str, Any]:
        raise StageSkipped("no vllm")

    def fail(_: float) -> dict[str, Any]:
        raise StageFailed("CUDA fell back")

    def crash(_: float) -> dict[str, Any]:
        raise KeyError("x")

    assert gpu_stages.run_stage("a", budget, 10, lambda t: {"timeout": t}).data["timeout"] == 10
    assert (gpu_stages.run_stage("b", budget, 10, skip).status, "no vllm") == (SKIPPED, "no vllm")
    assert gpu_stages.run_stage("c", budget, 10, fail).status == FAILED
    crashed = gpu_stages.run_stage("d", budget, 10, crash)
    assert crashed.status == FAILED and crashed.reason.startswith("KeyError")


def test_a_stage_gets_no_more_than_what_is_left_of_the_budget() -> None:
    now = [100.0]
    budget = Budget(30, clock=lambda: now[0])
    assert budget.timeout(20) == 20
    now[0] = 120.0
    assert budget.timeout(20) == 10
    now[0] = 128.0
    spent = gpu_stages.run_stage("late", budget, 20, lambda t: {})
    assert spent.status == SKIPPED and "budget is spent" in spent.reason


def test_no_nvidia_smi_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StageSkipped, match="nvidia-smi is not on PATH"):
        gpu_host.probe_gpu(5)


def fake_nvidia_smi(directory: Path, body: str) -> None:
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_the_gpu_probe_reads_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_nvidia_smi(
        tmp_path,
        'if [ -n "$1" ]; then echo "NVIDIA H200, 580.65.06, 143771 MiB"; '
        'else echo "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |"; fi',
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    found = gpu_host.probe_gpu(5)
    assert found["gpus"] == [{"name": "NVIDIA H200", "driver": "580.65.06", "memory": "143771 MiB"}]
    assert found["driver_cuda"] == "13.0"


def test_a_failing_nvidia_smi_is_no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_nvidia_smi(tmp_path, 'echo "NVIDIA-SMI has failed: no devices" >&2; exit 9')
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StageSkipped, match="exited 9"):
        gpu_host.probe_gpu(5)


def test_the_narrator_stage_fails_when_the_llm_server_failed() -> None:
    from ragmesh.narrator.v1 import narrator_pb2

    down = narrator_pb2.Answer(
        mode=narrator_pb2.NARRATION_MODE_EXTRACTIVE, degraded_reason="unavailable: connection refused"
    )
    with pytest.raises(StageFailed, match="could not use the LLM"):
        gpu_narrator.narration_result(0.01, 0.02, 1, down)
    # The small model's unverifiable wording is not a serving failure.
    worded = narrator_pb2.Answer(
        mode=narrator_pb2.NARRATION_MODE_EXTRACTIVE, degraded_reason="invalid_output: no verifiable sentence"
    )
    data = gpu_narrator.narration_result(0.05, 0.8, 12, worded)
    assert data["ttft_ms"] == 50.0 and data["total_ms"] == 800.0 and data["mode"] == "extractive"


# ---------------------------------------------------------------------------- commands


def test_pip_installs_from_the_index_or_only_from_the_wheel_directory(tmp_path: Path) -> None:
    python = Path("/v/bin/python")
    online = gpu_envs.pip_install_command(python, Path("requirements-gpu-onnx.txt"), None)
    assert online[:4] == ["/v/bin/python", "-m", "pip", "install"]
    assert online[-2:] == ["-r", "requirements-gpu-onnx.txt"] and "--no-index" not in online
    offline = gpu_envs.pip_install_command(python, Path("r.txt"), tmp_path)
    assert offline[-3:] == ["--no-index", "--find-links", str(tmp_path)]
    pinned = gpu_envs.pip_install_command(python, Path("r.txt"), None, Path("requirements.lock"))
    assert pinned[-2:] == ["-c", "requirements.lock"]


def test_the_onnx_venv_is_pinned_to_the_lock_and_the_vllm_venv_is_not() -> None:
    onnx, vllm = gpu_envs.env_plans(gpu_check.parse_args(["--no-install"]))
    assert onnx.constraints == gpu_envs.LOCK and onnx.link_project
    assert vllm.constraints is None and not vllm.link_project
    assert not onnx.install and not vllm.install


def test_pip_download_targets_another_python_only_when_asked(tmp_path: Path) -> None:
    here = gpu_envs.pip_download_command("py", Path("r.txt"), tmp_path)
    assert here == [
        "py",
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "-r",
        "r.txt",
        "-d",
        str(tmp_path),
    ]
    there = gpu_envs.pip_download_command("py", Path("r.txt"), tmp_path, "3.11", "manylinux_2_28_x86_64")
    assert there[-5:] == [
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--platform",
        "manylinux_2_28_x86_64",
    ]


def test_the_venv_sees_system_packages_only_when_asked() -> None:
    assert gpu_envs.venv_command("py", Path("v"), False) == ["py", "-m", "venv", "v"]
    assert gpu_envs.venv_command("py", Path("v"), True) == [
        "py",
        "-m",
        "venv",
        "--system-site-packages",
        "v",
    ]


def test_vllm_serves_on_loopback_eagerly_under_the_narrators_model_name() -> None:
    command = gpu_serving.vllm_command(
        Path("/v/bin/vllm"), "/m", port=8123, served_name="smollm2-135m-instruct"
    )
    assert command[:3] == ["/v/bin/vllm", "serve", "/m"]
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["--served-model-name"] == "smollm2-135m-instruct"
    assert "--enforce-eager" in command and "--tokenizer" not in command
    with_tokenizer = gpu_serving.vllm_command(
        Path("vllm"), "m.gguf", port=1, served_name="s", tokenizer="/tok", extra=["--seed", "3"]
    )
    assert with_tokenizer[-4:] == ["--tokenizer", "/tok", "--seed", "3"]


def test_the_llm_stages_run_offline() -> None:
    env = gpu_serving.offline_env()
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_NO_USAGE_STATS"] == "1"


def test_the_onnx_venv_imports_the_gpu_build_before_the_projects(tmp_path: Path) -> None:
    """A real venv with the project link: the project's packages import, and a package in the
    venv's own site-packages shadows the project's copy (as onnxruntime-gpu shadows onnxruntime)."""
    venv = tmp_path / "onnx"
    plan = EnvPlan("onnx_env", venv, ROOT / "requirements-gpu-onnx.txt", None, False, False, True)
    subprocess.run([*gpu_envs.venv_command(gpu_envs.base_python(), venv, False), "--without-pip"], check=True)
    data = gpu_envs.prepare_env(plan, 60, tmp_path / "log")
    assert data["packages"] == "not installed (--no-install)"
    own = gpu_envs.site_packages(gpu_envs.venv_python(venv), 30)
    (own / "onnxruntime").mkdir()
    (own / "onnxruntime" / "__init__.py").write_text("SHADOW = True\n")
    probe = (
        "import onnxruntime, meshkit.inference.onnxrt, tokenizers; "
        "print(getattr(onnxruntime, 'SHADOW', False))"
    )
    out = subprocess.run(
        [str(gpu_envs.venv_python(venv)), "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "True"


def test_a_failing_command_fails_its_stage_with_the_end_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    with pytest.raises(StageFailed, match=r"exited 3.*boom"):
        gpu_host.run_command([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], 30, log)
    with pytest.raises(StageFailed, match="timed out after 1s"):
        gpu_host.run_command([sys.executable, "-c", "import time; time.sleep(30)"], 1, log)


def http_files(root: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_a_server_is_ready_when_health_answers_and_it_lists_the_model(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "health").write_text("ok")
    (tmp_path / "v1" / "models").write_text('{"data": [{"id": "smollm2-135m-instruct"}]}')
    port = gpu_host.free_port()
    server = http_files(tmp_path, port)
    try:
        ready = gpu_serving.wait_ready(
            server, f"http://127.0.0.1:{port}", "smollm2-135m-instruct", 20, tmp_path / "l"
        )
        assert ready < 20
        # llama.cpp lists its file path, not the name: /health alone is enough when no name is asked.
        assert gpu_serving.wait_ready(server, f"http://127.0.0.1:{port}", "", 20, tmp_path / "l") < 20
        with pytest.raises(StageFailed, match="not ready after 2s"):
            gpu_serving.wait_ready(server, f"http://127.0.0.1:{port}", "another-model", 2, tmp_path / "l")
    finally:
        gpu_host.stop_process(server)


def test_a_server_that_exits_while_starting_fails_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("RuntimeError: no CUDA device\n")
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"], start_new_session=True)
    dead.wait()
    with pytest.raises(StageFailed, match=r"exited 1 while starting.*no CUDA device"):
        gpu_serving.wait_ready(dead, "http://127.0.0.1:9", "m", 10, log)
