"""Offline checks that a rendered overlay is closed by default (deploy/k8s/validate.sh runs this on
every overlay; any finding fails it).

    kubectl kustomize deploy/k8s/overlays/gpu > gpu.yaml
    python deploy/k8s/check_manifests.py gpu.yaml

What must hold (docs: deploy/k8s/README.md "Security"):

* **Edge**: a LoadBalancer or NodePort Service (or an Ingress) reaches only pods that serve TLS
  and require API keys; no pod uses the host's network or ports.
* **Network**: every pod is isolated for ingress and egress; the NetworkPolicies admit exactly the
  call graph below between ragmesh's pods (each needed connection allowed, no other); from
  outside the namespace only clients to the public faces' gRPC port and Prometheus to metrics
  ports; out of the namespace only DNS. So the LLM tier, which reads untrusted text, reaches
  nothing but (on GPU) the object store for its weights.
* **Mesh identity**: every ragmesh gRPC server runs with RAGMESH_SERVICE_AUTH=mtls and all the
  TLS settings, pointing into its own Secret ragmesh-tls-<identity>; its probes can pass mTLS
  (no kubelet `grpc:` probe).
* **Credentials**: no Secret is rendered with a placeholder; every Secret referred to is one
  make_secrets.py makes, with the keys used; a pod gets only its own NATS and S3 users; MinIO's
  root user only reaches MinIO and the bootstrap Job.
* **NATS**: at least 3 servers, all routed, spread over nodes, a disruption budget that keeps a
  quorum, TLS and users in its configuration, an explicit sync interval, streams replicated
  (RAGMESH_NATS_STREAM_REPLICAS) on that many servers, clients on tls://; MinIO over HTTPS.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import ipaddress
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent

GRPC = 50051
OPS = "ragmesh-ops"
BOOTSTRAP = "ragmesh-bootstrap"
PUBLIC = ("gateway", "ingestion")
METRICS_PORTS = frozenset({9090, 8222, 9000, 8000})


@functools.cache
def _make_secrets() -> Any:
    # make_secrets.py is a standalone script (operators run it without the project installed).
    spec = importlib.util.spec_from_file_location("ragmesh_make_secrets", HERE / "make_secrets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ragmesh_make_secrets", module)
    spec.loader.exec_module(module)
    return module


def _catalogue() -> dict[str, tuple[str, ...]]:
    return {s.name: s.keys for s in _make_secrets().catalogue()}


def stages() -> tuple[str, ...]:
    """The mesh's workloads: one identity (certificate) each, as make_secrets.py issues them."""
    return tuple(_make_secrets().IDENTITIES)


def _calls() -> frozenset[tuple[str, str, int]]:
    calls = {
        ("gateway", s, GRPC)
        for s in ("planner", "embedder", "index", "sparse", "reranker", "extractor", "narrator")
    }
    calls |= {("extractor", "embedder", GRPC)}
    calls |= {("ingestion-worker", s, GRPC) for s in ("embedder", "index", "sparse")}
    calls |= {(s, "llm", 8000) for s in ("planner", "extractor", "narrator")}
    calls |= {(s, "nats", 4222) for s in ("ingestion", "ingestion-worker", "index", "sparse", BOOTSTRAP)}
    # The gateway reads collection records (embedder, serving generation; meshkit.collections).
    calls |= {("gateway", "nats", 4222)}
    calls |= {("nats", "nats", 6222)}
    calls |= {
        (s, "minio", 9000)
        for s in ("ingestion", "ingestion-worker", "index", "sparse", "reranker", BOOTSTRAP)
    }
    calls |= {(OPS, s, GRPC) for s in stages()}
    return frozenset(calls)


# Who calls whom (team.md): (caller, callee, port), by app.kubernetes.io/name.
CALLS = _calls()
# Allowed where an overlay needs it: vLLM fetching its weights from the object store.
OPTIONAL_CALLS = frozenset({("llm", "minio", 9000)})
TLS_SETTINGS = (
    "RAGMESH_TLS_CERT_FILE",
    "RAGMESH_TLS_KEY_FILE",
    "RAGMESH_TLS_CLIENT_CA_FILE",
    "RAGMESH_TLS_CA_FILE",
    "RAGMESH_TLS_CLIENT_CERT_FILE",
    "RAGMESH_TLS_CLIENT_KEY_FILE",
)
PLACEHOLDER = re.compile(r"replace[-_]?me|changeme|placeholder", re.IGNORECASE)
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet")


# ---------------------------------------------------------------------------- the rendered objects


@dataclass
class Pod:
    """A pod template (or a hypothetical pod used as a probe of the policies)."""

    name: str  # app.kubernetes.io/name, or a description for hypothetical pods
    labels: dict[str, str]
    namespace_labels: dict[str, str]
    spec: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    in_namespace: bool = True

    @property
    def ports(self) -> set[int]:
        return {
            int(p["containerPort"])
            for c in self.spec.get("containers", [])
            for p in c.get("ports", [])
            if "containerPort" in p
        }

    def containers(self) -> list[dict[str, Any]]:
        return list(self.spec.get("initContainers", [])) + list(self.spec.get("containers", []))


@dataclass(frozen=True)
class External:
    """A source or destination outside ragmesh's pods: an address, or a pod elsewhere."""

    name: str
    ip: str | None = None
    pod: Pod | None = None


class Rendered:
    def __init__(self, docs: Iterable[dict[str, Any]]) -> None:
        self.docs = [d for d in docs if isinstance(d, dict)]
        self.namespace = next((d["metadata"]["name"] for d in self.of("Namespace")), "ragmesh")
        ns: dict[str, Any] = next((d for d in self.of("Namespace")), {"metadata": {}})
        self.namespace_labels = {
            **(ns["metadata"].get("labels") or {}),
            "kubernetes.io/metadata.name": self.namespace,
        }
        self.configmaps = {d["metadata"]["name"]: d.get("data") or {} for d in self.of("ConfigMap")}
        self.pods = [self._pod(w) for w in self.docs if w.get("kind") in WORKLOAD_KINDS]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("kind") == kind]

    def _pod(self, workload: dict[str, Any]) -> Pod:
        template = workload["spec"]["template"]
        labels = dict(template.get("metadata", {}).get("labels") or {})
        name = labels.get("app.kubernetes.io/name", workload["metadata"]["name"])
        return Pod(name, labels, self.namespace_labels, template.get("spec") or {}, workload)

    def env(self, container: Mapping[str, Any]) -> dict[str, str]:
        """A container's environment as far as the render says: ConfigMap values resolved,
        Secret values as `<secret NAME>`."""
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                env.update(self.configmaps.get(source["configMapRef"]["name"], {}))
            elif "secretRef" in source:
                for spec in _catalogue().get(source["secretRef"]["name"], ()):
                    env[spec] = f"<secret {source['secretRef']['name']}>"
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif "secretKeyRef" in (item.get("valueFrom") or {}):
                env[item["name"]] = f"<secret {item['valueFrom']['secretKeyRef']['name']}>"
            elif "configMapKeyRef" in (item.get("valueFrom") or {}):
                ref = item["valueFrom"]["configMapKeyRef"]
                env[item["name"]] = self.configmaps.get(ref["name"], {}).get(ref["key"], "")
            else:
                env[item["name"]] = "<field>"
        return env


# ---------------------------------------------------------------------------- NetworkPolicy semantics


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


# ---------------------------------------------------------------------------- the checks


def _hypothetical(name: str, labels: dict[str, str], namespace: dict[str, str], *, in_namespace: bool) -> Pod:
    return Pod(name, labels, namespace, in_namespace=in_namespace)


def check_network(r: Rendered) -> list[str]:
    findings: list[str] = []
    policies = Policies(r)
    ops = _hypothetical(
        OPS,
        {"app.kubernetes.io/name": OPS, "app.kubernetes.io/part-of": "ragmesh"},
        r.namespace_labels,
        in_namespace=True,
    )
    pods = [*r.pods, ops]
    names = {p.name for p in pods}
    for pod in r.pods:
        for direction in ("Ingress", "Egress"):
            if not policies.isolated(pod, direction):
                findings.append(
                    f"network: pod {pod.name} is not isolated for {direction.lower()} (no policy selects it)"
                )
    # Between ragmesh's pods: exactly the call graph.
    for src in pods:
        for dst in pods:
            for port in sorted(dst.ports):
                allowed = policies.connects(src, dst, port)
                edge = (src.name, dst.name, port)
                if allowed and edge not in CALLS and edge not in OPTIONAL_CALLS:
                    findings.append(
                        f"network: {src.name} may connect to {dst.name}:{port}, outside the call graph"
                    )
    for src_name, dst_name, port in sorted(CALLS):
        if src_name in names and dst_name in names:
            src = next(p for p in pods if p.name == src_name)
            dst = next(p for p in pods if p.name == dst_name)
            if port in dst.ports and not policies.connects(src, dst, port):
                findings.append(f"network: {src_name} cannot reach {dst_name}:{port}, which it calls")
    # From outside ragmesh's pods.
    published = {p.name for svc in _exposed(r) for p in _selected(r, svc)}
    elsewhere = {"kubernetes.io/metadata.name": "elsewhere"}
    other_pod = _hypothetical("other", {"app": "x"}, elsewhere, in_namespace=False)
    sources: dict[str, Pod | External] = {
        "the internet": External("the internet", ip="203.0.113.7"),
        "a pod in another namespace": External("other", pod=other_pod),
        "a client namespace": External(
            "client",
            pod=_hypothetical(
                "client",
                {"app": "x"},
                {"kubernetes.io/metadata.name": "clients", "ragmesh.io/client": "true"},
                in_namespace=False,
            ),
        ),
        "the monitoring namespace": External(
            "monitoring",
            pod=_hypothetical(
                "prometheus",
                {"app": "prometheus"},
                {"kubernetes.io/metadata.name": "monitoring"},
                in_namespace=False,
            ),
        ),
        "an unlabelled pod of the namespace": _hypothetical(
            "stray", {"run": "debug"}, r.namespace_labels, in_namespace=True
        ),
    }
    for what, source in sources.items():
        for dst in r.pods:
            for port in sorted(dst.ports):
                if not policies.connects(source, dst, port):
                    continue
                # A published face (TLS and keys: check_edge) may be reached from anywhere.
                client = what in ("the internet", "a client namespace") or dst.name in published
                public = dst.name in PUBLIC and port == GRPC and client
                scrape = what == "the monitoring namespace" and port in METRICS_PORTS
                if not (public or scrape):
                    findings.append(f"network: {what} may connect to {dst.name}:{port}")
    # Out of the namespace: DNS only.
    kube_dns = External(
        "kube-dns",
        pod=_hypothetical(
            "kube-dns",
            {"k8s-app": "kube-dns"},
            {"kubernetes.io/metadata.name": "kube-system"},
            in_namespace=False,
        ),
    )
    for src in pods:
        for target, port in (
            (External("the internet", ip="203.0.113.7"), 443),
            (External("the internet", ip="2001:db8::7"), 443),
            (External("a pod in another namespace", pod=other_pod), 8080),
            (kube_dns, 8080),
        ):
            if policies.egress_allows(src, target, port):
                findings.append(f"network: {src.name} may connect out to {target.name}:{port}")
    return findings


def _exposed(r: Rendered) -> list[dict[str, Any]]:
    """Services reachable from outside the cluster."""
    return [
        s
        for s in r.of("Service")
        if s["spec"].get("type") in ("LoadBalancer", "NodePort") or s["spec"].get("externalIPs")
    ]


def _selected(r: Rendered, svc: Mapping[str, Any]) -> list[Pod]:
    selector = svc["spec"].get("selector") or {}
    return [p for p in r.pods if selector and selects({"matchLabels": selector}, p.labels)]


def check_edge(r: Rendered) -> list[str]:
    findings: list[str] = []
    for svc in _exposed(r):
        targets = _selected(r, svc)
        if not targets:
            findings.append(f"edge: Service {svc['metadata']['name']} is published but selects no known pod")
        for pod in targets:
            for c in pod.spec.get("containers", []):
                env = r.env(c)
                if not (env.get("RAGMESH_TLS_CERT_FILE") and env.get("RAGMESH_TLS_KEY_FILE")):
                    findings.append(
                        f"edge: Service {svc['metadata']['name']} publishes {pod.name}, serving without TLS"
                    )
                if not env.get("RAGMESH_API_KEYS_FILE"):
                    findings.append(
                        f"edge: Service {svc['metadata']['name']} publishes {pod.name}, needing no API key"
                    )
    for ingress in r.of("Ingress"):
        if not ingress["spec"].get("tls"):
            findings.append(f"edge: Ingress {ingress['metadata']['name']} has no TLS")
    for pod in r.pods:
        if pod.spec.get("hostNetwork") or any(
            p.get("hostPort") for c in pod.containers() for p in c.get("ports", [])
        ):
            findings.append(f"edge: pod {pod.name} uses the host's network or ports")
    return findings


def _mounts(pod: Pod, container: Mapping[str, Any]) -> dict[str, str]:
    """mount path -> Secret name, for the container's Secret volumes."""
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        volume = volumes.get(m["name"], {})
        if "secret" in volume:
            out[m["mountPath"].rstrip("/")] = volume["secret"]["secretName"]
    return out


def check_identity(r: Rendered) -> list[str]:
    findings: list[str] = []
    for pod in r.pods:
        if pod.name not in stages():
            continue
        for c in pod.spec.get("containers", []):
            env = r.env(c)
            if env.get("RAGMESH_SERVICE_AUTH") != "mtls":
                findings.append(f"identity: {pod.name} runs without RAGMESH_SERVICE_AUTH=mtls")
            if env.get("RAGMESH_HEALTH_PORT", "0").strip() not in ("", "0"):
                # A plaintext port on the pod's address: the exec probe speaks mTLS instead.
                findings.append(f"identity: {pod.name} opens a plaintext health port (RAGMESH_HEALTH_PORT)")
            mounts = _mounts(pod, c)
            for setting in TLS_SETTINGS:
                path = env.get(setting, "")
                if not path:
                    findings.append(f"identity: {pod.name} has no {setting}")
                    continue
                secret = mounts.get(str(Path(path).parent))
                if secret != f"ragmesh-tls-{pod.name}":
                    findings.append(
                        f"identity: {pod.name}'s {setting} is not in its own Secret ragmesh-tls-{pod.name}"
                    )
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if "grpc" in (c.get(probe) or {}):
                    findings.append(
                        f"identity: {pod.name}'s {probe} is a kubelet gRPC probe (it cannot do mTLS)"
                    )
                if probe != "startupProbe" and not c.get(probe):
                    findings.append(f"identity: {pod.name} has no {probe}")
    return findings


def _secret_refs(pod: Pod) -> list[tuple[str, str | None, str]]:
    """(secret, key or None for all, how) of every reference in the pod."""
    refs: list[tuple[str, str | None, str]] = []
    for c in pod.containers():
        refs += [(s["secretRef"]["name"], None, "envFrom") for s in c.get("envFrom", []) if "secretRef" in s]
        for item in c.get("env", []):
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                refs.append((ref["name"], ref["key"], "env"))
    for v in pod.spec.get("volumes", []):
        if "secret" in v:
            items = v["secret"].get("items")
            refs += (
                [(v["secret"]["secretName"], i["key"], "volume") for i in items]
                if items
                else [(v["secret"]["secretName"], None, "volume")]
            )
    return refs


def _minio_root_secrets(r: Rendered) -> set[str]:
    """The Secrets MinIO takes its root user from (whatever they are called)."""
    names = {"ragmesh-s3-root"}
    for pod in r.pods:
        if pod.name != "minio":
            continue
        for c in pod.containers():
            names |= {s["secretRef"]["name"] for s in c.get("envFrom", []) if "secretRef" in s}
            for item in c.get("env", []):
                ref = (item.get("valueFrom") or {}).get("secretKeyRef")
                if ref and item["name"].startswith("MINIO_ROOT_"):
                    names.add(ref["name"])
    return names


def check_credentials(r: Rendered) -> list[str]:
    findings: list[str] = []
    catalogue = _catalogue()
    for secret in r.of("Secret"):
        values = [*(secret.get("stringData") or {}).values(), *(secret.get("data") or {}).values()]
        decoded = []
        for v in values:
            try:
                decoded.append(base64.b64decode(v).decode("utf-8", "replace"))
            except ValueError:
                decoded.append(str(v))
        if any(PLACEHOLDER.search(v) for v in [*decoded, *map(str, values)]):
            findings.append(f"credentials: Secret {secret['metadata']['name']} holds a placeholder value")
        else:
            findings.append(
                f"credentials: Secret {secret['metadata']['name']} is committed (make_secrets.py makes them)"
            )
    root = _minio_root_secrets(r)
    for pod in r.pods:
        own = BOOTSTRAP if pod.name == BOOTSTRAP else pod.name
        for name, key, how in _secret_refs(pod):
            if name in root and pod.name not in ("minio", BOOTSTRAP):
                findings.append(f"credentials: {pod.name} gets MinIO's root user")
            if name not in catalogue:
                findings.append(
                    f"credentials: {pod.name} refers to Secret {name}, which make_secrets.py does not make"
                )
                continue
            if key is not None and key not in catalogue[name]:
                findings.append(f"credentials: {pod.name} reads key {key} of Secret {name}, which has none")
            m = re.fullmatch(r"ragmesh-(nats|s3)-(.+)", name)
            if name == "ragmesh-s3-root":
                pass  # checked above, with whatever else holds MinIO's root user
            elif m and how == "envFrom" and m.group(2) != own.removeprefix("ragmesh-"):
                findings.append(f"credentials: {pod.name} logs in as another service ({name})")
            elif m and how != "envFrom" and pod.name not in ("nats", BOOTSTRAP):
                findings.append(f"credentials: {pod.name} reads another service's credential ({name})")
            if (
                name.startswith("ragmesh-tls-")
                and name.removeprefix("ragmesh-tls-") != pod.name
                and key != "ca.crt"
            ):
                findings.append(f"credentials: {pod.name} mounts another identity's key ({name})")
    return findings


def check_nats(r: Rendered) -> list[str]:
    findings: list[str] = []
    nats = next((w for w in r.of("StatefulSet") if w["metadata"]["name"] == "nats"), None)
    if nats is None:
        return ["nats: no nats StatefulSet"]
    replicas = int(nats["spec"].get("replicas", 1))
    if replicas < 3:
        findings.append(f"nats: {replicas} server(s); a JetStream cluster needs 3 to survive losing one")
    conf = next((v for cm in r.configmaps.values() for k, v in cm.items() if k == "nats.conf"), "")
    routes = set(re.findall(r"nats-route://([^:\s]+):6222", conf))
    if len(routes) != replicas:
        findings.append(f"nats: {len(routes)} route(s) in nats.conf for {replicas} servers")
    for needed, why in (
        (r"(?m)^authorization\s*\{", "no users (authorization)"),
        (r"(?m)^tls\s*\{", "no TLS for clients"),
        (r"(?m)^\s*sync_interval:", "no explicit JetStream sync_interval"),
        (r"(?m)^cluster\s*\{", "no cluster block"),
    ):
        if not re.search(needed, conf):
            findings.append(f"nats: nats.conf has {why}")
    if re.search(r"(?m)^\s*no_auth_user", conf):
        findings.append("nats: nats.conf lets clients in without a user (no_auth_user)")
    affinity = nats["spec"]["template"]["spec"].get("affinity", {}).get("podAntiAffinity")
    if not affinity:
        findings.append("nats: servers are not spread over nodes (no pod anti-affinity)")
    pdbs = [
        p
        for p in r.of("PodDisruptionBudget")
        if selects(p["spec"].get("selector"), {"app.kubernetes.io/name": "nats"})
    ]
    if not any(
        p["spec"].get("maxUnavailable") == 1 or int(p["spec"].get("minAvailable", 0)) >= replicas // 2 + 1
        for p in pdbs
    ):
        findings.append("nats: no PodDisruptionBudget keeps a quorum")
    config = r.configmaps.get(next((n for n in r.configmaps if n.startswith("ragmesh-config")), ""), {})
    stream_replicas = int(config.get("RAGMESH_NATS_STREAM_REPLICAS", "1"))
    if stream_replicas < 3 or stream_replicas > replicas:
        findings.append(
            f"nats: RAGMESH_NATS_STREAM_REPLICAS={stream_replicas}: streams belong on 3 of {replicas}"
        )
    if not config.get("RAGMESH_NATS_URL", "").startswith("tls://"):
        findings.append("nats: RAGMESH_NATS_URL is not tls://")
    if config.get("RAGMESH_S3_SECURE", "false").lower() != "true":
        findings.append("s3: RAGMESH_S3_SECURE is not true (MinIO over plain HTTP)")
    return findings


CHECKS = (check_edge, check_network, check_identity, check_credentials, check_nats)


def check(docs: Iterable[dict[str, Any]]) -> list[str]:
    rendered = Rendered(docs)
    return [finding for run in CHECKS for finding in run(rendered)]


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    if not paths:
        print("usage: check_manifests.py RENDERED.yaml...", file=sys.stderr)
        return 2
    failed = False
    for path in paths:
        findings = check(yaml.safe_load_all(Path(path).read_text()))
        for finding in findings:
            print(f"{path}: {finding}")
        failed = failed or bool(findings)
        if not findings:
            print(f"{path}: closed by default (edge, network, identities, credentials, NATS)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
