"""The supervisor: ``Stack`` starts the planned components stage by stage, waits until each is
healthy, records them in stack.json, and stops, restarts or kills them (see the package's doc)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ragmesh_cli import procutil
from ragmesh_cli.secure import IDENTITY_OF_KIND, OPS, SERVER_NAME, SecureMaterial, Tenants
from ragmesh_cli.stack.files import S3_DATA_DIR, nats_argv, nats_login, s3_credentials, weed_argv
from ragmesh_cli.stack.readiness import (
    SERVING,
    check_s3_refuses_wrong_key,
    down_health,
    make_buckets,
    probe_component,
    wait_healthy,
)
from ragmesh_cli.stack.spec import (
    ALL_SERVICES,
    NATS,
    S3,
    SERVICE_MODULES,
    Component,
    ProcessStatus,
    Shape,
    check_scale,
    kind_address,
    plan,
    plan_names,
    shard_replicas,
    wiring_env,
)
from ragmesh_cli.state import STATE_FILE, STATE_VERSION, StackError, read_state, stack_is_running


class Stack:
    def __init__(
        self,
        state_dir: Path,
        workers: int = 1,
        index_shards: int = 1,
        extra_env: dict[str, str] | None = None,
        *,
        services: Sequence[str] = ALL_SERVICES,
        health_timeout_s: float = 60.0,
        grace_s: float = 15.0,
        replicas: Mapping[str, int] | None = None,
        processes: Mapping[str, int] | None = None,
        secure: bool = False,
        api_keys: Tenants | None = None,
        sparse_shards: int = 1,
    ) -> None:
        unknown = set(services) - set(ALL_SERVICES)
        if unknown:
            raise ValueError(f"unknown services {sorted(unknown)}; known: {list(ALL_SERVICES)}")
        if workers < 0 or index_shards < 1 or sparse_shards < 1:
            raise ValueError("workers must be >= 0, index_shards and sparse_shards >= 1")
        self.state_dir = Path(state_dir).absolute()
        self.workers = workers
        self.index_shards = index_shards
        self.sparse_shards = sparse_shards
        self.extra_env = dict(extra_env or {})
        self.services = [kind for kind in ALL_SERVICES if kind in services]
        # Kind -> processes, only the kinds with more than one.
        self.replicas = check_scale(replicas or {}, "--replicas", self.services)
        self.processes = check_scale(processes or {}, "--workers", self.services)
        self.health_timeout_s = health_timeout_s
        self.grace_s = grace_s
        self.components: dict[str, Component] = {}
        self.secure = secure
        self.secrets = SecureMaterial(self.state_dir, api_keys) if secure else None
        # Handles of the processes this Python process spawned: lets us reap them and see exit codes.
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------ construction / state

    @classmethod
    def load(cls, state_dir: Path) -> Stack:
        """Attach to the stack recorded in ``state_dir`` (running or not)."""
        state_dir = Path(state_dir).absolute()
        data = read_state(state_dir)
        if data is None:
            raise StackError(f"no stack recorded in {state_dir} (run 'ragmesh up' first)")
        stack = cls(
            state_dir,
            workers=data["workers"],
            index_shards=data["index_shards"],
            extra_env=data.get("extra_env") or {},
            services=data["services"],
            replicas=data.get("replicas") or {},
            processes=data.get("processes") or {},
            secure=bool(data.get("secure")),
            sparse_shards=data.get("sparse_shards", 1),
        )
        stack.components = {c["name"]: Component(**c) for c in data["components"]}
        return stack

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def log_path(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"

    def names(self) -> list[str]:
        """Component names in start order."""
        return [c.name for c in sorted(self.components.values(), key=lambda c: c.stage)]

    def component(self, name: str) -> Component:
        try:
            return self.components[name]
        except KeyError:
            raise StackError(f"no component {name!r}; the stack has {self.names()}") from None

    def address(self, name: str) -> str:
        """``127.0.0.1:port`` of a component (NATS client port, S3 API port, gRPC port)."""
        return self.component(name).address

    def _save(self) -> None:
        data = {
            "version": STATE_VERSION,
            "state_dir": str(self.state_dir),
            "workers": self.workers,
            "index_shards": self.index_shards,
            "sparse_shards": self.sparse_shards,
            "replicas": self.replicas,
            "processes": self.processes,
            "services": self.services,
            "secure": self.secure,
            "extra_env": self.extra_env,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "components": [asdict(self.components[n]) for n in self.names()],
        }
        # 0600: extra_env may carry secrets of the caller.
        procutil.write_json_atomic(self.state_dir / STATE_FILE, data, mode=0o600)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise supervisors acting on one state dir (two 'ragmesh up' at once). Meanwhile
        what the supervisor writes is private (its logs, the state file, folders it makes)."""
        with procutil.private_umask():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            with (self.state_dir / "stack.lock").open("a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ credentials and env

    def _credentials(self) -> dict[str, str]:
        return s3_credentials(self.state_dir)

    def client_env(self) -> dict[str, str]:
        """The RAGMESH_* settings a client (or an extra service) needs to reach this stack."""
        env = {"RAGMESH_STATE_DIR": str(self.state_dir)}
        env.update(wiring_env(self.components, self.index_shards, self._credentials()))
        self._apply_identity(env, OPS)
        return env

    def shard_replicas(self, shard: int, kind: str = "index") -> list[Component]:
        """The replicas of shard ``shard`` of the index (or of ``kind``: sparse), in replica order."""
        return shard_replicas(self.components, shard, kind)

    def kind_address(self, kind: str) -> str:
        """Every replica of a kind, comma separated in replica order ('' when none runs)."""
        return kind_address(self.components, kind)

    def _process_env(self, comp: Component) -> dict[str, str]:
        # Caller's env first (its RAGMESH_* knobs reach the services), then the wiring, which must
        # win over stale addresses in the caller's env, then explicit overrides, then the
        # component's own ports and identity.
        env = dict(os.environ)
        env.update(self.client_env())
        env.update(self.extra_env)
        env.update(comp.env)
        env["PYTHONUNBUFFERED"] = "1"
        identity = IDENTITY_OF_KIND.get(comp.kind)
        if identity is not None:
            self._apply_identity(env, identity)
        elif self.secrets is not None:
            self.secrets.apply_server_env(env, comp.kind)
        return env

    # ------------------------------------------------------------------ secure mode

    def _apply_identity(self, env: dict[str, str], identity: str) -> None:
        """In a secure stack, make ``env`` that of ``identity`` (certificate, keys, credentials)."""
        if self.secrets is None:
            return
        nats = self.address(NATS) if NATS in self.components else None
        self.secrets.apply_env(env, identity, nats)

    def api_key(self, name: str = OPS) -> str:
        """The plaintext API key ``name`` of a secure stack (``ops``, or a tenant of ``api_keys``)."""
        if self.secrets is None:
            raise StackError("this stack is not secure: it has no API keys")
        return self.secrets.api_key(name)

    def client_tls(self, identity: str = OPS) -> Any:
        """How this process reaches the stack's gRPC ports as ``identity`` (meshkit.rpc.tls.ClientTLS;
        None: plaintext)."""
        from meshkit.rpc.tls import ClientTLS
        from meshkit.settings import MeshSettings

        if self.secrets is None:
            # The environment's TLS settings, never a profile the CLI took from another state dir.
            return ClientTLS.from_settings(MeshSettings())
        pki = self.secrets.pki
        return ClientTLS(pki.ca_cert, pki.cert(identity), pki.key(identity), SERVER_NAME)

    def _s3_endpoint_key(self) -> tuple[str, str, Path | None]:
        """(access key, secret key, CA) the supervisor uses to reach S3."""
        if self.secrets is not None:
            key = self.secrets.s3_key(OPS)
            return key.access_key, key.secret_key, self.secrets.pki.ca_cert
        creds = self._credentials()
        return creds["access_key"], creds["secret_key"], None

    def _nats_login(self) -> dict[str, Any] | None:
        """How the supervisor logs in to a secure stack's NATS (None: plain, probed by its
        monitoring port)."""
        if self.secrets is None:
            return None
        return nats_login(self.secrets, self.address(NATS), OPS)

    async def _ensure_buckets(self) -> None:
        """The supervisor creates the buckets (a secure stack's services may not) and their
        first volumes, then makes what SeaweedFS wrote private (readiness.make_buckets)."""
        access, secret, ca = self._s3_endpoint_key()
        await asyncio.to_thread(make_buckets, self.address(S3), access, secret, ca)
        procutil.make_private(self.state_dir / S3_DATA_DIR)

    # ------------------------------------------------------------------ topology

    def _shape(self) -> Shape:
        return Shape(
            self.state_dir,
            self.services,
            self.workers,
            self.index_shards,
            self.replicas,
            self.processes,
            self.sparse_shards,
        )

    def _plan_names(self) -> list[str]:
        return plan_names(self._shape())

    def _plan(self) -> dict[str, Component]:
        """Fresh components with newly chosen free ports."""
        return plan(self._shape())

    def _argv(self, comp: Component) -> list[str]:
        if comp.kind == NATS:
            return nats_argv(self.state_dir, comp, self.secrets)
        if comp.kind == S3:
            return weed_argv(self.state_dir, comp, self.secrets)
        return [sys.executable, "-m", SERVICE_MODULES[comp.kind]]

    # ------------------------------------------------------------------ health

    async def probe(self, comp: Component) -> str:
        """Health of one component: SERVING, NOT_SERVING..., UNREACHABLE."""
        return await probe_component(comp, self._s3_endpoint_key, self.client_tls, self._nats_login)

    def _exit_code(self, comp: Component) -> int | None:
        """The exit code if the component's process is known to have ended, else None."""
        proc = self._procs.get(comp.name)
        if proc is not None and proc.pid == comp.pid:
            return proc.poll()
        return None if procutil.pid_alive(comp.pid, comp.start_time) else -1

    async def _wait_healthy(self, comp: Component) -> None:
        await wait_healthy(comp, self.probe, self._exit_code, self.log_path(comp.name), self.health_timeout_s)

    async def _check_s3_refuses_wrong_key(self) -> None:
        ca = self.secrets.pki.ca_cert if self.secrets is not None else None
        await check_s3_refuses_wrong_key(self.address(S3), ca)

    # ------------------------------------------------------------------ process control

    def _spawn(self, comp: Component) -> None:
        proc = procutil.spawn(
            self._argv(comp),
            self._process_env(comp),
            self.log_path(comp.name),
            self.state_dir,
            header=f"starting {comp.name}",
        )
        self._procs[comp.name] = proc
        comp.pid = proc.pid
        comp.start_time = procutil.process_start_time(proc.pid)

    def _is_running(self, comp: Component) -> bool:
        return procutil.pid_alive(comp.pid, comp.start_time)

    def _terminate(self, comps: Sequence[Component]) -> None:
        procutil.terminate([(c.pid, c.start_time) for c in comps if c.pid], self.grace_s)
        for comp in comps:
            proc = self._procs.pop(comp.name, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1)
            comp.pid = None
            comp.start_time = None

    def _stages(self) -> list[list[Component]]:
        stages: dict[int, list[Component]] = {}
        for comp in self.components.values():
            stages.setdefault(comp.stage, []).append(comp)
        return [stages[s] for s in sorted(stages)]

    async def _start_stage(self, comps: Sequence[Component], started: list[Component]) -> None:
        """Spawn the stage's dead components and wait for the whole stage to be healthy."""
        for comp in comps:
            if not self._is_running(comp):
                self._spawn(comp)
                started.append(comp)
        self._save()
        results = await asyncio.gather(*(self._wait_healthy(c) for c in comps), return_exceptions=True)
        errors = [str(r) for r in results if isinstance(r, BaseException)]
        if errors:
            raise StackError("\n\n".join(errors))
        if any(c.kind == S3 for c in comps):
            await self._check_s3_refuses_wrong_key()
            await self._ensure_buckets()

    # ------------------------------------------------------------------ public API (async)

    async def up_async(self) -> str:
        """Start the stack (or the parts of it that are down) and wait until all is healthy.
        Returns a one-line summary. On failure stops what it started and raises StackError."""
        with self._locked():
            # State written before the stack kept it private (or copied in) is made private too.
            procutil.make_private(self.state_dir)
            running = self._adopt_running()
            # Before the healthy-stack return: a tenant given now gets its key in the file,
            # which the public services reload without a restart.
            if self.secrets is not None:
                self.secrets.prepare()
            if running:
                statuses = await self.status_async()
                if all(s.health == SERVING for s in statuses):
                    return (
                        f"stack already running and healthy ({len(statuses)} processes) in {self.state_dir}"
                    )
            else:
                self.components = self._plan()
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            started: list[Component] = []
            try:
                for stage in self._stages():
                    await self._start_stage(stage, started)
            except BaseException:
                self._terminate(list(reversed(started)))
                self._save()
                raise
            self._save()
            verb = "repaired" if running else "started"
            return (
                f"stack {verb} in {self.state_dir}: {len(started)} processes started, "
                f"{len(self.components)} healthy"
            )

    def _adopt_running(self) -> bool:
        """Load the recorded stack if any of its processes still runs; refuse a different topology."""
        data = read_state(self.state_dir)
        if data is None:
            return False
        if not stack_is_running(data):
            return False
        recorded = {c["name"]: Component(**c) for c in data["components"]}
        wanted = set(self._plan_names())
        if wanted != set(recorded):
            raise StackError(
                f"a stack with {sorted(recorded)} is running in {self.state_dir}; "
                f"run 'ragmesh down' before starting {sorted(wanted)}"
            )
        if bool(data.get("secure")) != self.secure:
            mode = "secure" if data.get("secure") else "plain"
            raise StackError(f"a {mode} stack is running in {self.state_dir}; run 'ragmesh down' first")
        running_processes = data.get("processes") or {}
        if running_processes != self.processes:
            raise StackError(
                f"a stack with worker processes {running_processes or 'none'} is running in "
                f"{self.state_dir}; run 'ragmesh down' before starting it with {self.processes or 'none'}"
            )
        self.components = recorded
        self.extra_env = data.get("extra_env") or self.extra_env
        return True

    async def status_async(self) -> list[ProcessStatus]:
        comps = [self.components[n] for n in self.names()]
        alive = [self._is_running(c) for c in comps]
        healths = await asyncio.gather(
            *(self.probe(c) if a else down_health() for c, a in zip(comps, alive, strict=True))
        )
        return [
            ProcessStatus(c.name, c.kind, c.pid if a else None, a, c.port, h, str(self.log_path(c.name)))
            for c, a, h in zip(comps, alive, healths, strict=True)
        ]

    async def start_async(self, name: str) -> None:
        """(Re)start one component with its recorded ports and env; wait until healthy."""
        with self._locked():
            comp = self.component(name)
            if self._is_running(comp):
                raise StackError(f"{name} is already running (pid {comp.pid})")
            started: list[Component] = []
            try:
                await self._start_stage([comp], started)
            except BaseException:
                self._terminate(started)
                self._save()
                raise
            self._save()

    # ------------------------------------------------------------------ public API (sync)

    def __enter__(self) -> Stack:
        """``with Stack(...) as stack``: up on entry (a failed up stops what it started), down on
        exit, whatever happened in between."""
        self.up()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.down()

    def up(self) -> str:
        return asyncio.run(self.up_async())

    def status(self) -> list[ProcessStatus]:
        return asyncio.run(self.status_async())

    def start(self, name: str) -> None:
        asyncio.run(self.start_async(name))

    def down(self) -> list[str]:
        """Stop everything, reverse start order (NATS and S3 last): SIGTERM, grace, SIGKILL.
        Returns the names of the components that were running."""
        with self._locked():
            was_running = [n for n in self.names() if self._is_running(self.components[n])]
            for stage in reversed(self._stages()):
                self._terminate(stage)
            if self.components:
                self._save()
            return was_running

    def stop(self, name: str) -> None:
        """Stop one component gracefully (SIGTERM, grace, SIGKILL)."""
        with self._locked():
            self._terminate([self.component(name)])
            self._save()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a component's process group (for failure tests). SIGKILL waits until
        it is gone so its ports can be reused at once."""
        comp = self.component(name)
        if not self._is_running(comp) or comp.pid is None:
            raise StackError(f"{name} is not running")
        procutil.signal_group(comp.pid, sig)
        if sig == signal.SIGKILL:
            deadline = time.monotonic() + 5.0
            while self._is_running(comp) and time.monotonic() < deadline:
                proc = self._procs.get(name)
                if proc is not None:
                    proc.poll()
                time.sleep(0.02)
