"""The rendered alerts and queries, checked by promtool: rule files valid, every alert's unit
tests (rules_test.yaml) pass, firing and silent, and every rendered query parses."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart._render import EXAMPLES, render
from tests.observability._queries import rendered_queries, rules_file, tool

HERE = Path(__file__).resolve().parent
ENABLED = ("metrics.prometheusRule.enabled=true", "metrics.dashboards.enabled=true")
# Renders that hold alerts: the defaults with everything on, and the examples that enable
# them (with KEDA triggers and ServiceMonitors).
RENDERS = {
    "defaults": ((), (*ENABLED, "autoscaling.enabled=true", "serviceMonitor.enabled=true")),
    "h100-8x": ((EXAMPLES / "h100-8x.yaml",), ()),
    "mixed": ((EXAMPLES / "mixed.yaml",), ()),
}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _render(name: str) -> list[dict[str, Any]]:
    files, sets = RENDERS[name]
    return render(*files, sets=sets)


@pytest.mark.parametrize("name", sorted(RENDERS))
def test_promtool_accepts_every_rendered_rule_file(name: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_file(_render(name))))

    done = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


def test_promtool_unit_tests_of_every_alert_pass(tmp_path: Path) -> None:
    docs = render(sets=["metrics.prometheusRule.enabled=true"])
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_file(docs)))
    shutil.copy(HERE / "rules_test.yaml", tmp_path / "rules_test.yaml")

    done = _promtool("test", "rules", "rules_test.yaml", cwd=tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    alerts = {q.key for q in rendered_queries(render(sets=["metrics.prometheusRule.enabled=true"]))}
    cases = [
        case
        for test in yaml.safe_load((HERE / "rules_test.yaml").read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    firing = {c["alertname"] for c in cases if c["exp_alerts"]}
    silent = {c["alertname"] for c in cases if not c["exp_alerts"]}

    assert len(alerts) == 9
    assert alerts - firing == set(), "alerts without a firing unit test"
    assert alerts - silent == set(), "alerts without a silent unit test"


@pytest.mark.parametrize("name", sorted(RENDERS))
def test_every_rendered_query_parses(name: str, tmp_path: Path) -> None:
    # promtool checks recording rules' expressions: one per KEDA trigger, alert and panel.
    queries = rendered_queries(_render(name))
    kinds = {q.kind for q in queries}
    rules = [{"record": f"sie:check_{i}", "expr": q.promql()} for i, q in enumerate(queries)]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]})
    )

    done = _promtool("check", "rules", "queries.yaml", cwd=tmp_path)

    assert kinds == {"keda", "alert", "panel"}
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rendered_query_selects_the_release_and_its_namespace() -> None:
    docs = render(*RENDERS["defaults"][0], sets=RENDERS["defaults"][1], release="blue")
    for query in rendered_queries(docs):
        promql = query.promql()
        for selector in ('namespace="sie"', 'release="blue"'):
            selectors = promql.count("{")
            assert promql.count(selector) == selectors, (query.key, selector, promql)
