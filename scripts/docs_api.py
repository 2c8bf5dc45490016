"""Generated docs pages from what the servers and the chart publish (used by docs_reference.py).

- api-worker.md and openapi-worker.json: the worker's OpenAPI document, ``/openapi.json``
  (sie_worker.worker.openapi.spec)
- api-router.md, api-gateway.md: the route tables of the slot router and the gateway (they
  publish no OpenAPI document; their routes are the worker's, relayed): method, path, handler
- metrics.md: the collectors of the worker's, slot router's and gateway's registries, and
  the model-server series (sie_worker.model_server_series) the worker and router serve
- chart-values.md: chart/values.schema.json with the defaults of chart/values.yaml
- docs/operations.md: alerts (with the runbook anchors the chart's PrometheusRule links to:
  the alert name in lower case), dashboards and autoscaling, from chart/README.md's sections,
  checked against the alerts chart/templates/_helpers-alerts.tpl defines
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from starlette.routing import Route

__all__ = ["pages"]


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- the worker's OpenAPI document -----------------------------------------------------------


def _schema_name(schema: Mapping[str, Any] | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[1]
        return f"[`{name}`](#{name.lower()})"
    return f"`{schema.get('type', 'any')}`"


def _worker_api(spec: Mapping[str, Any]) -> str:
    out = [
        f"# Worker API\n\nThe worker's OpenAPI {spec['openapi']} document, as it serves it at ",
        "`GET /openapi.json` ([download](openapi-worker.json); the server adds `info.version`, ",
        "its release). The slot router and the gateway ",
        "answer the same paths ([router](api-router.md), [gateway](api-gateway.md)). Errors: ",
        "[error codes](errors.md).\n\n",
    ]
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            out.append(f"## {method.upper()} `{path}`\n\n**{op.get('summary', '')}**")
            if op.get("description"):
                out.append(f": {op['description']}")
            out.append("\n\n")
            params = op.get("parameters", [])
            if params:
                rows = [
                    (
                        f"`{p['name']}`",
                        p["in"],
                        "yes" if p.get("required") else "no",
                        p.get("description", ""),
                    )
                    for p in params
                ]
                out.append(_table(("parameter", "in", "required", "description"), rows) + "\n")
            body = op.get("requestBody", {}).get("content", {})
            if body:
                kinds = ", ".join(f"`{k}` {_schema_name(v.get('schema'))}" for k, v in body.items())
                out.append(f"Body: {kinds}\n\n")
            answers: list[tuple[str, str, str]] = []
            for status, answer in op.get("responses", {}).items():
                content = answer.get("content", {})
                kinds = ", ".join(
                    f"`{k}` {_schema_name(v.get('schema'))}" for k, v in content.items()
                )
                answers.append((str(status), answer.get("description", ""), kinds))
            out.append(_table(("status", "answer", "body"), answers) + "\n")
    out.append("## Schemas\n\n")
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        out.append(f"### {name}\n\n```json\n{json.dumps(schema, indent=2)}\n```\n\n")
    return "".join(out)


# --- the router's and the gateway's routes ---------------------------------------------------


def _routes(routes: Iterable[Any]) -> list[tuple[str, str, str]]:
    rows = []
    for route in routes:
        if not isinstance(route, Route):
            continue
        endpoint = route.endpoint
        while isinstance(endpoint, functools.partial):  # as Starlette unwraps it
            endpoint = endpoint.func
        doc = inspect.getdoc(endpoint) or ""
        methods = sorted((route.methods or set()) - {"HEAD"})
        name = getattr(endpoint, "__name__", "")
        rows.append((", ".join(methods), f"`{route.path}`", doc.split("\n\n", 1)[0] or f"`{name}`"))
    return rows


def _router_api() -> str:
    from sie_worker.router.app import create_router_app
    from sie_worker.router.settings import RouterSettings

    app = create_router_app(RouterSettings())
    return "".join(
        [
            "# Slot router API\n\n",
            "The routes of `sie-worker route`, in the order it matches them. Requests that name a ",
            "model go to one worker slot of the pod and are relayed unchanged, so bodies and ",
            "answers are the [worker's](api-worker.md); what the router adds: ",
            "[The slot router](../router.md).\n\n",
            _table(("methods", "path", "handler"), _routes(app.routes)),
        ]
    )


def _gateway_api() -> str:
    from sie_worker.gateway.routes import ROUTES

    return "".join(
        [
            "# Gateway API\n\n",
            "The routes of `sie-worker gateway`, in the order it matches them. Requests that name ",
            "a model go to one pod of a pool and are relayed unchanged, so bodies and answers are ",
            "the [worker's](api-worker.md), plus the gateway's own refusals ",
            "([error codes](errors.md)); pool choice and holding: ",
            "[The gateway](../gateway.md).\n\n",
            _table(("methods", "path", "handler"), _routes(ROUTES)),
        ]
    )


# --- metrics ---------------------------------------------------------------------------------


# Labels whose values are the deployment's (models, devices, slots, pools), not the code's.
_OPEN_LABELS = frozenset({"model", "device", "slot", "pool", "bundle", "adapter", "le"})


def _registry_rows(registry: CollectorRegistry) -> list[tuple[str, str, str, str]]:
    """One row per series: name, type, labels (with the values the code starts every
    labelled counter at, where they are a fixed set) and help."""
    rows = []
    for collector in getattr(registry, "_collector_to_names", {}):
        labels = tuple(getattr(collector, "_labelnames", ()))
        values: dict[str, set[str]] = {label: set() for label in labels}
        for family in collector.collect():
            for sample in family.samples:
                for label, value in sample.labels.items():
                    values.setdefault(label, set()).add(value)
        shown = []
        for label in labels:
            known = sorted(values[label]) if label not in _OPEN_LABELS else []
            shown.append(f"`{label}`" + (f" ({', '.join(known)})" if known else ""))
        for family in collector.describe() if hasattr(collector, "describe") else []:
            name = family.name + ("_total" if family.type == "counter" else "")
            rows.append((f"`{name}`", family.type, ", ".join(shown), family.documentation))
    return sorted(rows)


def _metrics() -> str:
    from sie_worker.gateway.metrics import GatewayMetrics
    from sie_worker.gateway.pools import PoolKey
    from sie_worker.router.metrics import RouterMetrics
    from sie_worker.worker.metrics import WorkerMetrics

    sources = (
        ("Worker", "each worker container's `/metrics`", WorkerMetrics(["cuda:0"]).registry),
        ("Slot router", "each pod's router `/metrics`", RouterMetrics(1).registry),
        ("Gateway", "the gateway's `/metrics`", GatewayMetrics([PoolKey("p", "b")]).registry),
    )
    out = [
        "# Metrics\n\n",
        "The series each process declares, with their labels (besides those Prometheus adds ",
        "for the target) and, where the code fixes them, the values a label takes (each ",
        "labelled counter starts at zero for every one of them). Engines' own series ",
        "(`sglang:*`, `vllm:*`) are passed through on the ",
        "worker's `/metrics` with a `model` label. Which alert reads which series: ",
        "[Operations](../operations.md).\n\n",
    ]
    for title, where, registry in sources:
        out.append(f"## {title}\n\nServed on {where}.\n\n")
        out.append(_table(("series", "type", "labels", "help"), _registry_rows(registry)) + "\n")
    out.append(
        "## Model-server series\n\nWhat the Gateway API Inference Extension's endpoint picker "
        "reads: served by each worker for its engines, and by each slot router for its pod.\n\n"
    )
    out.append(_table(("series", "type", "labels", "help"), _model_server_rows()) + "\n")
    return "".join(out)


def _model_server_rows() -> list[tuple[str, str, str, str]]:
    from prometheus_client.parser import text_string_to_metric_families
    from sie_worker.model_server_series import ServerLoad, render

    text = render(ServerLoad(ready=frozenset({"m"}), max_lora=1)).decode()
    rows = []
    for family in text_string_to_metric_families(text):
        labels = sorted({k for sample in family.samples for k in sample.labels})
        rows.append(
            (
                f"`{family.name}`",
                family.type,
                ", ".join(f"`{x}`" for x in labels),
                family.documentation,
            )
        )
    return sorted(rows)


# --- chart values ----------------------------------------------------------------------------


def _type_of(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        return f"array of {_type_of(schema['items'], defs)}"
    if "oneOf" in schema or "anyOf" in schema:
        return " or ".join(_type_of(s, defs) for s in schema.get("oneOf", schema.get("anyOf")))
    return str(kind)


def _default(values: Any, path: Sequence[str]) -> str:
    for key in path:
        if not isinstance(values, Mapping) or key not in values:
            return ""
        values = values[key]
    shown = json.dumps(values)
    return f"`{shown}`" if len(shown) <= 60 else "(see values.yaml)"


def _walk(
    schema: Mapping[str, Any],
    path: list[str],
    defs: Mapping[str, Any],
    values: Any,
    rows: list[tuple[str, str, str, str]],
) -> None:
    target = schema
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name in {"pool"}:  # shared blocks with properties of their own: expand in place
            target = {**defs[name], "description": schema.get("description", "")}
    props = target.get("properties")
    if path:
        description = schema.get("description") or target.get("description", "")
        kind = "object" if props else _type_of(schema, defs)
        rows.append((f"`{'.'.join(path)}`", kind, _default(values, path), description))
    for key, sub in (props or {}).items():
        _walk(sub, [*path, key], defs, values, rows)
    extra = target.get("additionalProperties")
    if isinstance(extra, Mapping) and extra:
        placeholder = "<pool>" if path[-1:] == ["pools"] else "<name>"
        _walk(extra, [*path, placeholder], defs, {}, rows)


def _chart_values(root: Path) -> str:
    schema = json.loads((root / "chart" / "values.schema.json").read_text(encoding="utf-8"))
    values = yaml.safe_load((root / "chart" / "values.yaml").read_text(encoding="utf-8"))
    defs = schema.get("$defs", {})
    rows: list[tuple[str, str, str, str]] = []
    _walk(schema, [], defs, values, rows)
    pool = "`workers.pools.<pool>"
    pool_rows = [r for r in rows if r[0].startswith(pool)]
    # One section per top-level key with keys of its own; the single values together.
    tops = {row[0].strip("`").split(".", 1)[0] for row in rows if "." in row[0]}
    sections: dict[str, list[tuple[str, str, str, str]]] = {}
    for row in rows:
        if not row[0].startswith(pool):
            top = row[0].strip("`").split(".", 1)[0]
            sections.setdefault(top if top in tops else "Other values", []).append(row)
    out = [
        "# Chart values\n\n",
        "Every value of the `sie-workers` chart, from `chart/values.schema.json` (which `helm` ",
        "checks at render time) with its default from `chart/values.yaml`. A pool is one entry ",
        "of `workers.pools` (`workers.pools.<pool>.*` below). How pools, slots and widths ",
        "relate, and worked examples: the [chart README](https://github.com/sie-workers/",
        "sie-workers/blob/main/chart/README.md) and [Device groups](../device-groups.md).\n\n",
        "## A pool\n\n",
        f"{defs['pool'].get('description', '')} The keys of one `workers.pools.<pool>` entry ",
        "(no defaults: a pool sets what it needs; `workers.common` fills the rest).\n\n",
        _table(("value", "type", "default", "description"), pool_rows),
    ]
    for name, section in sorted(sections.items(), key=lambda item: item[0] == "Other values"):
        out += [f"\n## {name}\n\n", _table(("value", "type", "default", "description"), section)]
    out.append("\n## Types\n\n")
    for name, sub in defs.items():
        out.append(f"### {name}\n\n{sub.get('description', '')}\n\n")
        shown = {k: v for k, v in sub.items() if k != "description"}
        out.append(f"```json\n{json.dumps(shown, indent=2)}\n```\n\n")
    return "".join(out)


# --- operations ------------------------------------------------------------------------------


def _section(text: str, heading: str) -> str:
    """One section of a markdown file: from its heading to the next of the same level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(f"\n{heading}\n") + 1
    stop = re.compile(rf"^#{{1,{level}}} ", re.M)
    end = stop.search(text, start + len(heading) + 1)
    return text[start : end.start() if end else len(text)]


def _operations(root: Path) -> str:
    readme = (root / "chart" / "README.md").read_text(encoding="utf-8")
    alerts_tpl = (root / "chart" / "templates" / "_helpers-alerts.tpl").read_text(encoding="utf-8")
    defined = re.findall(r'"alert" "(\w+)"', alerts_tpl)
    observability = _section(readme, "## Observability")
    missing = [a for a in defined if f"\n#### {a}\n" not in observability]
    if missing:
        raise SystemExit(f"chart/README.md has no runbook section for the alerts {missing}")
    # One level up: the chart README's "## Observability" is this page's title.
    body = re.sub(r"^#(#+) ", r"\1 ", observability.split("\n", 1)[1], flags=re.M)
    body = body.replace(
        "](#", "](https://github.com/sie-workers/sie-workers/blob/main/chart/README.md#"
    )
    # Autoscaling stays a section of this page, at its level.
    scaling = _section(readme, "## Autoscaling").replace("## Autoscaling", "## Scaling", 1)
    return "".join(
        [
            "# Operations\n\n",
            "Alerts, dashboards and scaling of a release. Each alert's `runbook_url` is ",
            "`metrics.prometheusRule.runbookBaseUrl` + `#` + the alert name in lower case: set ",
            "`runbookBaseUrl` to this page's address and every alert links to its section below ",
            "(the default points at the chart README, which holds the same text). Every series ",
            "and its labels: [Metrics](reference/metrics.md).\n\n",
            f"The chart defines {len(defined)} alerts: ",
            ", ".join(f"[{a}](#{a.lower()})" for a in defined),
            ".\n",
            body.rstrip("\n").replace("\n### Alerts\n", "\n## Alerts\n") + "\n\n",
            scaling.rstrip("\n") + "\n",
        ]
    )


def pages(root: Path) -> dict[Path, str]:
    from sie_worker.worker.openapi import spec

    ref = root / "docs" / "reference"
    # Without info.version: the server fills in the release it runs, and a version bump
    # (make version) should not make the page stale.
    document = spec()
    document["info"] = {k: v for k, v in document["info"].items() if k != "version"}
    return {
        ref / "api-worker.md": _worker_api(document),
        ref / "openapi-worker.json": json.dumps(document, indent=2) + "\n",
        ref / "api-router.md": _router_api(),
        ref / "api-gateway.md": _gateway_api(),
        ref / "metrics.md": _metrics(),
        ref / "chart-values.md": _chart_values(root),
        root / "docs" / "operations.md": _operations(root),
    }
