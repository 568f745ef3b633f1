"""Downstream addresses as operators write them, turned into one gRPC target per stage.

An address setting holds one of:

- ``host:port``: one server, or a DNS name; gRPC's default resolver is DNS, so a name that
  resolves to several addresses (a headless Service) is balanced over all of them;
- a comma separated list of IP literals, ``127.0.0.1:5001,127.0.0.1:5002``: replicas of the
  stage, turned into ``ipv4:127.0.0.1:5001,127.0.0.1:5002`` (``ipv6:`` for ``[::1]:5001`` lists);
- a target that already names its resolver, ``dns:///reranker-headless:50057``, passed as is.

With the ``round_robin`` policy the client sets (meshkit.rpc.client.channel_options), calls spread
over every address of the target and skip the ones that are down.
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
