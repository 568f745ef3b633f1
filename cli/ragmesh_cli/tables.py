"""Plain-text tables for the commands' human output (the ``--json`` forms are the machine ones)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ragmesh_client import CollectionCalibration


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns two spaces apart, as wide as their widest cell; None prints empty."""
    cells = [[str(h) for h in headers], *[["" if v is None else str(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def calibration_dict(calibration: CollectionCalibration | None) -> dict[str, Any] | None:
    """A collection's calibration as ``ragmesh status --json`` prints it (None: none recorded)."""
    if calibration is None:
        return None
    fields = asdict(calibration)
    fields["weights"] = dict(calibration.weights)
    fields["measured"] = dict(calibration.measured)
    fields["calibrated_at"] = calibration.calibrated_at.isoformat() if calibration.calibrated_at else None
    return fields


# The collection grew this many times over since it was calibrated: say it may no longer fit.
STALE_GROWTH = 2


def calibration_text(calibration: CollectionCalibration | None, indexed: int = 0) -> str:
    """The calibration lines of ``ragmesh status --collection C`` (``indexed``: the collection's
    documents now, to tell when it has grown well past what was measured)."""
    if calibration is None:
        return "calibration: none recorded (searches use the server defaults; see `ragmesh calibrate`)"
    weights = (
        ", ".join(f"{leg} {weight:g}" for leg, weight in calibration.weights.items())
        if any(calibration.weights.values())
        else "server default"
    )
    margin = (
        "server default" if calibration.keep_fused_margin is None else f"{calibration.keep_fused_margin:g}"
    )
    measured = ", ".join(f"{name} {value:.3f}" for name, value in sorted(calibration.measured.items()))
    when = calibration.calibrated_at.isoformat(timespec="seconds") if calibration.calibrated_at else "?"
    return "\n".join(
        [
            f"calibration ({calibration.method or 'unnamed method'}, {when}, embedder "
            f"{calibration.embedder_sha256[:12] or '?'}):",
            f"  rerank {'on' if calibration.rerank else 'off'}; keep-fused margin {margin}; "
            f"weights {weights}",
            f"  measured on {calibration.queries} queries from {calibration.documents} documents: {measured}",
            f"  reranked - fused {calibration.rerank_gain:+.3f} "
            f"[{calibration.rerank_gain_low:+.3f}, {calibration.rerank_gain_high:+.3f}]",
        ]
        + (
            [
                f"  the collection has grown to {indexed} documents since: run `ragmesh calibrate` "
                "again to measure it as it is"
            ]
            if calibration.documents and indexed >= STALE_GROWTH * calibration.documents
            else []
        )
    )
