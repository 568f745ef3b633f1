"""``make gpu-check``'s stages (bench.gpu_check): a stage's outcome (passed, failed, skipped with
the reason), the overall time budget each stage draws from, running one stage under it, and the
verdict over all of them with its exit code."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

EXIT_PASSED, EXIT_FAILED, EXIT_SKIPPED = 0, 1, 2
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
# A stage offered less than this is skipped: it could not finish anything useful.
MIN_STAGE_S = 5.0


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
