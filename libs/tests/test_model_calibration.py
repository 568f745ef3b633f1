"""The models' calibration (meshkit.settings.model_calibration): not settings, read from a file
that may change any of its numbers, refused with the reason when it cannot be used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshkit.settings import SETTINGS_CLASSES, GatewaySettings
from meshkit.settings.model_calibration import (
    MAX_FILE_BYTES,
    ModelCalibration,
    ModelCalibrationError,
    load_model_calibration,
)
from ragmesh_cli.config import settings_rows


def test_no_calibration_number_is_a_setting() -> None:
    fields = {name for cls in SETTINGS_CLASSES for name in cls.model_fields}
    assert not {f"gateway_{name}" for name in ModelCalibration.model_fields} & fields
    envs = {row["env"] for row in settings_rows()}
    assert not any(name.upper() in env for env in envs for name in ModelCalibration.model_fields)


def test_without_a_file_the_shipped_models_calibration_is_in_force() -> None:
    assert GatewaySettings().calibration == ModelCalibration()
    assert (
        ModelCalibration().ask_gate_min_score == -6.0 and ModelCalibration().rerank_keep_fused_margin == 1.0
    )


def test_a_file_changes_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"ask_gate_min_score": 2.5, "ask_gate_similarity_models": "other-model"}))
    settings = GatewaySettings(gateway_model_calibration_file=str(path))
    assert settings.calibration.ask_gate_min_score == 2.5
    assert settings.calibration.ask_gate_similarity_models == "other-model"
    assert settings.calibration.ask_cite_margin == ModelCalibration().ask_cite_margin
    # What `ragmesh config --calibration` prints is a file that loads back to the same.
    path.write_text(settings.calibration.to_json())
    assert load_model_calibration(path) == settings.calibration


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "not a JSON model calibration"),
        ("[1, 2]", "a JSON object"),
        ('{"ask_gate_min_scor": 1}', "ask_gate_min_scor"),
        ('{"ask_gate_coverage_weight": -1}', "ask_gate_coverage_weight"),
        ('{"ask_gate_min_similarity": 1.5}', "ask_gate_min_similarity"),
        (" " * (MAX_FILE_BYTES + 1), "at most"),
    ],
)
def test_a_file_that_cannot_be_used_is_refused_with_the_reason(
    tmp_path: Path, content: str, reason: str
) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(content)
    with pytest.raises(ModelCalibrationError) as refused:
        load_model_calibration(path)
    assert reason in str(refused.value) and str(path) in str(refused.value)
    with pytest.raises(ModelCalibrationError):
        load_model_calibration(tmp_path / "missing.json")


def test_with_calibration_changes_a_copy_and_checks_the_values() -> None:
    settings = GatewaySettings()
    changed = settings.with_calibration(ask_gate_min_score=3.0)
    assert changed.calibration.ask_gate_min_score == 3.0 and settings.calibration.ask_gate_min_score == -6.0
    with pytest.raises(ValueError):
        settings.with_calibration(ask_gate_coverage_weight=-1.0)
    with pytest.raises(ValueError):
        settings.with_calibration(no_such_number=1.0)


def test_a_gateway_with_an_unusable_calibration_file_does_not_start(tmp_path: Path) -> None:
    from services.gateway.servicer import build_spec

    path = tmp_path / "calibration.json"
    path.write_text('{"ask_sentence_weight": "high"}')
    with pytest.raises(ModelCalibrationError, match="ask_sentence_weight"):
        build_spec(GatewaySettings(gateway_model_calibration_file=str(path)))


def test_ragmesh_config_prints_the_calibration_in_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragmesh_cli.main import main

    path = tmp_path / "calibration.json"
    path.write_text('{"ask_cite_margin": 0.25}')
    monkeypatch.setenv("RAGMESH_GATEWAY_MODEL_CALIBRATION_FILE", str(path))
    assert main(["config", "--calibration"]) == 0
    assert json.loads(capsys.readouterr().out) == {**ModelCalibration().model_dump(), "ask_cite_margin": 0.25}
    path.write_text("{")
    assert main(["config", "--calibration"]) == 1
    assert "not a JSON model calibration" in capsys.readouterr().err
