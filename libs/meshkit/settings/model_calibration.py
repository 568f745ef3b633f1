"""The numbers that belong to the models, not to an operator: thresholds and weights in the
log-odds of the reranker's cross-encoder and the cosines of the embedder, tuned with
bench/answer_tune.py and bench/rerank_variants.py on held-out and tune sets (docs/BENCHMARKS.md).

They change when a model changes, not when a deployment does, so they are not settings: the
defaults below are the calibration of the models ragmesh ships, and a deployment serving other
models points the gateway at the calibration file made for them
(``RAGMESH_GATEWAY_MODEL_CALIBRATION_FILE``, JSON with any of these fields; ``ragmesh config
--calibration`` prints the one in force in that form). Per collection, ``ragmesh calibrate``
adds its own choices on top (meshkit.domain.calibration).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# A calibration file is a few hundred bytes; anything much larger is not one.
MAX_FILE_BYTES = 64 * 1024


class ModelCalibrationError(ValueError):
    """A calibration file that cannot be used, with the reason."""


class ModelCalibration(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rerank_fused_weight: float = Field(
        0.5,
        ge=0,
        description="Final order: RRF of the reranker's order (weight 1) and the fused order (this weight).",
    )
    rerank_keep_fused_margin: float = Field(
        1.0,
        ge=0,
        description="The fused order stands when the reranker scores the fused first candidate within this "
        "many log-odds of its best one (the default of a request's keep_fused_margin). 0: always the "
        "reranker's order.",
    )
    hyde_min_score: float = Field(
        0.45, description="Supplement HyDE: a plain search whose best dense cosine is under this is weak."
    )
    ask_min_rerank_score: float = Field(
        -4.0,
        description="Evidence gate: reranked passages scoring under this (log-odds) are not read; with none "
        "left, the answer says the documents do not say.",
    )
    ask_gate_min_score: float = Field(
        -6.0,
        description="Evidence gate: the strongest passage's strength (see ask_sentence_weight) plus "
        "ask_gate_coverage_weight x the share of the question's content words the passages hold, minus "
        "the unknown-word terms below, must reach this.",
    )
    ask_gate_coverage_weight: float = Field(
        12.0, ge=0, description="Evidence gate: the weight of the question's word coverage."
    )
    ask_gate_unknown_weight: float = Field(
        25.0,
        ge=0,
        description="Evidence gate: subtracted x the share of the question's content words no document "
        "holds.",
    )
    ask_gate_novel_weight: float = Field(
        10.0,
        ge=0,
        description="Evidence gate: subtracted x the share of the question's content words no document holds "
        "nor any word one edit from them.",
    )
    ask_gate_unknown_penalty: float = Field(
        9.5,
        ge=0,
        description="Evidence gate: subtracted once when the question holds any word no document holds.",
    )
    ask_gate_min_similarity: float = Field(
        0.40,
        ge=-1.0,
        le=1.0,
        description="Evidence gate, topicality: the dense leg's best cosine must reach this (-1: off), for "
        "the embedders named in ask_gate_similarity_models.",
    )
    ask_gate_similarity_models: str = Field(
        "all-MiniLM-L6-v2-int8",
        description="Comma-separated embedder model names the topicality floor is calibrated for; '*': every "
        "model.",
    )
    ask_fact_min_score: float = Field(
        -5.0, description="Sentences scoring at least this (log-odds) are facts (the best always is)."
    )
    ask_fact_passage_weight: float = Field(
        2.0,
        ge=0,
        description="Facts are ordered by their sentence score plus this times their passage's reranker "
        "score.",
    )
    ask_sentence_weight: float = Field(
        0.5,
        ge=0,
        description="A passage's strength: its reranker score plus this times its best sentence's score.",
    )
    ask_cite_margin: float = Field(
        1.0,
        ge=0,
        description="An extractive answer cites the passages whose strength is within this of the "
        "strongest's.",
    )
    ask_sentence_margin: float = Field(
        2.0, ge=0, description="A passage's sentences within this (log-odds) of its best are stated with it."
    )
    ask_support_min_score: float = Field(
        0.0,
        description="An answer sentence or LLM fact is supported when a sentence of a passage it cites "
        "scores at least this (log-odds) with it.",
    )
    ask_support_min_coverage: float = Field(
        0.7,
        ge=0,
        le=1,
        description="Support check's first filter: the share of an answer sentence's content words a passage "
        "sentence must hold.",
    )

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)


def load_model_calibration(path: str | Path) -> ModelCalibration:
    """The calibration in ``path`` (fields it leaves out keep the shipped models' values); an empty
    path: the shipped models' calibration. Raises ModelCalibrationError with the reason."""
    if not str(path):
        return ModelCalibration()
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ModelCalibrationError(
                f"{file}: {size} bytes, a calibration file is at most {MAX_FILE_BYTES}"
            )
        raw: Any = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelCalibrationError(f"{file}: cannot read the model calibration ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelCalibrationError(f"{file}: not a JSON model calibration ({exc})") from None
    if not isinstance(raw, dict):
        raise ModelCalibrationError(f"{file}: a model calibration is a JSON object")
    try:
        return ModelCalibration(**raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ModelCalibrationError(f"{file}: {problems}") from None
