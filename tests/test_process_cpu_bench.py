"""bench/process_cpu.py: CPU seconds read from /proc, and per-search milliseconds from two snapshots."""

from __future__ import annotations

import os
import time

import pytest

from bench.process_cpu import cpu_seconds, per_search_ms


def test_cpu_seconds_grow_with_work_done_by_this_process() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) - before == pytest.approx(0.2, abs=0.1)


def test_per_search_ms_divides_each_process_s_cpu_by_the_searches() -> None:
    before = {"index-0": 1.0, "gateway": 2.0, "gone": 5.0}
    after = {"index-0": 1.5, "gateway": 2.2, "new": 1.0}
    assert per_search_ms(before, after, searches=100) == {"gateway": 2.0, "index-0": 5.0}
