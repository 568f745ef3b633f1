"""bench/answer_tune.py's tune grid: every point of gate, unknown-word penalty and passage floor
is replayed through the gateway's own selection over a cached question."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from bench import answer_tune

TEXT = "Vitamin D supplementation reduced hip fractures in older women."
QUESTION = "Does vitamin D supplementation reduce hip fractures in zorbling women?"


def cached(unknown: list[str]) -> dict[str, object]:
    return {
        "id": "q1",
        "question": QUESTION,
        "answerable": True,
        "gold": ["d1"],
        "rationales": [],
        "results": [{"chunk_id": "c1", "doc_id": "d1", "title": "", "text": TEXT, "rerank": -3.0}],
        "sentences": [[0, 0, TEXT, 1.0]],
        "unknown": unknown,
        "novel": [],
        "similarity": 0.8,
    }


def answered_by_point(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> dict[tuple[str, ...], str]:
    monkeypatch.setattr(sys, "argv", ["answer_tune", "tune", *argv])
    answer_tune.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("gate")]
    point = re.compile(r"^gate (\S+) .*unknown-penalty (\S+) .*floor (\S+) .*\| answered (\S+)")
    found = {}
    for line in lines:
        match = point.search(line)
        assert match, line
        found[match.groups()[:3]] = match.group(4)
    return found


def test_each_gate_penalty_and_floor_is_a_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(answer_tune, "CACHE", tmp_path)
    (tmp_path / "known.json").write_text(json.dumps([cached([])]))
    (tmp_path / "unknown.json").write_text(json.dumps([cached(["zorbling"])]))
    grid = ["--gate", "0", "--unknown-penalty", "0", "20", "--floor", "-4", "-2", "--coverage", "6"]
    # Strength -3 + 0.5 x 1, plus 6 x 5/7 words held: 1.8, over a gate at 0 while the passage
    # (-3) clears the floor.
    known = answered_by_point(monkeypatch, capsys, ["--answerable", "known", *grid])
    assert known == {
        ("0", "0", "-4"): "1.000",
        ("0", "20", "-4"): "1.000",
        ("0", "0", "-2"): "0.000",
        ("0", "20", "-2"): "0.000",
    }
    # The same question holding a word no document holds: the penalty refuses it.
    unknown = answered_by_point(monkeypatch, capsys, ["--answerable", "unknown", *grid])
    assert unknown[("0", "0", "-4")] == "1.000" and unknown[("0", "20", "-4")] == "0.000"


def test_one_point_is_written_as_the_models_calibration_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from meshkit.settings.model_calibration import ModelCalibration, load_model_calibration

    monkeypatch.setattr(answer_tune, "CACHE", tmp_path)
    (tmp_path / "known.json").write_text(json.dumps([cached([])]))
    out = tmp_path / "calibration.json"
    point = ["--gate", "1.5", "--unknown-penalty", "7", "--floor", "-3", "--fact-min", "-4.5"]
    monkeypatch.setattr(
        sys, "argv", ["answer_tune", "tune", "--answerable", "known", *point, "--write-calibration", str(out)]
    )
    answer_tune.main()
    written = load_model_calibration(out)
    assert (written.ask_gate_min_score, written.ask_gate_unknown_penalty) == (1.5, 7.0)
    assert (written.ask_min_rerank_score, written.ask_fact_min_score) == (-3.0, -4.5)
    assert written.rerank_keep_fused_margin == ModelCalibration().rerank_keep_fused_margin  # not tuned here
    assert f"wrote {out}" in capsys.readouterr().out
    monkeypatch.setattr(
        sys,
        "argv",
        ["answer_tune", "tune", "--gate", "1", "2", "--write-calibration", str(tmp_path / "x.json")],
    )
    with pytest.raises(SystemExit, match="one point"):
        answer_tune.main()
