"""NetworkPolicy semantics for deploy/k8s/check_manifests.py, evaluated as Kubernetes does:
label selectors, peers (pods, namespaces, IP blocks), ports by number or name, and whether the
policies of a namespace admit one connection (``Policies``)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from manifest_objects import External, Pod, Rendered


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if (
            (op == "In" and (not present or labels[key] not in values))
            or (op == "NotIn" and present and labels[key] in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


def _peer_matches(peer: Mapping[str, Any], policy_ns: Mapping[str, str], other: Pod | External) -> bool:
    if "ipBlock" in peer:
        # Conservative: an ipBlock may match pod addresses too (CNI-dependent).
        block = peer["ipBlock"]
        if isinstance(other, External) and other.ip is not None:
            address = ipaddress.ip_address(other.ip)
            net = ipaddress.ip_network(block["cidr"])
            if address.version != net.version or address not in net:
                return False
            return not any(
                address in ipaddress.ip_network(e)
                for e in block.get("except") or []
                if ipaddress.ip_network(e).version == address.version
            )
        return True
    pod = other.pod if isinstance(other, External) else other
    if pod is None:
        return False  # an address is matched by ipBlocks only
    ns_selector = peer.get("namespaceSelector")
    if ns_selector is None:
        if pod.namespace_labels != policy_ns:
            return False
    elif not selects(ns_selector, pod.namespace_labels):
        return False
    pod_selector = peer.get("podSelector")
    return pod_selector is None or selects(pod_selector, pod.labels)


def _rule_allows(
    rule: Mapping[str, Any],
    peers_key: str,
    ns: Mapping[str, str],
    other: Pod | External,
    port: int,
    port_names: Mapping[str, int],
) -> bool:
    peers = rule.get(peers_key)
    if peers and not any(_peer_matches(p, ns, other) for p in peers):
        return False
    ports = rule.get("ports")
    return not ports or any(_port_matches(p, port, port_names) for p in ports)


def _port_matches(spec: Mapping[str, Any], port: int, port_names: Mapping[str, int]) -> bool:
    """`port_names`: the destination pod's named container ports (a policy may name a port)."""
    if "port" not in spec:
        return True
    value = spec["port"]
    low = int(value) if str(value).isdigit() else port_names.get(str(value), -1)
    high = int(spec.get("endPort", low))
    return low <= port <= high


def _port_names(pod: Pod | External) -> dict[str, int]:
    target = pod.pod if isinstance(pod, External) else pod
    if target is None:
        return {}
    return {
        p["name"]: int(p["containerPort"])
        for c in target.spec.get("containers", [])
        for p in c.get("ports", [])
        if "name" in p
    }


class Policies:
    def __init__(self, rendered: Rendered) -> None:
        self.items = rendered.of("NetworkPolicy")
        self.ns = rendered.namespace_labels

    def _selecting(self, pod: Pod, direction: str) -> list[dict[str, Any]]:
        if not pod.in_namespace:
            return []
        out = []
        for p in self.items:
            spec = p["spec"]
            types = spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])
            if direction in types and selects(spec.get("podSelector", {}), pod.labels):
                out.append(spec)
        return out

    def isolated(self, pod: Pod, direction: str) -> bool:
        return bool(self._selecting(pod, direction))

    def ingress_allows(self, dst: Pod, src: Pod | External, port: int) -> bool:
        specs = self._selecting(dst, "Ingress")
        if not specs:
            return True
        names = _port_names(dst)
        return any(
            _rule_allows(r, "from", self.ns, src, port, names) for s in specs for r in s.get("ingress") or []
        )

    def egress_allows(self, src: Pod, dst: Pod | External, port: int) -> bool:
        if not src.in_namespace:
            return True  # outside the namespace: not ours to restrict
        specs = self._selecting(src, "Egress")
        if not specs:
            return True
        names = _port_names(dst)
        return any(
            _rule_allows(r, "to", self.ns, dst, port, names) for s in specs for r in s.get("egress") or []
        )

    def connects(self, src: Pod | External, dst: Pod | External, port: int) -> bool:
        src_ok = self.egress_allows(src, dst, port) if isinstance(src, Pod) else True
        dst_ok = self.ingress_allows(dst, src, port) if isinstance(dst, Pod) else True
        return src_ok and dst_ok
