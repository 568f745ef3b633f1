"""Prometheus's view of a rendered overlay, for deploy/k8s/check_manifests.py: the scrape jobs the
project ships (deploy/prometheus/scrape-kubernetes.yml), the targets its Kubernetes pod discovery
makes of each pod template (one per container port, with the ``__meta_kubernetes_*`` labels), and
which job keeps which target after relabelling, evaluated as Prometheus does (anchored regexes,
``keep``, ``drop``, ``replace``)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from manifest_objects import Pod

HERE = Path(__file__).resolve().parent
SCRAPE_CONFIG = HERE.parent / "prometheus" / "scrape-kubernetes.yml"
# Any address: discovery puts the pod's IP there, and no check depends on it.
POD_IP = "10.0.0.1"

Job = Mapping[str, Any]
Target = dict[str, str]


class RelabelError(ValueError):
    """A relabel rule this evaluator does not know (so it cannot say what the job scrapes)."""


def load_scrape_config(path: Path = SCRAPE_CONFIG) -> dict[str, Any]:
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    return config if isinstance(config, dict) else {}


def _label_name(name: str) -> str:
    # Discovery turns a Kubernetes label or annotation key into a Prometheus label name so.
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _pod_meta(pod: Pod, namespace: str) -> Target:
    metadata = (pod.workload.get("spec", {}).get("template", {}) or {}).get("metadata") or {}
    meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": f"{pod.name}-0"}
    for kind, values in (("label", pod.labels), ("annotation", metadata.get("annotations") or {})):
        for key, value in values.items():
            meta[f"__meta_kubernetes_pod_{kind}_{_label_name(key)}"] = str(value)
            meta[f"__meta_kubernetes_pod_{kind}present_{_label_name(key)}"] = "true"
    return meta


def pod_targets(pod: Pod, namespace: str) -> Iterator[Target]:
    """What `role: pod` discovery makes of a pod: a target per container port."""
    meta = _pod_meta(pod, namespace)
    for container in pod.spec.get("containers", []):
        for port in container.get("ports", []):
            yield {
                **meta,
                "__address__": f"{POD_IP}:{port['containerPort']}",
                "__meta_kubernetes_pod_container_name": container.get("name", ""),
                "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
            }


def _replacement(template: str) -> str:
    # Prometheus writes groups as $1 or ${1} (or by name), Python as \g<1>.
    return re.sub(r"\$\{?(\w+)\}?", r"\\g<\1>", template)


def _relabel_one(labels: Target, rule: Mapping[str, Any]) -> Target | None:
    action = rule.get("action", "replace")
    value = str(rule.get("separator", ";")).join(labels.get(n, "") for n in rule.get("source_labels", []))
    match = re.fullmatch(str(rule.get("regex", "(.*)")), value)
    if action == "keep":
        return labels if match else None
    if action == "drop":
        return None if match else labels
    if action == "replace":
        if match:
            new = match.expand(_replacement(str(rule.get("replacement", "$1"))))
            target = str(rule["target_label"])
            labels = {k: v for k, v in labels.items() if k != target}
            if new:
                labels[target] = new
        return labels
    raise RelabelError(f"relabel action {action!r} is not evaluated by check_manifests.py")


def relabel(target: Target, rules: Sequence[Mapping[str, Any]]) -> Target | None:
    """The target after the job's relabel_configs; None when they drop it."""
    labels: Target | None = dict(target)
    for rule in rules:
        if labels is None:
            break
        labels = _relabel_one(labels, rule)
    return labels


def discovers(job: Job, namespace: str) -> bool:
    """Whether the job's Kubernetes pod discovery sees pods of ``namespace``."""
    for sd in job.get("kubernetes_sd_configs") or []:
        names = (sd.get("namespaces") or {}).get("names") or []
        if sd.get("role") == "pod" and (not names or namespace in names):
            return True
    return False


def scraping_jobs(config: Mapping[str, Any], target: Target) -> list[Job]:
    """The jobs that scrape ``target`` (a pod port of namespace ``__meta_kubernetes_namespace``)."""
    namespace = target["__meta_kubernetes_namespace"]
    return [
        job
        for job in config.get("scrape_configs") or []
        if discovers(job, namespace) and relabel(target, job.get("relabel_configs") or []) is not None
    ]
