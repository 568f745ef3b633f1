"""Several worker processes behind one port (``RAGMESH_WORKERS=N``): a pre-fork supervisor.

Python runs one request handler at a time per process (the GIL), so a CPU-bound stage (tokenising,
fusion, protobuf work) uses one core however many calls it has in flight. With ``workers=N`` the
process started by the operator becomes a small supervisor: it runs its own command line again N
times, with ``RAGMESH_WORKER_INDEX=i``, and each worker serves the same fixed port with its own
grpc.aio server bound with SO_REUSEPORT, so the kernel spreads incoming connections over them.

- Only stateless services may do this (``ServiceSpec.multiprocess_safe``): the index, sparse and
  ingestion services own a data directory or consumer state per process.
- The port must be fixed: with port 0 each worker would get a different one.
- Worker i serves /metrics on ``metrics_port + i`` (when metrics_port is set); scrape each. Under
  RAGMESH_SERVICE_AUTH=mtls each is HTTPS requiring a metrics reader's mesh certificate, as a
  single process's is (meshkit.rpc.tls.metrics_tls).
- SIGTERM/SIGINT to the supervisor are passed on to every worker, which drain as a single process
  does; the supervisor waits for them (shutdown grace plus a margin, then SIGKILL).
- A worker that exits on its own takes the group down: the supervisor stops the others and exits
  1, so whatever supervises it (``ragmesh up``, Kubernetes) restarts the whole pod/process, rather
  than a half-capacity group living on unnoticed.
- A worker whose supervisor disappears (SIGKILL) notices it within a second and drains, so no
  orphan keeps the port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from meshkit.settings import MeshSettings

log = logging.getLogger("meshkit.rpc.prefork")

WORKER_INDEX_ENV = "RAGMESH_WORKER_INDEX"
POLL_S = 0.1
# Time a worker gets beyond the shutdown grace (hooks, interpreter exit) before SIGKILL.
KILL_MARGIN_S = 5.0
ORPHAN_CHECK_S = 1.0


def check_workers(name: str, multiprocess_safe: bool, settings: MeshSettings) -> None:
    """Refuse a worker count the service cannot run with (ValueError says why)."""
    if settings.workers <= 1:
        return
    if not multiprocess_safe:
        raise ValueError(
            f"{name} cannot run workers={settings.workers}: it keeps state per process (a data "
            "directory or a consumer), so two processes would corrupt or split it; run it with "
            "RAGMESH_WORKERS=1 (scale it with shards or separate replicas instead)"
        )
    if settings.port == 0:
        raise ValueError(
            f"{name}: workers={settings.workers} needs a fixed port (set RAGMESH_PORT): the workers "
            "share one port, and with port 0 each would pick its own"
        )


def metrics_port_of(settings: MeshSettings) -> int:
    """This process's /metrics port: metrics_port, plus the worker index in a worker."""
    if settings.metrics_port <= 0 or settings.worker_index is None:
        return settings.metrics_port
    return settings.metrics_port + settings.worker_index


def own_command() -> list[str]:
    """The command line that started this process (e.g. python -m services.reranker)."""
    return [sys.executable, *sys.orig_argv[1:]]


class WorkerGroup:
    """Start ``settings.workers`` copies of ``argv`` and supervise them until they all exit."""

    def __init__(self, settings: MeshSettings, argv: Sequence[str] | None = None) -> None:
        self.settings = settings
        self.argv = list(argv) if argv is not None else own_command()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        self.kill_at: float | None = None

    def _env(self, index: int) -> dict[str, str]:
        # The workers read their settings from the environment, as this process did; the group's
        # shape is passed explicitly in case it was given in code.
        return {
            **os.environ,
            "RAGMESH_WORKERS": str(self.settings.workers),
            "RAGMESH_PORT": str(self.settings.port),
            WORKER_INDEX_ENV: str(index),
        }

    def _signal_all(self, sig: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(sig)

    def _stop(self, sig: int = signal.SIGTERM) -> None:
        if not self.stopping:
            self.stopping = True
            self.kill_at = time.monotonic() + self.settings.shutdown_grace_s + KILL_MARGIN_S
        self._signal_all(sig)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("signal received, stopping workers", extra={"signal": signal.Signals(signum).name})
        self._stop(signum)

    def run(self) -> int:
        """Run the group; the exit code for the supervisor process (0: stopped by a signal)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for index in range(self.settings.workers):
            self.procs.append(subprocess.Popen(self.argv, env=self._env(index)))
        log.info(
            "workers started",
            extra={"port": self.settings.port, "pids": [p.pid for p in self.procs]},
        )
        if self.stopping:  # a signal arrived while they were being started
            self._signal_all(signal.SIGTERM)
        failed = False
        while any(proc.poll() is None for proc in self.procs):
            if not self.stopping:
                failed = self._check_unexpected_exits()
            if self.kill_at is not None and time.monotonic() > self.kill_at:
                log.error("workers did not stop in time, killing them")
                self._signal_all(signal.SIGKILL)
                self.kill_at = None
            time.sleep(POLL_S)
        if not self.stopping:
            failed = self._check_unexpected_exits()
        codes = [proc.returncode for proc in self.procs]
        log.info("workers stopped", extra={"exit_codes": codes})
        return 1 if failed or any(codes) else 0

    def _check_unexpected_exits(self) -> bool:
        dead = [(i, proc.returncode) for i, proc in enumerate(self.procs) if proc.returncode is not None]
        if not dead:
            return False
        log.error(
            "worker exited unexpectedly; stopping the group so it is restarted whole",
            extra={"workers": [{"index": i, "exit_code": code} for i, code in dead]},
        )
        self._stop()
        return True


async def exit_when_orphaned(stop: asyncio.Event, check_s: float = ORPHAN_CHECK_S) -> None:
    """In a worker: set ``stop`` once the supervisor is gone (the worker was re-parented)."""
    parent = os.getppid()
    while not stop.is_set():
        await asyncio.sleep(check_s)
        if os.getppid() != parent:
            log.warning("supervisor gone, draining")
            stop.set()
