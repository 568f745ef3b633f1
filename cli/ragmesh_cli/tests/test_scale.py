"""``ragmesh up --replicas/--workers``: option parsing, the planned topology, the env callers get,
and the shape recorded in stack.json (no processes are started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshkit.settings import MeshSettings
from ragmesh_cli import procutil
from ragmesh_cli.main import build_parser, resolve_address
from ragmesh_cli.stack import Stack, StackError, parse_counts, parse_workers

READ_PATH = ("embedder", "index", "sparse", "planner", "reranker", "gateway")


def test_parse_counts() -> None:
    assert parse_counts("reranker=2, embedder=3,", "--replicas") == {"reranker": 2, "embedder": 3}
    assert parse_counts("", "--replicas") == {}
    for bad in ("reranker", "reranker=two", "=2", "reranker=-1"):
        with pytest.raises(ValueError, match="is not KIND=N"):
            parse_counts(bad, "--replicas")
    with pytest.raises(ValueError, match="given twice"):
        parse_counts("reranker=2,reranker=3", "--replicas")


def test_workers_option_keeps_its_ingestion_meaning() -> None:
    assert parse_workers("3") == (3, None)
    assert parse_workers("gateway=2,embedder=2") == (None, {"gateway": 2, "embedder": 2})
    assert parse_workers("worker=4,gateway=2") == (4, {"gateway": 2})
    assert parse_workers("worker=4") == (4, None)
    args = build_parser().parse_args(["up", "--replicas", "reranker=2", "--workers", "gateway=2"])
    assert (args.replicas, args.workers) == ("reranker=2", "gateway=2")


@pytest.mark.parametrize("kind", ["ingestion", "worker", "llm"])
def test_stateful_kinds_refuse_replicas_and_workers(tmp_path: Path, kind: str) -> None:
    with pytest.raises(ValueError, match=f"{kind} cannot be scaled"):
        Stack(tmp_path, replicas={kind: 2})
    with pytest.raises(ValueError, match=f"{kind} cannot be scaled"):
        Stack(tmp_path, processes={kind: 2})


@pytest.mark.parametrize("kind", ["index", "sparse"])
def test_stores_take_replicas_but_not_workers_sharing_a_data_dir(tmp_path: Path, kind: str) -> None:
    assert Stack(tmp_path, replicas={kind: 2}).replicas == {kind: 2}
    with pytest.raises(ValueError, match=f"{kind} cannot be scaled"):
        Stack(tmp_path, processes={kind: 2})


def test_store_replicas_get_their_own_data_dirs_and_callers_get_every_replica(tmp_path: Path) -> None:
    stack = Stack(
        tmp_path,
        workers=1,
        index_shards=2,
        services=("index", "sparse", "worker"),
        replicas={"index": 2, "sparse": 2},
    )
    stack.components = stack._plan()
    index = {n: c for n, c in stack.components.items() if c.kind == "index"}
    assert sorted(index) == ["index-0", "index-0-2", "index-1", "index-1-2"]
    assert [index[n].env["RAGMESH_INDEX_SHARD"] for n in sorted(index)] == ["0", "0", "1", "1"]
    data_dirs = [c.env["RAGMESH_INDEX_DATA_DIR"] for c in index.values()]
    data_dirs += [stack.components[n].env["RAGMESH_SPARSE_DATA_DIR"] for n in ("sparse", "sparse-2")]
    assert len(set(data_dirs)) == 6
    # The first replica keeps the data dir a one-replica stack uses.
    assert index["index-0"].env["RAGMESH_INDEX_DATA_DIR"] == str(stack.state_dir / "index-0")
    assert stack.components["sparse"].env["RAGMESH_SPARSE_DATA_DIR"] == str(stack.state_dir / "sparse")
    env = stack.client_env()
    a = stack.address
    assert (
        env["RAGMESH_INDEX_ADDRESSES"] == f"{a('index-0')}|{a('index-0-2')},{a('index-1')}|{a('index-1-2')}"
    )
    assert env["RAGMESH_SPARSE_ADDRESSES"] == f"{a('sparse')}|{a('sparse-2')}"
    settings = MeshSettings(index_addresses=env["RAGMESH_INDEX_ADDRESSES"])
    assert settings.index_address_list() == [
        f"{a('index-0')},{a('index-0-2')}",
        f"{a('index-1')},{a('index-1-2')}",
    ]


def test_scaling_a_service_not_started_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not among the services"):
        Stack(tmp_path, services=("embedder",), replicas={"reranker": 2})


def test_replicas_and_workers_shape_the_plan_and_the_client_env(tmp_path: Path) -> None:
    stack = Stack(
        tmp_path,
        workers=0,
        services=READ_PATH,
        replicas={"reranker": 2, "embedder": 2, "planner": 1},
        processes={"gateway": 2},
    )
    stack.components = stack._plan()
    assert stack.replicas == {"embedder": 2, "reranker": 2}  # 1 is the default, not recorded
    names = set(stack.components)
    assert {"reranker", "reranker-2", "embedder", "embedder-2", "gateway", "planner"} <= names
    assert "planner-2" not in names and "gateway-2" not in names
    ports = {c.port for c in stack.components.values()}
    assert len(ports) == len(stack.components)  # every replica on its own port

    gateway = stack.components["gateway"]
    assert gateway.env["RAGMESH_WORKERS"] == "2"
    assert gateway.env["RAGMESH_PORT"] == str(gateway.port)
    assert "RAGMESH_WORKERS" not in stack.components["reranker"].env

    env = stack.client_env()
    rerankers = f"{stack.address('reranker')},{stack.address('reranker-2')}"
    assert env["RAGMESH_RERANKER_ADDRESS"] == rerankers
    assert env["RAGMESH_EMBEDDER_ADDRESS"].count(",") == 1
    assert env["RAGMESH_GATEWAY_ADDRESS"] == stack.address("gateway")
    assert MeshSettings(reranker_address=rerankers).reranker_address == rerankers


def test_the_shape_is_recorded_and_a_different_one_refused_while_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = Stack(tmp_path, workers=0, services=READ_PATH, replicas={"gateway": 2}, processes={"embedder": 2})
    stack.components = stack._plan()
    stack._save()
    loaded = Stack.load(tmp_path)
    assert (loaded.replicas, loaded.processes) == ({"gateway": 2}, {"embedder": 2})
    assert set(loaded.components) == set(stack.components)

    # The CLI reaches every gateway replica through one round-robin target.
    monkeypatch.delenv("RAGMESH_GATEWAY_ADDRESS", raising=False)
    target = resolve_address("gateway", tmp_path)
    assert target == f"ipv4:{stack.address('gateway')},{stack.address('gateway-2')}"

    # Pretend it runs (this process stands in for one of its processes).
    loaded.components["gateway"].pid = os.getpid()
    loaded.components["gateway"].start_time = procutil.process_start_time(os.getpid())
    loaded._save()
    same = Stack(tmp_path, workers=0, services=READ_PATH, replicas={"gateway": 2}, processes={"embedder": 2})
    assert same._adopt_running()
    with pytest.raises(StackError, match="run 'ragmesh down'"):
        Stack(tmp_path, workers=0, services=READ_PATH, replicas={"gateway": 3})._adopt_running()
    with pytest.raises(StackError, match="worker processes"):
        Stack(tmp_path, workers=0, services=READ_PATH, replicas={"gateway": 2})._adopt_running()
