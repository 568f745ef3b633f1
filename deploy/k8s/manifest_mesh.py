"""The mesh that deploy/k8s/check_manifests.py holds the rendered manifests to: its workloads
and their identities (as make_secrets.py issues them), the Secrets make_secrets.py makes, who
calls whom on which port, the public faces, the metrics ports and the TLS settings every gRPC
server needs."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

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


def secret_catalogue() -> dict[str, tuple[str, ...]]:
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
    # The gateway reads collection records (embedder, serving generation; meshkit.domain.collections).
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
