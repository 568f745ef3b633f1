"""The chaos run's fault injector (tests/integration/chaos.py): SIGKILLs a random process of the
mesh on a schedule, lets the stack restart it, and records what it struck."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ragmesh_cli.stack import Stack


@dataclass
class Fault:
    victim: str
    kind: str
    killed_at: float
    down_s: float
    restart_s: float = 0.0
    error: str = ""


class FaultInjector:
    """SIGKILL one random victim every ``interval_s`` (jittered), leave it down for a moment, then
    start it again (its recorded ports and data: a crash, not a new machine) and wait until it is
    healthy, as an orchestrator would."""

    def __init__(
        self,
        stack: Stack,
        victims: Sequence[str],
        rng: random.Random,
        interval_s: tuple[float, float] = (6.0, 12.0),
        down_s: tuple[float, float] = (0.5, 4.0),
    ) -> None:
        self.stack = stack
        self.victims = list(victims)
        self.rng = rng
        self.interval_s = interval_s
        self.down_s = down_s
        self.faults: list[Fault] = []
        self.started = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(*self.interval_s))
            if stop.is_set():
                break
            await self.strike(self._pick())

    def _pick(self) -> str:
        """A kind first, then one of its processes: each kind is hit as often, however many
        replicas it runs (four index replicas must not crowd out NATS)."""
        kinds = sorted({self.stack.component(v).kind for v in self.victims})
        kind = self.rng.choice(kinds)
        return self.rng.choice([v for v in self.victims if self.stack.component(v).kind == kind])

    async def strike(self, victim: str) -> None:
        fault = Fault(
            victim,
            self.stack.component(victim).kind,
            round(time.monotonic() - self.started, 2),
            round(self.rng.uniform(*self.down_s), 2),
        )
        self.faults.append(fault)
        if self.stack.component(victim).pid is not None:
            with contextlib.suppress(Exception):  # it may have died of an earlier failed restart
                await asyncio.to_thread(self.stack.kill, victim, signal.SIGKILL)
        await asyncio.sleep(fault.down_s)
        began = time.monotonic()
        try:
            await self.stack.start_async(victim)
        except Exception as exc:  # a restart that fails is a finding: report it, keep going
            fault.error = str(exc)[:500]
        fault.restart_s = round(time.monotonic() - began, 2)

    def summary(self) -> dict[str, Any]:
        return {
            "kills": len(self.faults),
            "by_kind": dict(Counter(f.kind for f in self.faults)),
            "failed_restarts": [asdict(f) for f in self.faults if f.error],
            "faults": [asdict(f) for f in self.faults],
        }
