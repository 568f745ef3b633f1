"""A collection's calibration: the search choices ``ragmesh calibrate`` measured on the
collection's own documents, kept in its collection record (meshkit.domain.collections).

The gateway applies it to every search and ask of the collection that leaves these choices
unset (rerank on or off, the reranker's keep-fused margin, the legs' RRF weights), so a caller
never has to know which fits the collection. It is only applied while the collection is served
by the embedder it was measured with: another model's vectors rank differently, and a choice
measured on them says nothing of the new ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LEG_NAMES = ("dense", "bm25", "exact")


@dataclass(frozen=True)
class Calibration:
    rerank: bool
    # Leg name -> default RRF weight (every leg of LEG_NAMES); all 0: the gateway's own defaults.
    weights: dict[str, float]
    # None: the server default.
    keep_fused_margin: float | None = None
    queries: int = 0
    documents: int = 0
    # System -> nDCG@10 on the pseudo-queries.
    measured: dict[str, float] = field(default_factory=dict)
    # reranked - fused on the pseudo-queries: mean and 95% paired-bootstrap interval.
    rerank_gain: float = 0.0
    rerank_gain_low: float = 0.0
    rerank_gain_high: float = 0.0
    method: str = ""
    calibrated_at: float = 0.0
    # The embedder of the generation it was measured on ("" : unknown, never applied).
    embedder_sha256: str = ""

    def applies_to(self, embedder_sha256: str | None) -> bool:
        return bool(self.embedder_sha256) and self.embedder_sha256 == embedder_sha256

    @classmethod
    def from_dict(cls, raw: Any) -> Calibration | None:
        if not isinstance(raw, dict):
            return None
        weights = raw.get("weights") or {}
        margin = raw.get("keep_fused_margin")
        return cls(
            rerank=bool(raw.get("rerank", False)),
            weights={leg: float(weights.get(leg, 0.0)) for leg in LEG_NAMES},
            keep_fused_margin=None if margin is None else float(margin),
            queries=int(raw.get("queries", 0)),
            documents=int(raw.get("documents", 0)),
            measured={str(k): float(v) for k, v in (raw.get("measured") or {}).items()},
            rerank_gain=float(raw.get("rerank_gain", 0.0)),
            rerank_gain_low=float(raw.get("rerank_gain_low", 0.0)),
            rerank_gain_high=float(raw.get("rerank_gain_high", 0.0)),
            method=str(raw.get("method", "")),
            calibrated_at=float(raw.get("calibrated_at", 0.0)),
            embedder_sha256=str(raw.get("embedder_sha256", "")),
        )
