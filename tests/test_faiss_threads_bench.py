"""bench/faiss_threads.py: its last line is one JSON object comparing the two thread counts."""

from __future__ import annotations

import json
import sys

import pytest

from bench import faiss_threads


def test_json_line_compares_one_thread_with_the_other_count(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = "faiss_threads --vectors 300 --searches 20 --gap-ms 0 --threads 2 --json"
    monkeypatch.setattr(sys, "argv", argv.split())
    faiss_threads.main()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5  # two ABBA rounds of two counts, then the summary
    summary = json.loads(lines[-1])
    assert summary["threads"] == [1, 2]
    assert set(summary["cpu_ms_per_search"]) == set(summary["wall_p50_ms"]) == {"1", "2"}
    assert all(value > 0 for value in summary["cpu_ms_per_search"].values())
    expected = summary["cpu_ms_per_search"]["2"] / summary["cpu_ms_per_search"]["1"]
    assert summary["cpu_ratio"] == pytest.approx(expected, rel=1e-2)
