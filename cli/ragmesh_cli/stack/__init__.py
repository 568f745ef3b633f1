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
the comma separated list, which meshkit.rpc.client balances round-robin. ``processes`` runs a kind as
N pre-fork workers behind one port (RAGMESH_WORKERS, meshkit.rpc.prefork).

Secure (``secure=True``, ``ragmesh up --secure``; docs/SECURITY.md): API keys on the gateway and
the ingestion API, mTLS with one identity per service on every gRPC hop, NATS over TLS with a user
and permissions per service, SeaweedFS over HTTPS with an S3 key per service limited to its
buckets (ragmesh_cli.secure). ``client_env`` then holds the ``ops`` identity; ``api_key(name)``
gives a tenant's key (``api_keys`` grants tenants collections).

NATS runs from a generated configuration file (ragmesh_cli.natsconf) that makes its durability
explicit: JetStream fsyncs before it acknowledges.

The stateful stores take ``replicas`` too: ``{"index": 2, "sparse": 2}`` runs every index shard and
the sparse store as two replicas that stay identical through their replicated log in NATS
(meshkit.replication.log), each with a data dir of its own (``<state_dir>/<component name>``): "index-0",
"index-0-2", "index-1", ...; "sparse", "sparse-2" (one sparse shard) or "sparse-0", "sparse-0-2",
"sparse-1", ... (``sparse_shards``). Callers get ``a|b`` per shard in RAGMESH_INDEX_ADDRESSES and
RAGMESH_SPARSE_ADDRESSES.

Every public method has a sync form and an ``*_async`` form; the sync ones use
``asyncio.run`` and so must not be called from a running event loop.

Modules: ``spec`` (kinds, components, topology of a shape), ``files`` (S3 credentials and config,
NATS config, the infrastructure's command lines), ``readiness`` (health probes), ``supervisor``
(``Stack``); the state file is read by ragmesh_cli.state, which every command uses. The names
below are the package's interface (``from ragmesh_cli.stack import Stack``).
"""

from __future__ import annotations

from ragmesh_cli.stack.files import CREDENTIALS_FILE, NATS_CONFIG_FILE, S3_CONFIG_FILE
from ragmesh_cli.stack.readiness import DOWN, REFUSED_KEY_CODES, SERVING, UNREACHABLE, s3_wrong_key_outcome
from ragmesh_cli.stack.spec import (
    ALL_SERVICES,
    NATS,
    REPLICATED_KINDS,
    S3,
    SERVICE_MODULES,
    STAGE_OF_KIND,
    STATELESS_KINDS,
    Component,
    ProcessStatus,
    available_services,
    check_scale,
    module_available,
    parse_counts,
    parse_workers,
    replica_name,
)
from ragmesh_cli.stack.supervisor import Stack
from ragmesh_cli.state import STATE_FILE, STATE_VERSION, StackError, read_state, stack_is_running

__all__ = [
    "ALL_SERVICES",
    "CREDENTIALS_FILE",
    "DOWN",
    "NATS",
    "NATS_CONFIG_FILE",
    "REFUSED_KEY_CODES",
    "REPLICATED_KINDS",
    "S3",
    "S3_CONFIG_FILE",
    "SERVICE_MODULES",
    "SERVING",
    "STAGE_OF_KIND",
    "STATELESS_KINDS",
    "STATE_FILE",
    "STATE_VERSION",
    "UNREACHABLE",
    "Component",
    "ProcessStatus",
    "Stack",
    "StackError",
    "available_services",
    "check_scale",
    "module_available",
    "parse_counts",
    "parse_workers",
    "read_state",
    "replica_name",
    "s3_wrong_key_outcome",
    "stack_is_running",
]
