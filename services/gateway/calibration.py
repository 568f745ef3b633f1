"""A collection's calibration (meshkit.domain.calibration) applied to one search: each choice the
request left unset (rerank, the keep-fused margin, a leg's RRF weight) takes the value measured
for the collection instead of the server default. What the caller set always stands. An Ask on
a collection calibrated to rerank off keeps the fused order, but its passages are still scored
by the cross-encoder: the evidence gate judges with those scores."""

from __future__ import annotations

import math
from dataclasses import replace

from services.gateway.validation import LEGS, SearchParams


def calibrated(params: SearchParams) -> SearchParams:
    """``params`` with its collection's calibration in force, if it has one."""
    calibration = params.record.calibration_in_force() if params.record is not None else None
    if calibration is None:
        return params
    explicit = params.explicit
    weights = params.weights
    if any(calibration.weights.values()):  # all 0: the weights were not calibrated
        weights = {
            leg: params.weights[leg] if f"weights.{leg}" in explicit else calibration.weights[leg]
            for leg in LEGS
        }
    margin = params.keep_fused_margin
    if "keep_fused_margin" not in explicit and calibration.keep_fused_margin is not None:
        margin = calibration.keep_fused_margin
    rerank = params.rerank if "rerank" in explicit else calibration.rerank
    if params.rerank and not rerank and params.scores_passages:
        # An Ask still has its passages scored for the evidence gate, in the fused order the
        # calibration chose: the fused first candidate always holds.
        rerank, margin = True, math.inf
    return replace(
        params,
        rerank=rerank,
        keep_fused_margin=margin,
        # A calibration never leaves a search without a leg (the caller's zeros are theirs).
        weights=weights if any(weights.values()) else params.weights,
    )
