"""How every command finds a service: the RAGMESH_*_ADDRESS override, else the running stack's
record (every replica), else the settings' default, as one gRPC target."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from meshkit.rpc.addresses import grpc_target
from meshkit.settings import MeshSettings
from ragmesh_cli.state import read_state

# The stores whose address setting lists shards (a|b,c): a command reaches their first shard.
SHARDED = {"index": "index_addresses", "sparse": "sparse_addresses"}


def address_env(component: str) -> str:
    """The environment variable that overrides a component's address."""
    field_name = SHARDED.get(component, f"{component}_address")
    return f"RAGMESH_{field_name.upper()}"


def resolve_address(component: str, state_dir: Path) -> str:
    """The env override, else the running stack's record, else the settings' default, as a gRPC
    target over every replica (balanced round-robin). A sharded store (index, sparse) is its
    first shard (with its replicas)."""
    sharded = component in SHARDED
    override = os.environ.get(address_env(component), "")
    override = first_shard(override) if sharded else override
    if override.strip():
        return grpc_target(override)
    replicas = [
        f"127.0.0.1:{comp['ports']['main']}"
        for comp in (read_state(state_dir) or {}).get("components", [])
        if comp.get("kind", comp["name"]) == component and _first_shard_replica(comp, sharded)
    ]
    if replicas:
        return grpc_target(",".join(replicas))
    default = MeshSettings.model_fields.get(SHARDED.get(component, f"{component}_address"))
    if default is None:
        raise RuntimeError(f"no {component} address: start the stack or set {address_env(component)}")
    value = str(default.default)
    return grpc_target(first_shard(value) if sharded else value)


def _first_shard_replica(component: dict[str, Any], sharded: bool) -> bool:
    kind = str(component.get("kind", component["name"]))
    return not sharded or component.get("env", {}).get(f"RAGMESH_{kind.upper()}_SHARD", "0") == "0"


def first_shard(index_addresses: str) -> str:
    """Shard 0 of an index_addresses (or sparse_addresses) setting, its replicas (a|b) as a comma
    list."""
    first = index_addresses.split(",")[0]
    return ",".join(r.strip() for r in first.split("|") if r.strip())
