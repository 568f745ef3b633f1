"""What the local stack runs: service kinds, their start stages, how they scale, the components
recorded in stack.json, and the topology (names, own env and ports) of a given shape."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from meshkit.domain.ids import sparse_shard_name
from ragmesh_cli import procutil
from ragmesh_cli.procutil import LOOPBACK

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


# ---------------------------------------------------------------------------- topology


@dataclass(frozen=True)
class Shape:
    """How many of what a stack runs (validated by Stack): its topology follows from this alone."""

    state_dir: Path
    services: Sequence[str]
    workers: int
    index_shards: int
    # Kind -> processes, only the kinds with more than one.
    replicas: Mapping[str, int]
    processes: Mapping[str, int]
    sparse_shards: int = 1


def service_specs(shape: Shape) -> list[tuple[str, str, dict[str, str]]]:
    """(name, kind, own env) of every gRPC service process, in start order."""
    specs: list[tuple[str, str, dict[str, str]]] = []
    for kind in shape.services:
        if kind == "index":
            count = str(shape.index_shards)
            for i in range(shape.index_shards):
                for r in range(shape.replicas.get(kind, 1)):
                    name = replica_name(f"index-{i}", r)
                    env = {
                        "RAGMESH_INDEX_SHARD": str(i),
                        "RAGMESH_INDEX_SHARD_COUNT": count,
                        "RAGMESH_INDEX_DATA_DIR": str(shape.state_dir / name),
                    }
                    specs.append((name, kind, env))
        elif kind == "sparse":
            for i in range(shape.sparse_shards):
                for r in range(shape.replicas.get(kind, 1)):
                    name = replica_name(sparse_shard_name(i, shape.sparse_shards), r)
                    env = {
                        "RAGMESH_SPARSE_SHARD": str(i),
                        "RAGMESH_SPARSE_SHARD_COUNT": str(shape.sparse_shards),
                        "RAGMESH_SPARSE_DATA_DIR": str(shape.state_dir / name),
                    }
                    specs.append((name, kind, env))
        elif kind == "worker":
            specs += [
                (f"worker-{i}", kind, {"RAGMESH_INGEST_WORKER_ID": f"worker-{i}"})
                for i in range(shape.workers)
            ]
        else:
            # The workers of one process share its port (fixed here, as they need).
            own = {"RAGMESH_WORKERS": str(shape.processes[kind])} if kind in shape.processes else {}
            specs += [(replica_name(kind, r), kind, dict(own)) for r in range(shape.replicas.get(kind, 1))]
    return specs


def plan_names(shape: Shape) -> list[str]:
    """Every component name of the shape: NATS, S3, then the services in start order."""
    return [NATS, S3, *(name for name, _, _ in service_specs(shape))]


def plan(shape: Shape) -> dict[str, Component]:
    """Fresh components with newly chosen free ports."""
    taken: set[int] = set()
    s3_ports: dict[str, int] = {}
    for role in ("main", "master", "volume", "filer", "admin"):
        s3_ports[role], s3_ports[f"{role}_grpc"] = procutil.free_port_pair(taken)
    specs = service_specs(shape)
    # Kernel-chosen ports come from the ephemeral range, disjoint from the pairs' range.
    ports = procutil.free_ports(2 + 2 * len(specs))
    comps = [
        Component(NATS, NATS, {"main": ports[0], "monitor": ports[1]}),
        Component(S3, S3, s3_ports),
    ]
    for i, (name, kind, env) in enumerate(specs):
        grpc_port, metrics_port = ports[2 + 2 * i], ports[3 + 2 * i]
        if kind in shape.processes:
            # Worker w serves /metrics on metrics_port + w: a run of free ports.
            metrics_port = procutil.free_port_run(shape.processes[kind], taken)
        env = {**env, "RAGMESH_PORT": str(grpc_port), "RAGMESH_METRICS_PORT": str(metrics_port)}
        comps.append(Component(name, kind, {"main": grpc_port, "metrics": metrics_port}, env))
    return {c.name: c for c in comps}


def shard_replicas(components: Mapping[str, Component], shard: int, kind: str = "index") -> list[Component]:
    """The replicas of shard ``shard`` of a sharded store (index or sparse), in replica order."""
    return [c for c in components.values() if c.kind == kind and shard_number(c) == shard]


def shard_number(component: Component) -> int:
    # A sparse replica recorded before sparse was sharded carries no number: it is shard 0.
    return int(component.env.get(f"RAGMESH_{component.kind.upper()}_SHARD", "0"))


def sharded_address(components: Mapping[str, Component], kind: str) -> str:
    """``a|b,c|d``: the shards of a store in order, the replicas of each separated by |."""
    shards = sorted({shard_number(c) for c in components.values() if c.kind == kind})
    return ",".join("|".join(c.address for c in shard_replicas(components, i, kind)) for i in shards)


def kind_address(components: Mapping[str, Component], kind: str) -> str:
    """Every replica of a kind, comma separated in replica order ('' when none runs)."""
    return ",".join(c.address for c in components.values() if c.kind == kind)


def wiring_env(
    components: Mapping[str, Component], index_shards: int, s3_keys: Mapping[str, str]
) -> dict[str, str]:
    """The RAGMESH_* addresses of the stack's components (and its S3 key), as a client or a service
    needs them."""
    env: dict[str, str] = {}

    def address(name: str) -> str:
        return components[name].address

    if NATS in components:
        env["RAGMESH_NATS_URL"] = f"nats://{address(NATS)}"
    if S3 in components:
        env["RAGMESH_S3_ENDPOINT"] = address(S3)
        env["RAGMESH_S3_ACCESS_KEY"] = s3_keys["access_key"]
        env["RAGMESH_S3_SECRET_KEY"] = s3_keys["secret_key"]
    if "embedder" in components:
        env["RAGMESH_EMBEDDER_ADDRESS"] = kind_address(components, "embedder")
    shards = ["|".join(c.address for c in shard_replicas(components, i)) for i in range(index_shards)]
    if any(shards):
        env["RAGMESH_INDEX_ADDRESSES"] = ",".join(shards)
    sparse = sharded_address(components, "sparse")
    if sparse:
        env["RAGMESH_SPARSE_ADDRESSES"] = sparse
    if "ingestion" in components:
        env["RAGMESH_INGESTION_ADDRESS"] = address("ingestion")
    if "planner" in components:
        env["RAGMESH_PLANNER_ADDRESS"] = kind_address(components, "planner")
    if "gateway" in components:
        env["RAGMESH_GATEWAY_ADDRESS"] = kind_address(components, "gateway")
    # A stack without the reranker tier runs the gateway without one (no address, no degradation).
    env["RAGMESH_RERANKER_ADDRESS"] = kind_address(components, "reranker")
    if "llm" in components:
        env["RAGMESH_LLM_BASE_URL"] = f"http://{address('llm')}/v1"
    for kind in ("extractor", "narrator"):
        if kind in components:
            env[f"RAGMESH_{kind.upper()}_ADDRESS"] = kind_address(components, kind)
    return env
