"""The local stack supervisor: starts the whole mesh (NATS, SeaweedFS S3, every gRPC service)
as detached processes on 127.0.0.1, records ports and pids in ``<state_dir>/stack.json``, checks
health, restarts single components and stops everything.

    stack = Stack(Path(".ragmesh"), workers=2, replicas={"reranker": 2}, processes={"gateway": 2})
    stack.up()
    env = stack.client_env()        # RAGMESH_* a client needs
    stack.kill("index-0"); stack.start("index-0")
    stack.down()

Scale-out: ``replicas`` runs N processes of a stateless kind, each on its own port (the first keeps
the kind's name, e.g. "reranker"; the others are "reranker-2"...) and ``client_env`` hands callers
the comma separated list, which meshkit.client balances round-robin. ``processes`` runs a kind as
N pre-fork workers behind one port (RAGMESH_WORKERS, meshkit.prefork).

Secure (``secure=True``, ``ragmesh up --secure``; docs/SECURITY.md): API keys on the gateway and
the ingestion API, mTLS with one identity per service on every gRPC hop, NATS over TLS with a user
and permissions per service, SeaweedFS over HTTPS with an S3 key per service limited to its
buckets (ragmesh_cli.secure). ``client_env`` then holds the ``ops`` identity; ``api_key(name)``
gives a tenant's key (``api_keys`` grants tenants collections).

NATS runs from a generated configuration file (ragmesh_cli.natsconf) that makes its durability
explicit: JetStream fsyncs before it acknowledges.

The stateful stores take ``replicas`` too: ``{"index": 2, "sparse": 2}`` runs every index shard and
the sparse store as two replicas that stay identical through their replicated log in NATS
(meshkit.replog), each with a data dir of its own (``<state_dir>/<component name>``): "index-0",
"index-0-2", "index-1", ...; "sparse", "sparse-2". Callers get ``a|b`` per shard in
RAGMESH_INDEX_ADDRESSES and a comma list in RAGMESH_SPARSE_ADDRESS.

Every public method has a sync form and an ``*_async`` form; the sync ones use
``asyncio.run`` and so must not be called from a running event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ragmesh_cli import procutil
from ragmesh_cli.natsconf import nats_config, write_nats_config
from ragmesh_cli.procutil import LOOPBACK
from ragmesh_cli.secure import BUCKETS, IDENTITY_OF_KIND, OPS, SERVER_NAME, SecureMaterial, Tenants

STATE_VERSION = 1
STATE_FILE = "stack.json"
CREDENTIALS_FILE = "s3-credentials.json"
S3_CONFIG_FILE = "s3-config.json"
NATS_CONFIG_FILE = "nats.conf"

NATS, S3 = "nats", "s3"
# Service kind -> module run with ``python -m``.
SERVICE_MODULES: dict[str, str] = {
    "embedder": "services.embedder",
    "index": "services.index",
    "sparse": "services.sparse",
    "planner": "services.planner",
    "reranker": "services.reranker",
    "llm": "services.llm",
    "extractor": "services.extractor",
    "narrator": "services.narrator",
    "ingestion": "services.ingestion",
    "gateway": "services.gateway",
    "worker": "services.ingestion.worker",
}
ALL_SERVICES: tuple[str, ...] = tuple(SERVICE_MODULES)
# Start order; stop order is the reverse. Components of one stage start in parallel.
STAGE_OF_KIND = {
    NATS: 0,
    S3: 0,
    "embedder": 1,
    "index": 1,
    "sparse": 1,
    "planner": 1,
    "reranker": 1,
    "llm": 1,
    "extractor": 2,
    "narrator": 2,
    "ingestion": 2,
    "gateway": 2,
    "worker": 3,
}
# Kinds that keep no state of their own, so they may run as several replicas or worker processes
# (meshkit ServiceSpec.multiprocess_safe). The index, sparse and ingestion services own data or
# consumer state per process; the LLM server is one URL.
STATELESS_KINDS: tuple[str, ...] = ("embedder", "planner", "reranker", "extractor", "narrator", "gateway")
# Stateful stores whose replicas follow a replicated log: replicas yes (each its own process and
# data dir), pre-fork workers sharing one data dir no.
REPLICATED_KINDS: tuple[str, ...] = ("index", "sparse")
# Service kinds that answer HTTP health instead of gRPC health (the LLM server is llama.cpp's).
HTTP_HEALTH_PATHS = {"llm": "/health"}
SERVING = "SERVING"
DOWN = "DOWN"
UNREACHABLE = "UNREACHABLE"
# S3 error codes that prove the server checked the key and refused it.
REFUSED_KEY_CODES = frozenset({"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied"})


class StackError(RuntimeError):
    """The stack could not be brought to the requested state; the message says why."""


@dataclass
class Component:
    """One process of the stack, as recorded in stack.json."""

    name: str
    kind: str
    ports: dict[str, int]
    # Component-specific environment (ports, shard, worker id); the shared mesh env is added at spawn.
    env: dict[str, str] = field(default_factory=dict)
    pid: int | None = None
    start_time: int | None = None

    @property
    def stage(self) -> int:
        return STAGE_OF_KIND[self.kind]

    @property
    def port(self) -> int:
        return self.ports["main"]

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"


@dataclass(frozen=True)
class ProcessStatus:
    name: str
    kind: str
    pid: int | None
    alive: bool
    port: int
    health: str
    log: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_counts(text: str, option: str) -> dict[str, int]:
    """``KIND=N,KIND=N`` as given to ``ragmesh up --replicas/--workers`` (kinds checked later)."""
    counts: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        kind, sep, value = item.partition("=")
        kind = kind.strip()
        if not sep or not kind or not value.strip().isdigit():
            raise ValueError(f"{option}: {item!r} is not KIND=N (e.g. {option} reranker=2,embedder=2)")
        if kind in counts:
            raise ValueError(f"{option}: {kind} is given twice")
        counts[kind] = int(value)
    return counts


def parse_workers(text: str) -> tuple[int | None, dict[str, int] | None]:
    """``ragmesh up --workers``: a plain N (or worker=N) is the number of ingestion workers, as it
    always was; KIND=N entries are worker processes per service. Returns (ingestion workers,
    processes per kind), None for what the option does not set."""
    text = text.strip()
    if text.isdigit():
        return int(text), None
    counts = parse_counts(text, "--workers")
    ingest_workers = counts.pop("worker", None)
    return ingest_workers, counts or None


def check_scale(counts: Mapping[str, int], option: str, services: Sequence[str]) -> dict[str, int]:
    """Validated per-kind counts, without the 1s (the default), so equal shapes compare equal."""
    scalable = STATELESS_KINDS + REPLICATED_KINDS if option == "--replicas" else STATELESS_KINDS
    for kind, count in counts.items():
        if kind not in scalable:
            raise ValueError(
                f"{option}: {kind} cannot be scaled this way: only {', '.join(scalable)} can; the "
                "index also scales with --index-shards and ingestion with --workers N"
            )
        if count < 1:
            raise ValueError(f"{option}: {kind}={count} must be >= 1")
        if count > 1 and kind not in services:
            raise ValueError(f"{option}: {kind} is not among the services started ({', '.join(services)})")
    return {kind: count for kind, count in sorted(counts.items()) if count > 1}


def replica_name(kind: str, replica: int) -> str:
    """Component name of replica ``replica`` (0-based): the kind itself for the first."""
    return kind if replica == 0 else f"{kind}-{replica + 1}"


def module_available(kind: str) -> bool:
    """Whether the service's module exists and can run with ``python -m``."""
    module = SERVICE_MODULES[kind]
    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{module}.__main__")
    except ImportError:
        return False
    return spec is not None


def available_services() -> list[str]:
    """The service kinds whose code exists in this checkout."""
    return [kind for kind in ALL_SERVICES if module_available(kind)]


def read_state(state_dir: Path) -> dict[str, Any] | None:
    path = state_dir / STATE_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if data.get("version") != STATE_VERSION:
        raise StackError(f"{path} has version {data.get('version')}, expected {STATE_VERSION}")
    return data


def stack_is_running(state: dict[str, Any] | None) -> bool:
    """Whether any process recorded in a stack.json document still runs."""
    comps = (state or {}).get("components", [])
    return any(procutil.pid_alive(c.get("pid"), c.get("start_time")) for c in comps)


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
    ) -> None:
        unknown = set(services) - set(ALL_SERVICES)
        if unknown:
            raise ValueError(f"unknown services {sorted(unknown)}; known: {list(ALL_SERVICES)}")
        if workers < 0 or index_shards < 1:
            raise ValueError("workers must be >= 0 and index_shards >= 1")
        self.state_dir = Path(state_dir).absolute()
        self.workers = workers
        self.index_shards = index_shards
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
        """Serialise supervisors acting on one state dir (two 'ragmesh up' at once)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / "stack.lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ credentials and env

    def _credentials(self) -> dict[str, str]:
        """The S3 identity of this stack, generated on first use and kept 0600 in the state dir."""
        path = self.state_dir / CREDENTIALS_FILE
        if path.exists():
            creds: dict[str, str] = json.loads(path.read_text())
            return creds
        creds = {"access_key": "rm" + secrets.token_hex(9).upper(), "secret_key": secrets.token_urlsafe(30)}
        procutil.write_json_atomic(path, creds, mode=0o600)
        return creds

    def _write_s3_config(self, creds: dict[str, str]) -> Path:
        if self.secrets is not None:
            path = self.state_dir / S3_CONFIG_FILE
            procutil.write_json_atomic(path, self.secrets.s3_config(), mode=0o600)
            return path
        config = {
            "identities": [
                {
                    "name": "ragmesh",
                    "credentials": [{"accessKey": creds["access_key"], "secretKey": creds["secret_key"]}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path = self.state_dir / S3_CONFIG_FILE
        procutil.write_json_atomic(path, config, mode=0o600)
        return path

    def client_env(self) -> dict[str, str]:
        """The RAGMESH_* settings a client (or an extra service) needs to reach this stack."""
        creds = self._credentials()
        env = {"RAGMESH_STATE_DIR": str(self.state_dir)}
        if NATS in self.components:
            env["RAGMESH_NATS_URL"] = f"nats://{self.address(NATS)}"
        if S3 in self.components:
            env["RAGMESH_S3_ENDPOINT"] = self.address(S3)
            env["RAGMESH_S3_ACCESS_KEY"] = creds["access_key"]
            env["RAGMESH_S3_SECRET_KEY"] = creds["secret_key"]
        if "embedder" in self.components:
            env["RAGMESH_EMBEDDER_ADDRESS"] = self.kind_address("embedder")
        shards = ["|".join(c.address for c in self.shard_replicas(i)) for i in range(self.index_shards)]
        if any(shards):
            env["RAGMESH_INDEX_ADDRESSES"] = ",".join(shards)
        if "sparse" in self.components:
            env["RAGMESH_SPARSE_ADDRESS"] = self.kind_address("sparse")
        if "ingestion" in self.components:
            env["RAGMESH_INGESTION_ADDRESS"] = self.address("ingestion")
        if "planner" in self.components:
            env["RAGMESH_PLANNER_ADDRESS"] = self.kind_address("planner")
        if "gateway" in self.components:
            env["RAGMESH_GATEWAY_ADDRESS"] = self.kind_address("gateway")
        # A stack without the reranker tier runs the gateway without one (no address, no degradation).
        env["RAGMESH_RERANKER_ADDRESS"] = self.kind_address("reranker")
        if "llm" in self.components:
            env["RAGMESH_LLM_BASE_URL"] = f"http://{self.address('llm')}/v1"
        for kind in ("extractor", "narrator"):
            if kind in self.components:
                env[f"RAGMESH_{kind.upper()}_ADDRESS"] = self.kind_address(kind)
        self._apply_identity(env, OPS)
        return env

    def shard_replicas(self, shard: int) -> list[Component]:
        """The replicas of index shard ``shard``, in replica order."""
        return [
            c
            for c in self.components.values()
            if c.kind == "index" and c.env.get("RAGMESH_INDEX_SHARD") == str(shard)
        ]

    def kind_address(self, kind: str) -> str:
        """Every replica of a kind, comma separated in replica order ('' when none runs)."""
        return ",".join(c.address for c in self.components.values() if c.kind == kind)

    def _process_env(self, comp: Component) -> dict[str, str]:
        # Caller's env first (its RAGMESH_* knobs reach the services), then the wiring, which must
        # win over stale addresses in the caller's env, then explicit overrides, then the
        # component's own ports and identity.
        env = dict(os.environ)
        env.update(self.client_env())
        env.update(self.extra_env)
        env.update(comp.env)
        env["PYTHONUNBUFFERED"] = "1"
        self._apply_identity(env, IDENTITY_OF_KIND.get(comp.kind))
        return env

    # ------------------------------------------------------------------ secure mode

    def _apply_identity(self, env: dict[str, str], identity: str | None) -> None:
        """In a secure stack, make ``env`` that of ``identity`` (certificate, keys, credentials);
        a process without one (NATS, S3, the LLM server) gets no credentials at all."""
        if self.secrets is None:
            return
        if identity is None:
            self.secrets.strip_env(env)
            return
        nats = self.address(NATS) if NATS in self.components else None
        self.secrets.apply_env(env, identity, nats)

    def api_key(self, name: str = OPS) -> str:
        """The plaintext API key ``name`` of a secure stack (``ops``, or a tenant of ``api_keys``)."""
        if self.secrets is None:
            raise StackError("this stack is not secure: it has no API keys")
        return self.secrets.api_key(name)

    def client_tls(self, identity: str = OPS) -> Any:
        """How this process reaches the stack's gRPC ports as ``identity`` (meshkit.tls.ClientTLS;
        None: plaintext)."""
        from meshkit.settings import MeshSettings
        from meshkit.tls import ClientTLS

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

    async def _ensure_buckets(self) -> None:
        """A secure stack's services may not create buckets: the supervisor (ops) does."""
        if self.secrets is None:
            return
        access, secret, ca = self._s3_endpoint_key()
        await asyncio.to_thread(_make_buckets, self.address(S3), access, secret, ca)

    # ------------------------------------------------------------------ topology

    def _service_specs(self) -> list[tuple[str, str, dict[str, str]]]:
        """(name, kind, own env) of every gRPC service process, in start order."""
        specs: list[tuple[str, str, dict[str, str]]] = []
        for kind in self.services:
            if kind == "index":
                count = str(self.index_shards)
                for i in range(self.index_shards):
                    for r in range(self.replicas.get(kind, 1)):
                        name = replica_name(f"index-{i}", r)
                        env = {
                            "RAGMESH_INDEX_SHARD": str(i),
                            "RAGMESH_INDEX_SHARD_COUNT": count,
                            "RAGMESH_INDEX_DATA_DIR": str(self.state_dir / name),
                        }
                        specs.append((name, kind, env))
            elif kind == "sparse":
                for r in range(self.replicas.get(kind, 1)):
                    name = replica_name(kind, r)
                    specs.append((name, kind, {"RAGMESH_SPARSE_DATA_DIR": str(self.state_dir / name)}))
            elif kind == "worker":
                specs += [
                    (f"worker-{i}", kind, {"RAGMESH_INGEST_WORKER_ID": f"worker-{i}"})
                    for i in range(self.workers)
                ]
            else:
                # The workers of one process share its port (fixed here, as they need).
                own = {"RAGMESH_WORKERS": str(self.processes[kind])} if kind in self.processes else {}
                specs += [(replica_name(kind, r), kind, dict(own)) for r in range(self.replicas.get(kind, 1))]
        return specs

    def _plan_names(self) -> list[str]:
        return [NATS, S3, *(name for name, _, _ in self._service_specs())]

    def _plan(self) -> dict[str, Component]:
        """Fresh components with newly chosen free ports."""
        taken: set[int] = set()
        s3_ports: dict[str, int] = {}
        for role in ("main", "master", "volume", "filer", "admin"):
            s3_ports[role], s3_ports[f"{role}_grpc"] = procutil.free_port_pair(taken)
        specs = self._service_specs()
        # Kernel-chosen ports come from the ephemeral range, disjoint from the pairs' range.
        ports = procutil.free_ports(2 + 2 * len(specs))
        comps = [
            Component(NATS, NATS, {"main": ports[0], "monitor": ports[1]}),
            Component(S3, S3, s3_ports),
        ]
        for i, (name, kind, env) in enumerate(specs):
            grpc_port, metrics_port = ports[2 + 2 * i], ports[3 + 2 * i]
            if kind in self.processes:
                # Worker w serves /metrics on metrics_port + w: a run of free ports.
                metrics_port = procutil.free_port_run(self.processes[kind], taken)
            env = {**env, "RAGMESH_PORT": str(grpc_port), "RAGMESH_METRICS_PORT": str(metrics_port)}
            comps.append(Component(name, kind, {"main": grpc_port, "metrics": metrics_port}, env))
        return {c.name: c for c in comps}

    def _argv(self, comp: Component) -> list[str]:
        if comp.kind == NATS:
            return [procutil.find_binary("nats-server"), "-c", str(self._write_nats_config(comp))]
        if comp.kind == S3:
            return self._weed_argv(comp)
        return [sys.executable, "-m", SERVICE_MODULES[comp.kind]]

    def _write_nats_config(self, comp: Component) -> Path:
        data = self.state_dir / "nats"
        data.mkdir(parents=True, exist_ok=True)
        secrets_ = self.secrets
        config = nats_config(
            comp.port,
            comp.ports["monitor"],
            data,
            tls=secrets_.server_tls("nats") if secrets_ is not None else None,
            passwords=secrets_.nats_passwords() if secrets_ is not None else None,
        )
        return write_nats_config(self.state_dir / NATS_CONFIG_FILE, config)

    def _weed_argv(self, comp: Component) -> list[str]:
        data = self.state_dir / "s3"
        data.mkdir(parents=True, exist_ok=True)
        config = self._write_s3_config(self._credentials())
        p = comp.ports
        argv = [
            procutil.find_binary("weed"),
            "mini",
            f"-dir={data}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            f"-s3.port={p['main']}",
            f"-s3.port.grpc={p['main_grpc']}",
            f"-s3.config={config}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin_grpc']}",
        ]
        if self.secrets is not None:
            # HTTPS on the S3 port itself: a plaintext client gets no answer it could use.
            tls = self.secrets.server_tls("s3")
            argv += [f"-s3.cert.file={tls.cert_file}", f"-s3.key.file={tls.key_file}"]
        # Keep weed's unix sockets with the stack rather than in /tmp (sun_path max is 108 bytes).
        if len(str(data)) < 80:
            argv += [f"-s3.localSocket={data}/s3.sock", f"-filer.localSocket={data}/filer.sock"]
        return argv

    # ------------------------------------------------------------------ health

    async def probe(self, comp: Component) -> str:
        """Health of one component: SERVING, NOT_SERVING..., UNREACHABLE."""
        if comp.kind == NATS:
            return await _probe_nats(comp.ports["monitor"])
        if comp.kind == S3:
            access, secret, ca = self._s3_endpoint_key()
            return await asyncio.to_thread(_probe_s3, comp.address, access, secret, ca)
        if comp.kind in HTTP_HEALTH_PATHS:
            return await _probe_http(f"http://{comp.address}{HTTP_HEALTH_PATHS[comp.kind]}")
        from meshkit.client import check_health

        return await check_health(comp.address, timeout=1.0, tls=self.client_tls())

    def _exit_code(self, comp: Component) -> int | None:
        """The exit code if the component's process is known to have ended, else None."""
        proc = self._procs.get(comp.name)
        if proc is not None and proc.pid == comp.pid:
            return proc.poll()
        return None if procutil.pid_alive(comp.pid, comp.start_time) else -1

    async def _wait_healthy(self, comp: Component) -> None:
        deadline = time.monotonic() + self.health_timeout_s
        health = UNREACHABLE
        while True:
            code = self._exit_code(comp)
            if code is not None:
                exit_desc = "" if code == -1 else f" with code {code}"
                raise StackError(
                    f"{comp.name} exited{exit_desc} before becoming healthy; "
                    f"log {self.log_path(comp.name)}:\n{procutil.tail(self.log_path(comp.name))}"
                )
            health = await self.probe(comp)
            if health == SERVING:
                return
            if time.monotonic() >= deadline:
                raise StackError(
                    f"{comp.name} not healthy after {self.health_timeout_s:.0f}s (last: {health}); "
                    f"log {self.log_path(comp.name)}:\n{procutil.tail(self.log_path(comp.name))}"
                )
            await asyncio.sleep(0.2)

    async def _check_s3_refuses_wrong_key(self) -> None:
        """Without a working credentials config SeaweedFS accepts any key: refuse to run that way."""
        ca = self.secrets.pki.ca_cert if self.secrets is not None else None
        outcome = await asyncio.to_thread(s3_wrong_key_outcome, self.address(S3), ca)
        if outcome not in REFUSED_KEY_CODES:
            raise StackError(
                f"S3 did not refuse a wrong key (got {outcome}): its auth config is not in effect"
            )

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
            running = self._adopt_running()
            if running:
                statuses = await self.status_async()
                if all(s.health == SERVING for s in statuses):
                    return (
                        f"stack already running and healthy ({len(statuses)} processes) in {self.state_dir}"
                    )
            else:
                self.components = self._plan()
            if self.secrets is not None:
                self.secrets.prepare()
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
            *(self.probe(c) if a else _down() for c, a in zip(comps, alive, strict=True))
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


async def _down() -> str:
    return DOWN


async def _probe_nats(monitor_port: int) -> str:
    return await _probe_http(f"http://{LOOPBACK}:{monitor_port}/healthz?js-enabled-only=true")


async def _probe_http(url: str) -> str:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=1.0) as client:
            reply = await client.get(url)
    except httpx.HTTPError:
        return UNREACHABLE
    return SERVING if reply.status_code == 200 else f"NOT_SERVING ({reply.status_code})"


def _s3_client(endpoint: str, access_key: str, secret_key: str, ca: Path | None = None) -> Any:
    """A minio client for the stack's S3 (HTTPS verified against ``ca`` when given)."""
    import urllib3
    from minio import Minio

    # No retries and short timeouts: a probe must answer quickly whatever the server's state.
    verify: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED", "ca_certs": str(ca)} if ca is not None else {}
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1.0, read=2.0), retries=False, **verify)
    return Minio(
        endpoint, access_key=access_key, secret_key=secret_key, secure=ca is not None, http_client=http
    )


def _make_buckets(endpoint: str, access_key: str, secret_key: str, ca: Path | None) -> None:
    from minio.error import S3Error

    client = _s3_client(endpoint, access_key, secret_key, ca)
    for bucket in BUCKETS:
        try:
            if not client.bucket_exists(bucket):
                client.make_bucket(bucket)
        except S3Error as exc:
            if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise StackError(f"could not create the bucket {bucket}: {exc.code}") from None


def _probe_s3(endpoint: str, access_key: str, secret_key: str, ca: Path | None = None) -> str:
    from minio.error import S3Error

    try:
        _s3_client(endpoint, access_key, secret_key, ca).list_buckets()
    except S3Error as exc:
        return f"NOT_SERVING ({exc.code})"
    except Exception:
        return UNREACHABLE
    return SERVING


def s3_wrong_key_outcome(endpoint: str, ca: Path | None = None) -> str:
    """What S3 says to a made-up key: an error code, 'ACCEPTED', or the exception's type."""
    from minio.error import S3Error

    try:
        _s3_client(endpoint, "rm-wrong-" + secrets.token_hex(4), secrets.token_hex(16), ca).list_buckets()
    except S3Error as exc:
        return str(exc.code)
    except Exception as exc:
        return type(exc).__name__
    return "ACCEPTED"
