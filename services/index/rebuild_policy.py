"""When a collection's backend should be rebuilt, and as what: the index type its policy asks
for at its current size (exact below the thresholds, IVF above, HNSW when asked), an IVF index
retrained when the collection has grown or shrunk well past what it was trained on, an HNSW
graph compacted once too many of its entries are deleted."""

from __future__ import annotations

from services.index.backends import Backend, HNSWBackend, IVFBackend
from services.index.records import IndexPolicy

# Explicit 'ivf' stays exact below this size: k-means on a handful of vectors is noise.
MIN_IVF_VECTORS = 1000
# Retrain IVF when the collection has grown (or shrunk) this much since it was trained.
IVF_RETRAIN_FACTOR = 4
# Auto falls back to exact search below this share of index_ann_threshold (hysteresis).
AUTO_SHRINK_RATIO = 0.5
# HNSW is rebuilt once deleted-but-present entries exceed this share of its graph.
HNSW_TOMBSTONE_RATIO = 0.2


def rebuild_target(backend: Backend, n: int, policy: IndexPolicy) -> str | None:
    """The index type a collection of ``n`` vectors held in ``backend`` should be rebuilt as
    now, or None if it is fine."""
    if policy.index_type == "hnsw":
        stale = not isinstance(backend, HNSWBackend) or backend.garbage_ratio() > HNSW_TOMBSTONE_RATIO
        return "hnsw" if stale else None
    if policy.index_type == "flat":
        return None if backend.kind == "flat" else "flat"
    if policy.index_type == "ivf":
        want = "ivf" if n >= MIN_IVF_VECTORS else "flat"
    elif isinstance(backend, IVFBackend):
        want = "flat" if n < policy.ann_threshold * AUTO_SHRINK_RATIO else "ivf"
    else:
        want = "ivf" if n > policy.ann_threshold else "flat"
    if want != backend.kind:
        return want
    if isinstance(backend, IVFBackend) and not (
        backend.trained_on / IVF_RETRAIN_FACTOR <= n <= backend.trained_on * IVF_RETRAIN_FACTOR
    ):
        return "ivf"
    return None
