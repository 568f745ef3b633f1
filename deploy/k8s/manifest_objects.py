"""A rendered overlay as deploy/k8s/check_manifests.py reads it: its namespace, ConfigMaps and
the pod template of every workload (``Rendered``, ``Pod``), endpoints outside ragmesh's pods
(``External``), and a container's environment as far as the render says."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from manifest_mesh import secret_catalogue

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet")


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
                for spec in secret_catalogue().get(source["secretRef"]["name"], ()):
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
