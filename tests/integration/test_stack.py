"""The local stack supervisor against real processes: up, status, credentials, restart of one
component, failure handling and down."""

from __future__ import annotations

import json
import signal
import stat
from pathlib import Path

import pytest
from minio import Minio
from minio.error import S3Error

from ragmesh_cli import procutil
from ragmesh_cli.main import main
from ragmesh_cli.stack import (
    CREDENTIALS_FILE,
    REFUSED_KEY_CODES,
    SERVING,
    STATE_FILE,
    Stack,
    StackError,
    available_services,
    read_state,
    replica_name,
    s3_wrong_key_outcome,
)

pytestmark = pytest.mark.integration


def _expected_names(stack: Stack) -> set[str]:
    names = {"nats", "s3"}
    for kind in stack.services:
        if kind == "index":
            replicas = stack.replicas.get(kind, 1)
            names |= {
                replica_name(f"index-{i}", r) for i in range(stack.index_shards) for r in range(replicas)
            }
        elif kind == "worker":
            names |= {f"worker-{i}" for i in range(stack.workers)}
        else:
            names |= {replica_name(kind, r) for r in range(stack.replicas.get(kind, 1))}
    return names


def test_up_brings_every_component_to_healthy(stack: Stack) -> None:
    statuses = stack.status()
    assert {s.name for s in statuses} == _expected_names(stack)
    unhealthy = [(s.name, s.health) for s in statuses if not (s.alive and s.health == SERVING)]
    assert not unhealthy, f"unhealthy: {unhealthy}"
    assert len({s.port for s in statuses}) == len(statuses)


def test_up_is_idempotent(stack: Stack) -> None:
    pids = {s.name: s.pid for s in stack.status()}
    assert "already running" in stack.up()
    assert {s.name: s.pid for s in stack.status()} == pids


def test_state_file_records_ports_pids_and_keeps_secrets_private(stack: Stack) -> None:
    data = read_state(stack.state_dir)
    assert data is not None
    recorded = {c["name"]: c for c in data["components"]}
    for status in stack.status():
        assert recorded[status.name]["pid"] == status.pid
        assert recorded[status.name]["ports"]["main"] == status.port
    for name in (STATE_FILE, CREDENTIALS_FILE):
        assert stat.S_IMODE((stack.state_dir / name).stat().st_mode) == 0o600
    attached = Stack.load(stack.state_dir)
    assert {n: attached.address(n) for n in attached.names()} == {n: stack.address(n) for n in stack.names()}


def test_client_env_wires_every_component(stack: Stack, stack_env: dict[str, str]) -> None:
    assert stack_env["RAGMESH_NATS_URL"] == f"nats://{stack.address('nats')}"
    assert stack_env["RAGMESH_S3_ENDPOINT"] == stack.address("s3")
    if "index" in stack.services:
        assert stack_env["RAGMESH_INDEX_ADDRESSES"].split(",") == [
            stack.address(f"index-{i}") for i in range(stack.index_shards)
        ]
    if "ingestion" in stack.services:
        assert stack_env["RAGMESH_INGESTION_ADDRESS"] == stack.address("ingestion")


def test_s3_accepts_our_key_and_refuses_a_wrong_one(stack_env: dict[str, str]) -> None:
    endpoint = stack_env["RAGMESH_S3_ENDPOINT"]
    ours = Minio(
        endpoint,
        access_key=stack_env["RAGMESH_S3_ACCESS_KEY"],
        secret_key=stack_env["RAGMESH_S3_SECRET_KEY"],
        secure=False,
    )
    ours.list_buckets()
    wrong_secret = Minio(
        endpoint, access_key=stack_env["RAGMESH_S3_ACCESS_KEY"], secret_key="x" * 30, secure=False
    )
    with pytest.raises(S3Error) as refused:
        wrong_secret.list_buckets()
    assert refused.value.code == "SignatureDoesNotMatch"
    assert s3_wrong_key_outcome(endpoint) in REFUSED_KEY_CODES


async def test_nats_jetstream_is_usable(stack_env: dict[str, str]) -> None:
    import nats

    client = await nats.connect(stack_env["RAGMESH_NATS_URL"], connect_timeout=5)
    try:
        info = await client.jetstream().account_info()
        assert info is not None
    finally:
        await client.close()


def test_kill_and_restart_one_component(stack: Stack) -> None:
    # A gRPC service when one runs (the real restart path), else NATS.
    name = next((n for n in ("sparse", "index-0", "embedder") if n in stack.components), "nats")
    before = {s.name: s for s in stack.status()}[name]
    stack.kill(name, signal.SIGKILL)
    after_kill = {s.name: s for s in stack.status()}[name]
    assert not after_kill.alive
    with pytest.raises(StackError):
        stack.kill(name)
    stack.start(name)
    restarted = {s.name: s for s in stack.status()}[name]
    assert restarted.alive and restarted.health == SERVING
    assert restarted.port == before.port
    assert restarted.pid != before.pid
    with pytest.raises(StackError, match="already running"):
        stack.start(name)


def test_cli_status_json(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--state-dir", str(stack.state_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in out["processes"]} == _expected_names(stack)
    assert all(p["health"] == SERVING for p in out["processes"])


def test_failed_start_stops_what_it_started(tmp_path: Path) -> None:
    services = [s for s in available_services() if s in ("sparse", "index", "embedder")][:1]
    if not services:
        pytest.skip("needs a gRPC service to make fail")
    # An invalid setting makes the service exit at start-up.
    broken = Stack(tmp_path / "st", services=services, extra_env={"RAGMESH_LOG_FORMAT": "bogus"})
    with pytest.raises(StackError, match="exited") as failure:
        broken.up()
    assert str(broken.log_path(services[0])) in str(failure.value)
    data = read_state(broken.state_dir)
    assert data is not None
    assert all(c["pid"] is None for c in data["components"])


def test_down_stops_every_process(tmp_path: Path) -> None:
    own = Stack(tmp_path / "st", services=[])
    try:
        own.up()
        recorded = [(c.pid, c.start_time) for c in own.components.values()]
        assert all(procutil.pid_alive(pid, st) for pid, st in recorded)
    finally:
        stopped = own.down()
    assert set(stopped) == {"nats", "s3"}
    assert not any(procutil.pid_alive(pid, st) for pid, st in recorded)
    assert all(not s.alive for s in own.status())
    assert "already running" not in own.up()
    own.down()


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat_file.parent.name))
    return found


async def test_replicas_and_workers_serve_through_one_target(tmp_path: Path) -> None:
    from meshkit.rpc.client import Downstream
    from ragmesh.planner.v1 import planner_pb2, planner_pb2_grpc

    if "planner" not in available_services():
        pytest.skip("needs the planner")
    scaled = Stack(tmp_path / "st", services=["planner"], replicas={"planner": 2}, processes={"planner": 2})
    try:
        await scaled.up_async()
        statuses = {s.name: s for s in await scaled.status_async()}
        assert statuses["planner"].health == statuses["planner-2"].health == SERVING
        supervisors = [scaled.component(n).pid for n in ("planner", "planner-2")]
        workers = [_children(pid) for pid in supervisors if pid]
        assert [len(w) for w in workers] == [2, 2]
        address = scaled.client_env()["RAGMESH_PLANNER_ADDRESS"]
        assert address == f"{scaled.address('planner')},{scaled.address('planner-2')}"
        planner = Downstream("planner", address, planner_pb2_grpc.PlannerServiceStub)
        try:
            for _ in range(6):
                request = planner_pb2.PlanRequest(query="what is x")
                reply = await planner.call(planner.stub.Plan, request, idempotent=True)
                assert reply.plan.planner
        finally:
            await planner.close()
    finally:
        scaled.down()
    assert not any(procutil.pid_alive(pid, None) for pids in workers for pid in pids)
