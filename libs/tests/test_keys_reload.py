"""Live reload of the API keys file (meshkit.rpc.keyreload, Guard.replace_keys) and in-place edits of
it (meshkit.rpc.keysfile): a changed file is in force without a restart, an invalid one is kept out,
a revoked key is refused within the interval, unchanged keys keep their rate-limit buckets, every
pre-fork worker reloads on its own, and edits are locked, validated and atomic."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from prometheus_client import REGISTRY

from meshkit.core.errors import ServiceError
from meshkit.core.logs import JsonFormatter
from meshkit.rpc import keysfile
from meshkit.rpc.auth import (
    READ,
    Guard,
    KeysFileError,
    Rate,
    Rule,
    digest_of,
    load_keys,
    new_api_key,
    parse_keys,
)
from meshkit.rpc.keyreload import KeysReloader, reloader_for, signature_of
from meshkit.rpc.keysfile import LockedKeysFile, lock_path, read_entries, write_entries
from meshkit.rpc.server import ServiceSpec, start_service
from meshkit.settings import MeshSettings
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
SERVICE = Path(__file__).with_name("prefork_guarded_service.py")
ALICE, BOB, CAROL = "rmk_alice-secret-value", "rmk_bob-secret-value", "rmk_carol-secret-value"
RULES = {"Search": Rule(READ, lambda r: r.collection)}


class Req:
    def __init__(self, collection: str) -> None:
        self.collection = collection


def entry(name: str, key: str, read: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "sha256": digest_of(key), "read": read, "write": [], **extra}


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


def refusal(guard: Guard, key: str, collection: str = "docs") -> grpc.StatusCode | None:
    """None when ``key`` may search ``collection``, else the status it is refused with."""
    try:
        guard.check("Search", Req(collection), bearer(key))
    except ServiceError as exc:
        return exc.code
    return None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reloads(service: str, outcome: str) -> float:
    labels = {"service": service, "outcome": outcome}
    return REGISTRY.get_sample_value("ragmesh_auth_keys_reloads_total", labels) or 0.0


@pytest.fixture
def keys_path(tmp_path: Path) -> Path:
    path = tmp_path / "api-keys.json"
    write_entries(path, [entry("alice", ALICE, ["docs"]), entry("bob", BOB, ["docs"])])
    return path


def guard_and_reloader(path: Path, service: str, clock: Clock | None = None) -> tuple[Guard, KeysReloader]:
    guard = Guard(service, RULES, load_keys(path), clock or Clock())
    return guard, KeysReloader(guard, path, 0.05)


# ----------------------------------------------------------------------------- the guard's swap


def test_replace_keys_swaps_the_set_and_says_what_changed(keys_path: Path) -> None:
    guard = Guard("swap", RULES, load_keys(keys_path))
    assert refusal(guard, ALICE) is None and refusal(guard, CAROL) == grpc.StatusCode.UNAUTHENTICATED
    new = parse_keys(
        json.dumps({"keys": [entry("alice", ALICE, ["docs", "faq"]), entry("carol", CAROL, ["docs"])]}), "t"
    )
    change = guard.replace_keys(new)
    assert (change.added, change.removed, change.changed) == (("carol",), ("bob",), ("alice",))
    assert refusal(guard, BOB) == grpc.StatusCode.UNAUTHENTICATED
    assert refusal(guard, CAROL) is None and refusal(guard, ALICE, "faq") is None
    assert not guard.replace_keys(new)  # the same keys again: nothing changed


def test_buckets_of_unchanged_keys_survive_a_reload() -> None:
    clock = Clock()
    limited = {"per_second": 1, "burst": 2}
    first = [entry("alice", ALICE, ["docs"], rate=limited), entry("bob", BOB, ["docs"], rate=limited)]
    guard = Guard("buckets", RULES, parse_keys(json.dumps({"keys": first}), "t"), clock)
    for key in (ALICE, ALICE, BOB, BOB):
        assert refusal(guard, key) is None
    assert refusal(guard, ALICE) == grpc.StatusCode.RESOURCE_EXHAUSTED
    # alice unchanged, bob given another rate, carol new: only alice's empty bucket carries over.
    second = [
        entry("alice", ALICE, ["docs"], rate=limited),
        entry("bob", BOB, ["docs"], rate={"per_second": 1, "burst": 5}),
        entry("carol", CAROL, ["docs"], rate=limited),
    ]
    guard.replace_keys(parse_keys(json.dumps({"keys": second}), "t"))
    assert refusal(guard, ALICE) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refusal(guard, BOB) is None and refusal(guard, CAROL) is None
    clock.now += 1.0  # the carried-over bucket refills as before
    assert refusal(guard, ALICE) is None


# ----------------------------------------------------------------------------- the reloader


def test_a_valid_change_is_put_in_force(keys_path: Path) -> None:
    guard, reloader = guard_and_reloader(keys_path, "reload-ok")
    assert not reloader.poll()  # the first look: the file the guard was built from, no change
    assert not reloader.poll()
    write_entries(keys_path, [entry("alice", ALICE, ["docs"]), entry("carol", CAROL, ["docs"])])
    assert reloader.poll()
    assert refusal(guard, CAROL) is None
    assert refusal(guard, BOB) == grpc.StatusCode.UNAUTHENTICATED  # revoked
    assert reloads("reload-ok", "ok") == 1
    assert not reloader.poll()  # nothing new since


def test_an_invalid_file_is_kept_out_and_logged_without_its_values(keys_path: Path) -> None:
    guard, reloader = guard_and_reloader(keys_path, "reload-bad")
    reloader.poll()
    pasted = new_api_key()  # a plaintext key pasted where the digest goes
    bad = {"keys": [{**entry("alice", ALICE, ["docs"]), "sha256": pasted}]}
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("test"))
    logger = logging.getLogger("meshkit.rpc.keyreload")
    logger.addHandler(handler)
    try:
        keys_path.write_text(json.dumps(bad))
        assert not reloader.poll()
        assert not reloader.poll()  # the same bad version: counted and logged once
        keys_path.write_text("{ not json")
        assert not reloader.poll()
        keys_path.unlink()
        assert not reloader.poll()
    finally:
        logger.removeHandler(handler)
    assert reloads("reload-bad", "invalid") == 3
    assert refusal(guard, ALICE) is None and refusal(guard, BOB) is None  # the previous keys
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["level"] for line in lines] == ["error"] * 3
    assert "keys.0.sha256" in lines[0]["reason"] and "missing" in lines[2]["reason"]
    assert pasted not in stream.getvalue() and digest_of(ALICE) not in stream.getvalue()
    write_entries(keys_path, [entry("bob", BOB, ["docs"])])  # fixed: in force at the next look
    assert reloader.poll()
    assert refusal(guard, ALICE) == grpc.StatusCode.UNAUTHENTICATED


def test_the_signature_sees_a_replacement_with_the_same_size_and_mtime(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("a")
    other = tmp_path / "g"
    other.write_text("b")
    before = signature_of(path)
    assert before is not None
    os.utime(other, ns=(before.mtime_ns, before.mtime_ns))
    os.replace(other, path)
    after = signature_of(path)
    assert after is not None and (after.mtime_ns, after.size) == (before.mtime_ns, before.size)
    assert after != before  # the inode tells them apart
    assert signature_of(tmp_path / "missing") is None


def test_reload_is_configured_by_the_settings(keys_path: Path) -> None:
    guard = Guard("cfg", RULES, load_keys(keys_path))
    assert MeshSettings().api_keys_reload_s == 2.0
    reloader = reloader_for(guard, MeshSettings(api_keys_file=keys_path, api_key_rate_per_s=3))
    assert reloader is not None and reloader.interval_s == 2.0 and reloader.default_rate == Rate(3.0, 3)
    assert reloader_for(guard, MeshSettings(api_keys_file=keys_path, api_keys_reload_s=0)) is None
    assert reloader_for(None, MeshSettings(api_keys_file=keys_path)) is None


class Echo(embedder_pb2_grpc.EmbedderServiceServicer):
    async def Embed(self, request: Any, context: aio.ServicerContext) -> embedder_pb2.EmbedResponse:
        return embedder_pb2.EmbedResponse(model="ok")


async def code_of(stub: embedder_pb2_grpc.EmbedderServiceStub, key: str) -> grpc.StatusCode:
    try:
        await stub.Embed(embedder_pb2.EmbedRequest(), metadata=bearer(key), timeout=5)
    except aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def until(stub: embedder_pb2_grpc.EmbedderServiceStub, key: str, want: grpc.StatusCode) -> float:
    """Seconds until ``key`` gets ``want`` (fails after 5 s)."""
    started = time.monotonic()
    while await code_of(stub, key) != want:
        assert time.monotonic() - started < 5, f"{want.name} never came"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_a_running_server_takes_a_revocation_within_the_interval(keys_path: Path) -> None:
    spec = ServiceSpec(
        name="reloading-echo",
        grpc_services=["ragmesh.embedder.v1.EmbedderService"],
        register=lambda s: embedder_pb2_grpc.add_EmbedderServiceServicer_to_server(Echo(), s),
        access={"Embed": Rule(READ)},
    )
    settings = MeshSettings(host="127.0.0.1", port=0, api_keys_file=keys_path, api_keys_reload_s=0.2)
    running = await start_service(spec, settings)
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
            assert await code_of(stub, ALICE) == grpc.StatusCode.OK
            with LockedKeysFile(keys_path) as keys:
                keys.remove("alice")
                keys.add(entry("carol", CAROL, ["docs"]))
                keys.save()
            # Within one interval, plus the time of a poll (CI machines are slow: a margin).
            assert await until(stub, ALICE, grpc.StatusCode.UNAUTHENTICATED) < 0.2 + 1.0
            assert await code_of(stub, CAROL) == grpc.StatusCode.OK
            assert await code_of(stub, BOB) == grpc.StatusCode.OK
    finally:
        await running.stop(0)
    assert running.keys_reloader is not None and running.keys_reloader._task is None  # stopped with it


# ----------------------------------------------------------------------------- pre-fork workers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def group(keys_path: Path) -> Iterator[int]:
    """Two pre-fork workers of the guarded service on one port, reloading every 0.1 s."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMESH_")}
    env.update(
        RAGMESH_WORKERS="2",
        RAGMESH_PORT=str(port),
        RAGMESH_API_KEYS_FILE=str(keys_path),
        RAGMESH_API_KEYS_RELOAD_S="0.1",
        RAGMESH_LOG_FORMAT="text",
        RAGMESH_SHUTDOWN_GRACE_S="1",
    )
    proc = subprocess.Popen([sys.executable, str(SERVICE)], env=env, cwd=ROOT, start_new_session=True)
    try:
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


async def call_fresh(port: int, key: str) -> tuple[grpc.StatusCode, int | None]:
    """One call on a new connection (the kernel picks the worker per connection): its status and,
    when accepted, the pid of the worker that served it."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        stub = embedder_pb2_grpc.EmbedderServiceStub(channel)
        try:
            reply = await stub.Embed(
                embedder_pb2.EmbedRequest(), metadata=bearer(key), timeout=15, wait_for_ready=True
            )
        except aio.AioRpcError as exc:
            return exc.code(), None
    return grpc.StatusCode.OK, int(reply.model)


async def pids_accepting(port: int, key: str, seconds: float) -> set[int]:
    """The workers seen accepting ``key`` on fresh connections, until both were or time is up."""
    seen: set[int] = set()
    deadline = time.monotonic() + seconds
    while len(seen) < 2 and time.monotonic() < deadline:
        _code, pid = await call_fresh(port, key)
        if pid is not None:
            seen.add(pid)
    return seen


async def test_every_prefork_worker_reloads_on_its_own(keys_path: Path, group: int) -> None:
    assert len(await pids_accepting(group, ALICE, 20)) == 2
    write_entries(keys_path, [entry("bob", BOB, ["docs"]), entry("carol", CAROL, ["docs"])])
    # carol was unknown to both workers at start: each accepting her has reloaded.
    assert len(await pids_accepting(group, CAROL, 10)) == 2
    codes = {(await call_fresh(group, ALICE))[0] for _ in range(20)}
    assert codes == {grpc.StatusCode.UNAUTHENTICATED}


# ----------------------------------------------------------------------------- editing the file


def test_edits_are_validated_atomic_and_0600(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    with LockedKeysFile(path) as keys:
        assert keys.entries == []  # no file yet: an empty one
        keys.add(entry("alice", ALICE, ["docs"], rate={"per_second": 5}))
        assert keys.save()
        assert not keys.save()  # unchanged
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(lock_path(path).stat().st_mode) == 0o600
    with LockedKeysFile(path) as keys, pytest.raises(KeysFileError, match="already exists"):
        keys.add(entry("alice", BOB, ["docs"]))
    before = path.read_bytes()
    with LockedKeysFile(path) as keys:
        keys.add(entry("twin", ALICE, ["docs"]))  # the same digest as alice's: the parser refuses
        with pytest.raises(KeysFileError, match="same sha256"):
            keys.save()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".keys.json.lock", "keys.json"]  # no temp left


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keys.json"
    write_entries(path, [entry("alice", ALICE, ["docs"])])
    before = path.read_bytes()

    def crash(src: Any, dst: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(keysfile.os, "replace", crash)
    with pytest.raises(KeysFileError, match="cannot write the API keys file"), LockedKeysFile(path) as keys:
        keys.add(entry("bob", BOB, ["docs"]))
        keys.save()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_an_invalid_file_is_refused_before_any_edit(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    pasted = new_api_key()
    path.write_text(json.dumps({"keys": [{**entry("a", ALICE, ["docs"]), "sha256": pasted}]}))
    with pytest.raises(KeysFileError) as err, LockedKeysFile(path):
        pass
    assert "keys.0.sha256" in str(err.value) and pasted not in str(err.value)
    with pytest.raises(KeysFileError, match="does not exist"), LockedKeysFile(tmp_path / "no" / "keys.json"):
        pass


def test_the_lock_serialises_concurrent_editors(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    names = [f"key-{i}" for i in range(12)]
    start = threading.Barrier(len(names))

    def add(name: str) -> None:
        start.wait()
        with LockedKeysFile(path) as keys:
            keys.add(entry(name, f"rmk_{name}", ["docs"]))
            time.sleep(0.005)  # widen the read-modify-write window
            keys.save()

    threads = [threading.Thread(target=add, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(e["name"] for e in read_entries(path)) == sorted(names)
