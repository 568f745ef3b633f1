"""Stage 2 of ``make gpu-check`` (bench.gpu_check): the two GPU venvs under ``.cache/gpu-venv/``
(onnxruntime-gpu linked to the project's packages; vLLM alone), the venv and pip commands that
build them, the checks that they hold what they must, and ``--download-wheels`` for offline
installs."""

from __future__ import annotations

import argparse
import hashlib
import json
import site
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu_host import run_command
from bench.gpu_stages import EXIT_FAILED, EXIT_PASSED, StageFailed, StageSkipped

VENV_ROOT = Path(".cache/gpu-venv")
ONNX_REQUIREMENTS = Path("requirements-gpu-onnx.txt")
VLLM_REQUIREMENTS = Path("requirements-gpu-vllm.txt")
LOCK = Path("requirements.lock")


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
