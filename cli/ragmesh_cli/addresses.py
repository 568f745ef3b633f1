"""How every command finds a service: the RAGMESH_*_ADDRESS override, else the running stack's
record (every replica), else the settings' default, as one gRPC target."""

from __future__ import annotations

import os
from pathlib import Path

from meshkit.rpc.addresses import grpc_target
from meshkit.settings import MeshSettings
from ragmesh_cli.state import read_state


def address_env(component: str) -> str:
    """The environment variable that overrides a component's address."""
    return "RAGMESH_INDEX_ADDRESSES" if component == "index" else f"RAGMESH_{component.upper()}_ADDRESS"


def resolve_address(component: str, state_dir: Path) -> str:
    """The env override, else the running stack's record, else the settings' default, as a gRPC
    target over every replica (balanced round-robin). The index is its first shard (with its
    replicas)."""
    override = os.environ.get(address_env(component), "")
    override = first_shard(override) if component == "index" else override
    if override.strip():
        return grpc_target(override)
    name = "index-0" if component == "index" else component
    replicas = [
        f"127.0.0.1:{comp['ports']['main']}"
        for comp in (read_state(state_dir) or {}).get("components", [])
        if comp["name"] == name or (component != "index" and comp.get("kind") == component)
    ]
    if replicas:
        return grpc_target(",".join(replicas))
    field_name = "index_addresses" if component == "index" else f"{component}_address"
    default = MeshSettings.model_fields.get(field_name)
    if default is None:
        raise RuntimeError(f"no {component} address: start the stack or set {address_env(component)}")
    value = str(default.default)
    return grpc_target(first_shard(value) if component == "index" else value)


def first_shard(index_addresses: str) -> str:
    """Shard 0 of an index_addresses setting, its replicas (a|b) as a comma list."""
    first = index_addresses.split(",")[0]
    return ",".join(r.strip() for r in first.split("|") if r.strip())
