"""Pre-fork workers (meshkit.rpc.prefork): the refusals, and a real group of two workers sharing one
port, stopped by SIGTERM and taken down when a worker dies."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from grpc import aio

from meshkit.rpc.client import check_health
from meshkit.rpc.prefork import check_workers, metrics_port_of
from meshkit.rpc.server import server_options
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
SERVICE = Path(__file__).with_name("prefork_service.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    for _ in range(200):
        first = free_port()
        if all(_is_free(first + i) for i in range(1, count)):
            return first
    raise RuntimeError("no run of free ports")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def group_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMESH_")}
    return {**env, "RAGMESH_LOG_FORMAT": "text", "RAGMESH_SHUTDOWN_GRACE_S": "1", **values}


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def start_group(
    procs: list[subprocess.Popen[bytes]], port: int, metrics_port: int = 0
) -> subprocess.Popen[bytes]:
    env = group_env(RAGMESH_WORKERS="2", RAGMESH_PORT=str(port), RAGMESH_METRICS_PORT=str(metrics_port))
    # Its own session: the cleanup kills the group (supervisor and workers) whatever happened.
    proc = subprocess.Popen([sys.executable, str(SERVICE)], env=env, cwd=ROOT, start_new_session=True)
    procs.append(proc)
    return proc


async def worker_pids(port: int, want: int = 2, connections: int = 80) -> set[int]:
    """Pids that answered, each call on a fresh connection (the kernel picks a worker per one)."""
    seen: set[int] = set()
    options = [("grpc.use_local_subchannel_pool", 1)]
    for _ in range(connections):
        async with aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            reply = await embedder_pb2_grpc.EmbedderServiceStub(channel).Embed(
                embedder_pb2.EmbedRequest(texts=["x"]), timeout=15, wait_for_ready=True
            )
        seen.add(int(reply.model))
        if len(seen) >= want:
            break
    return seen


def wait_exit(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    return proc.wait(timeout)


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_refuses_stateful_services_and_port_zero() -> None:
    check_workers("index", False, MeshSettings(workers=1, port=0))  # one process: anything goes
    with pytest.raises(ValueError, match="keeps state per process"):
        check_workers("index", False, MeshSettings(workers=2, port=5000))
    with pytest.raises(ValueError, match="needs a fixed port"):
        check_workers("reranker", True, MeshSettings(workers=2, port=0))
    check_workers("reranker", True, MeshSettings(workers=2, port=5000))


def test_metrics_port_and_reuseport_follow_the_worker() -> None:
    assert metrics_port_of(MeshSettings(metrics_port=9100, workers=2)) == 9100  # the supervisor
    assert metrics_port_of(MeshSettings(metrics_port=9100, workers=2, worker_index=1)) == 9101
    assert metrics_port_of(MeshSettings(metrics_port=0, workers=2, worker_index=1)) == 0
    assert ("grpc.so_reuseport", 0) in server_options(MeshSettings())
    assert ("grpc.so_reuseport", 1) in server_options(MeshSettings(workers=2))


def test_a_stateful_service_refuses_workers_at_start(tmp_path: Path) -> None:
    env = group_env(RAGMESH_WORKERS="2", RAGMESH_PORT=str(free_port()), RAGMESH_STATE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "services.index"], env=env, cwd=ROOT, capture_output=True, timeout=60
    )
    assert done.returncode == 1
    assert b"index cannot run workers=2" in done.stderr


async def test_two_workers_share_one_port_and_drain_on_sigterm(
    started: list[subprocess.Popen[bytes]],
) -> None:
    port, metrics = free_port(), free_port_run(2)
    group = start_group(started, port, metrics)
    pids = await worker_pids(port)
    assert len(pids) == 2 and group.pid not in pids
    assert await check_health(f"127.0.0.1:{port}") == "SERVING"
    async with httpx.AsyncClient(timeout=5) as http:
        for worker in range(2):
            reply = await http.get(f"http://127.0.0.1:{metrics + worker}/metrics")
            assert "ragmesh_rpc_requests_total" in reply.text
    group.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(wait_exit, group) == 0
    assert all(gone(pid) for pid in pids)


async def test_a_dying_worker_takes_the_group_down(started: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    group = start_group(started, port)
    first, second = sorted(await worker_pids(port))
    os.kill(first, signal.SIGKILL)
    assert await asyncio.to_thread(wait_exit, group) == 1
    assert gone(second)


async def test_workers_drain_when_their_supervisor_is_killed(started: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    group = start_group(started, port)
    pids = await worker_pids(port)
    group.kill()  # SIGKILL: no chance to pass anything on
    group.wait(5)
    assert all(gone(pid) for pid in pids)
