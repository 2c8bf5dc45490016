"""Every PromQL expression a render of the chart holds, and the tools that evaluate them.

:func:`rendered_queries` takes the documents of ``helm template`` and returns each KEDA
trigger query (per ScaledObject and trigger), each alert expression (per alert) and each
dashboard panel target (per dashboard, panel and refId). Dashboard queries carry Grafana
variables; :func:`grafana_expr` substitutes them as Grafana would: the dashboard's own
constants (``$namespace``, ``$release``, as the chart set them), "All" (``.*``) for the
multi-value ones and a range for ``$__rate_interval``.

:func:`tool` (from tests/support/prometheus) finds ``prometheus`` / ``promtool``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.chart._render import of_kind
from tests.support.prometheus import tool

__all__ = ["Query", "grafana_expr", "rendered_queries", "rules_file", "tool"]

_ALL = ".*"


@dataclass(frozen=True)
class Query:
    """One rendered expression: ``kind`` is ``keda``, ``alert`` or ``panel``; ``key`` names
    it (``<ScaledObject>/<trigger>``, the alert, ``<dashboard>/<panel title>/<refId>``)."""

    kind: str
    key: str
    expr: str
    constants: Mapping[str, str] | None = None  # a panel's dashboard constants

    def promql(self, rate_interval: str = "5m") -> str:
        """The expression as Prometheus evaluates it (Grafana's variables substituted)."""
        if self.kind != "panel":
            return self.expr
        return grafana_expr(self.expr, self.constants or {}, rate_interval)


def grafana_expr(expr: str, constants: Mapping[str, str], rate_interval: str) -> str:
    """``expr`` with Grafana's variables replaced: constants by their value, every other
    ``$name`` by "All" (``.*``), ``$__rate_interval`` by ``rate_interval``."""
    expr = expr.replace("$__rate_interval", rate_interval)

    def value(match: re.Match[str]) -> str:
        return constants.get(match.group(1), _ALL)

    return re.sub(r"\$(\w+)", value, expr)


def rendered_queries(docs: Sequence[Mapping[str, Any]]) -> list[Query]:
    queries: list[Query] = []
    for scaled in of_kind(docs, "ScaledObject"):
        name = scaled["metadata"]["name"]
        for trigger in scaled["spec"]["triggers"]:
            queries.append(Query("keda", f"{name}/{trigger['name']}", trigger["metadata"]["query"]))
    for rule in of_kind(docs, "PrometheusRule"):
        for group in rule["spec"]["groups"]:
            for item in group["rules"]:
                queries.append(Query("alert", item["alert"], item["expr"]))
    for config in of_kind(docs, "ConfigMap"):
        for file, text in (config.get("data") or {}).items():
            if not file.endswith(".json") or not config["metadata"]["name"].endswith("-dashboard"):
                continue
            board = json.loads(text)
            constants = {
                v["name"]: v["query"]
                for v in board["templating"]["list"]
                if v.get("type") == "constant"
            }
            for panel in board["panels"]:
                for target in panel.get("targets", ()):
                    key = f"{file.removesuffix('.json')}/{panel['title']}/{target['refId']}"
                    queries.append(Query("panel", key, target["expr"], constants))
    return queries


def rules_file(docs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The rendered PrometheusRules' groups as a Prometheus rule file."""
    rules = of_kind(list(docs), "PrometheusRule")
    return {"groups": [group for rule in rules for group in rule["spec"]["groups"]]}
