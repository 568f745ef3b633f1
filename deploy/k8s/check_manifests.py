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
* **Metrics**: every gRPC pod's metrics port (HTTPS with a mesh client certificate under mtls) is
  annotated `prometheus.io/scheme: https` and scraped by a job of the shipped scrape config
  (deploy/prometheus/scrape-kubernetes.yml, named `ragmesh-*` as the alert rules assume) that
  uses https, verifies the pod against the mesh CA by its identity, and presents the scraper's
  certificate from its Secret (make_secrets.py's ragmesh-tls-prometheus).

This file holds the checks; what they check against is beside it: manifest_mesh.py (workloads,
identities, call graph, ports), manifest_objects.py (the rendered objects),
manifest_netpolicy.py (NetworkPolicy semantics) and manifest_scrape.py (Prometheus's discovery
and relabelling).
"""

from __future__ import annotations

import base64
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from manifest_mesh import (
    BOOTSTRAP,
    CALLS,
    GRPC,
    METRICS_PORTS,
    OPS,
    OPTIONAL_CALLS,
    PUBLIC,
    TLS_SETTINGS,
    secret_catalogue,
    stages,
)
from manifest_netpolicy import Policies, selects
from manifest_objects import External, Pod, Rendered
from manifest_scrape import Job, load_scrape_config, pod_targets, scraping_jobs

PLACEHOLDER = re.compile(r"replace[-_]?me|changeme|placeholder", re.IGNORECASE)


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
    catalogue = secret_catalogue()
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


# The Secret the scraper's certificate comes from, as Prometheus mounts it (make_secrets.py).
SCRAPER_SECRET = "ragmesh-tls-prometheus"
SCRAPER_FILES = {"ca_file": "ca.crt", "cert_file": "tls.crt", "key_file": "tls.key"}


def _scrape_job_findings(job: Job, pod: Pod, port: str) -> list[str]:
    """What is wrong with ``job`` scraping a gRPC pod's metrics port (mTLS under service_auth)."""
    where = f"metrics: job {job.get('job_name')} scrapes {pod.name}:{port}"
    findings = []
    if not str(job.get("job_name", "")).startswith("ragmesh-"):
        findings.append(f"{where} under a name the alert rules do not watch (ragmesh-*)")
    if job.get("scheme") != "https":
        findings.append(f"{where} over plain HTTP (the port serves HTTPS only)")
    tls = job.get("tls_config") or {}
    if tls.get("insecure_skip_verify"):
        findings.append(f"{where} without verifying its certificate (insecure_skip_verify)")
    if tls.get("server_name") != pod.name:
        findings.append(f"{where} verifying it as {tls.get('server_name')!r}, not its identity {pod.name!r}")
    for field, file in SCRAPER_FILES.items():
        path = Path(str(tls.get(field, "")))
        if (path.parent.name, path.name) != (SCRAPER_SECRET, file):
            findings.append(f"{where} without {file} of Secret {SCRAPER_SECRET} as {field}")
    return findings


def check_scrape(r: Rendered, scrape: Mapping[str, Any]) -> list[str]:
    findings: list[str] = []
    for pod in r.pods:
        if pod.name not in stages():
            continue
        annotations = (pod.workload["spec"]["template"].get("metadata") or {}).get("annotations") or {}
        if (
            annotations.get("prometheus.io/scrape") == "true"
            and annotations.get("prometheus.io/scheme") != "https"
        ):
            findings.append(f"metrics: {pod.name} is annotated for scraping over plain HTTP")
        for target in pod_targets(pod, r.namespace):
            if target["__meta_kubernetes_pod_container_port_name"] != "metrics":
                continue
            port = target["__meta_kubernetes_pod_container_port_number"]
            jobs = scraping_jobs(scrape, target)
            if not jobs:
                findings.append(f"metrics: no job of the shipped scrape config scrapes {pod.name}:{port}")
            for job in jobs:
                findings += _scrape_job_findings(job, pod, port)
    return findings


CHECKS = (check_edge, check_network, check_identity, check_credentials, check_nats)


def check(docs: Iterable[dict[str, Any]], scrape: Mapping[str, Any] | None = None) -> list[str]:
    """Every finding on a rendered overlay, with the shipped scrape config unless ``scrape``."""
    rendered = Rendered(docs)
    findings = [finding for run in CHECKS for finding in run(rendered)]
    return findings + check_scrape(rendered, scrape if scrape is not None else load_scrape_config())


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
            print(f"{path}: closed by default (edge, network, identities, credentials, NATS, metrics)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
