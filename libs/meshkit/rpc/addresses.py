"""Downstream addresses as operators write them, turned into one gRPC target per stage.

An address setting holds one of:

- ``host:port``: one server, or a DNS name; gRPC's default resolver is DNS, so a name that
  resolves to several addresses (a headless Service) is balanced over all of them;
- a comma separated list of IP literals, ``127.0.0.1:5001,127.0.0.1:5002``: replicas of the
  stage, turned into ``ipv4:127.0.0.1:5001,127.0.0.1:5002`` (``ipv6:`` for ``[::1]:5001`` lists);
- a target that already names its resolver, ``dns:///reranker-headless:50057``, passed as is.

How calls spread over the replicas depends on the form (meshkit.rpc.client.Downstream):

- a comma list of two or more IP literals is balanced by the client itself
  (meshkit.rpc.balancer): one channel per replica (``replica_targets``), each call to the replica
  with the fewest calls in flight, slow or failing replicas ejected for a while. The client can do
  this because it sees every replica;
- a DNS name, one address, or a target with a scheme (``dns:///...``, ``ipv4:a,b``) is one channel
  with gRPC's ``round_robin`` policy (meshkit.rpc.client.channel_options): calls spread over every
  address the target resolves to and skip the ones that are down. The pods behind a headless
  Service's name are known only to gRPC's resolver, which re-resolves as pods come and go; the
  client cannot count calls per pod without a resolver of its own, so a name keeps gRPC's balancing.
  Writing ``ipv4:`` before a list keeps a static list on gRPC's round-robin too.
"""

from __future__ import annotations

import ipaddress

# Resolver schemes gRPC understands; a target starting with one is passed through untouched.
GRPC_SCHEMES = frozenset({"dns", "ipv4", "ipv6", "unix", "unix-abstract", "vsock", "xds", "google-c2p"})


def has_scheme(address: str) -> bool:
    scheme, sep, _ = address.partition(":")
    return bool(sep) and scheme.lower() in GRPC_SCHEMES


def split_addresses(address: str) -> list[str]:
    """The non-empty, stripped entries of a comma separated address list."""
    return [part.strip() for part in address.split(",") if part.strip()]


def _host_port(entry: str) -> tuple[str, str]:
    if entry.startswith("["):
        host, sep, port = entry[1:].partition("]:")
    else:
        host, sep, port = entry.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {entry!r} is not host:port")
    return host, port


def _ip_version(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


def grpc_target(address: str) -> str:
    """One gRPC channel target for an address setting (see the module docstring).

    Raises ValueError for an empty setting, an entry that is not host:port, or a list that mixes
    names or IP families (gRPC has no target for a list of names: use one DNS name instead)."""
    address = address.strip()
    if has_scheme(address):
        return address
    entries = split_addresses(address)
    if not entries:
        raise ValueError("empty address: give host:port, a comma separated list of them, or dns:///name:port")
    hosts = [_host_port(entry) for entry in entries]
    if len(entries) == 1:
        return entries[0]
    versions = {_ip_version(host) for host, _ in hosts}
    if versions == {4}:
        return "ipv4:" + ",".join(entries)
    if versions == {6}:
        return "ipv6:" + ",".join(f"[{host}]:{port}" for host, port in hosts)
    raise ValueError(
        f"address list {address!r}: a list must hold IP literals of one family (127.0.0.1:5001,"
        "127.0.0.1:5002); for replicas behind a name use one DNS name that resolves to all of them "
        "(e.g. dns:///reranker-headless:50057)"
    )


def replica_targets(address: str) -> list[tuple[str, str]]:
    """(replica address, its own gRPC target) for each replica of a comma list of two or more IP
    literals, which the client balances itself; [] for every other form (one channel balanced by
    gRPC: a DNS name, one address, a target with a scheme). Raises ValueError as grpc_target does."""
    target = grpc_target(address)
    if has_scheme(address.strip()) or not target.startswith(("ipv4:", "ipv6:")):
        return []
    scheme = target.partition(":")[0]
    return [(entry, f"{scheme}:{entry}") for entry in target.partition(":")[2].split(",")]
