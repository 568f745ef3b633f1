"""Tuning a sealed segment's ANN index to the recall target, once, when it is built.

The search breadth (IVF nprobe, HNSW efSearch) starts at the policy's values and doubles until
recall@10 against exact search, measured on a sample of the segment's own rows used as queries
(each query's own row left out of both sides: a real query is near the data, not in it), reaches
the target plus a margin. The sample is drawn with a seed fixed by the segment's size, so
replicas tuning the same rows pick the same parameters. Measured on clustered synthetic data and
on SciFact embeddings (services/index/tests/test_segment_scale.py, docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import logging

import numpy as np

from services.index.backends import Backend, faiss

log = logging.getLogger(__name__)

SAMPLE_QUERIES = 200
RECALL_K = 10
# The sample is small and its queries lie in the data: aim a little above the target.
MARGIN = 0.02


def recall_at_k(found: np.ndarray, truth: np.ndarray, own: np.ndarray, k: int = RECALL_K) -> float:
    """Share of each query's true top ``k`` (its own row ``own`` left out) that ``found`` holds."""
    hits = total = 0
    for row, got, want in zip(own.tolist(), found.tolist(), truth.tolist(), strict=True):
        wanted = [r for r in want if r != row and r >= 0][:k]
        returned = {r for r in got if r != row and r >= 0}
        hits += len(returned.intersection(wanted))
        total += len(wanted)
    return hits / total if total else 1.0


def calibrate(backend: Backend, vectors: np.ndarray, target: float) -> float:
    """Widen ``backend`` until its sampled recall@10 reaches ``target`` + MARGIN (or it cannot
    widen further); returns the recall measured with the parameters it keeps."""
    n = len(vectors)
    if backend.exact or n <= RECALL_K + 1:
        return 1.0
    rng = np.random.default_rng(n)
    own = np.sort(rng.choice(n, size=min(SAMPLE_QUERIES, n), replace=False))
    queries = np.ascontiguousarray(vectors[own], dtype=np.float32)
    data = np.ascontiguousarray(vectors, dtype=np.float32)
    _, truth = faiss.knn(queries, data, RECALL_K + 1, faiss.METRIC_INNER_PRODUCT)
    while True:
        recall = recall_at_k(backend.search_many(queries, RECALL_K + 1), truth, own)
        if recall >= min(1.0, target + MARGIN) or not backend.widen():
            log.debug("segment index tuned", extra={"recall": round(recall, 4), **backend.params})
            return recall
