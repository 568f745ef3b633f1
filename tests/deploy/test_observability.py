"""The alert rules and the Grafana dashboard in deploy/ speak of metrics the code exports: every
``ragmesh_*`` series they name is defined by a Counter, Gauge or Histogram in libs/ or services/,
with the suffixes its type has; every dashboard query is valid PromQL (promtool parses it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/ragmesh-rules.yml"
RULE_TESTS = ROOT / "deploy/prometheus/tests/ragmesh-rules.test.yml"
DASHBOARD = ROOT / "deploy/grafana/ragmesh-stages.json"
DEFINITION = re.compile(r'(Counter|Gauge|Histogram)\(\s*"(ragmesh_[a-z0-9_]+)"')
NAME = re.compile(r"\bragmesh_[a-z0-9_]+")
SUFFIXES = {"Counter": ("_total",), "Gauge": ("",), "Histogram": ("_bucket", "_count", "_sum")}


def exported_series() -> set[str]:
    """Every series name the code can export (prometheus_client adds _total to counters)."""
    names: set[str] = set()
    for path in [*ROOT.glob("libs/meshkit/**/*.py"), *ROOT.glob("services/**/*.py")]:
        for kind, name in DEFINITION.findall(path.read_text(encoding="utf-8")):
            base = name.removesuffix("_total") if kind == "Counter" else name
            names |= {base + suffix for suffix in SUFFIXES[kind]}
    return names


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", ())]


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def test_the_code_defines_what_the_collector_finds() -> None:
    series = exported_series()
    # A few of each kind, so a broken pattern cannot pass the tests below vacuously.
    assert {
        "ragmesh_rpc_requests_total",
        "ragmesh_rpc_latency_seconds_bucket",
        "ragmesh_breaker_open",
    } <= series
    assert "ragmesh_ingest_events_settled_total" in series


@pytest.mark.parametrize("source", ["rules", "dashboard", "rule tests"])
def test_every_series_named_in_deploy_is_exported_by_the_code(source: str) -> None:
    text = {
        "rules": "\n".join(rule_expressions()),
        "dashboard": "\n".join(dashboard_queries()),
        "rule tests": RULE_TESTS.read_text(encoding="utf-8"),
    }[source]
    named = set(NAME.findall(text))
    assert named, source
    unknown = sorted(named - exported_series())
    assert not unknown, f"{source} name series no code exports: {unknown}"


def test_the_dashboard_has_unique_panel_ids_and_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    assert len(dashboard_queries()) >= 20


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)"
)
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool parses rule files only: each query becomes a recording rule.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, expr in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    checked = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
