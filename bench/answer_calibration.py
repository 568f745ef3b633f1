"""What bench/answer_tune.py's tune grid chose, as the models' calibration file the gateway reads
(meshkit.settings.model_calibration, RAGMESH_GATEWAY_MODEL_CALIBRATION_FILE)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from meshkit.settings import GatewaySettings
from meshkit.settings.model_calibration import ModelCalibration

# Grid field (or tune option) -> the models' calibration field it tunes; the others (counts of
# passages, sentences, facts) are settings.
CALIBRATION_FIELDS = {
    "gate_min_score": "ask_gate_min_score",
    "gate_coverage_weight": "ask_gate_coverage_weight",
    "gate_unknown_weight": "ask_gate_unknown_weight",
    "gate_unknown_penalty": "ask_gate_unknown_penalty",
    "gate_novel_weight": "ask_gate_novel_weight",
    "gate_min_similarity": "ask_gate_min_similarity",
    "floor": "ask_min_rerank_score",
    "sentence_weight": "ask_sentence_weight",
    "cite_margin": "ask_cite_margin",
    "sentence_margin": "ask_sentence_margin",
    "fact_min": "ask_fact_min_score",
    "fact_passage_weight": "ask_fact_passage_weight",
}


def calibration_of(tuned: Mapping[str, float]) -> ModelCalibration:
    """The calibration in force with the tuned values in place (keys: grid fields or tune options;
    those that are not calibration numbers are ignored)."""
    current = GatewaySettings().calibration.model_dump()
    return ModelCalibration(
        **{**current, **{CALIBRATION_FIELDS[k]: v for k, v in tuned.items() if k in CALIBRATION_FIELDS}}
    )


def write_calibration(
    path: str, fields: Sequence[str], axes: Sequence[Sequence[float]], **options: float
) -> None:
    """The grid's one point (``fields`` and their ``axes`` of values, one each) and the tune
    ``options`` as the models' calibration file at ``path``; what they do not tune keeps the
    values in force."""
    if any(len(values) != 1 for values in axes):
        raise SystemExit("--write-calibration takes one point: give each grid option one value")
    tuned = {field: values[0] for field, values in zip(fields, axes, strict=True)} | dict(options)
    Path(path).write_text(calibration_of(tuned).to_json() + "\n")
    print(f"wrote {path}")
