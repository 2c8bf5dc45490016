#!/usr/bin/env python3
"""Write the chart's Grafana dashboards, chart/dashboards/*.json, with grafana-foundation-sdk.

Three dashboards, each a list of panels whose PromQL selects one release's series
(``namespace="$namespace", release="$release"``: hidden constants the chart sets per release,
with the release in the dashboard's uid and title, so two releases' dashboards never mix):

- ``fleet``: pools and replicas, serving slots, held requests and their age, in-flight and
  queued requests, model states, load time and load outcomes, the routers' decisions;
- ``worker``: per model: request rate, duration, time to first token, inter-token latency,
  in flight, state, the engine's waiting/running requests, KV cache use and throughput
  (SGLang's and vLLM's own series), and device memory;
- ``gateway``: routing decisions, requests and errors by code, held requests, hold time and
  outcomes, request duration, pods by state.

``$pool``, ``$bundle`` and ``$model`` are multi-value variables whose "All" is ``.*``.

Usage (with the project venv):
    .venv/bin/python chart/hack/dashboards.py          # write the files
    .venv/bin/python chart/hack/dashboards.py --check  # exit 1 when a file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

__all__ = ["DASHBOARDS", "OUTPUT", "Panel", "main", "render"]

CHART = Path(__file__).resolve().parent.parent
OUTPUT = CHART / "dashboards"
COMMAND = "chart/hack/dashboards.py"
_DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'namespace="$namespace",release="$release"'
POOL = f'{SEL},pool=~"$pool",bundle=~"$bundle"'
MODEL = f'{POOL},model=~"$model"'
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Panel:
    """One panel: its title, what it shows, its queries (PromQL, legend) and unit."""

    title: str
    description: str
    targets: tuple[tuple[str, str], ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    width: int = 12


def _quantiles(metric: str, by: str, sel: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{sel}}}{RATE})))",
            f"p{int(q * 100)} {{{{{by.split(', ')[-1]}}}}}",
        )
        for q in (0.5, 0.95)
    )


FLEET = (
    Panel(
        "Pods per pool",
        "Pods of each pool x bundle (one slot router each), and those the gateway counts ready.",
        (
            (f"count by (pool, bundle) (sie_router_slots{{{POOL}}})", "{{pool}}/{{bundle}} pods"),
            (
                f'max by (pool, bundle) (sie_gateway_pods{{{POOL},state="ready"}})',
                "{{pool}}/{{bundle}} ready (gateway)",
            ),
        ),
    ),
    Panel(
        "Serving slots",
        "Slots of each pool x bundle and how many report ready (their pinned models loaded).",
        (
            (f"sum by (pool, bundle) (sie_router_slots{{{POOL}}})", "{{pool}}/{{bundle}} slots"),
            (
                f"sum by (pool, bundle) (sie_router_slot_ready{{{POOL}}})",
                "{{pool}}/{{bundle}} ready",
            ),
        ),
    ),
    Panel(
        "Held requests",
        "Requests the gateway holds because the pool has no ready pod (what wakes a pool at "
        "zero replicas).",
        (
            (
                f"sum by (pool, bundle) (sie_gateway_pending_requests{{{POOL}}})",
                "{{pool}}/{{bundle}}",
            ),
        ),
    ),
    Panel(
        "Oldest held request",
        "How long the oldest held request of each pool has waited; at gateway.holdSec it is "
        "answered 503 provisioning.",
        (
            (
                f"max by (pool, bundle) (sie_gateway_oldest_held_seconds{{{POOL}}})",
                "{{pool}}/{{bundle}}",
            ),
        ),
        unit="s",
    ),
    Panel(
        "In-flight requests",
        "Requests the routers of each pool are serving (the autoscaling signal).",
        (
            (
                f"sum by (pool, bundle) (sie_router_inflight_requests{{{POOL}}})",
                "{{pool}}/{{bundle}}",
            ),
        ),
    ),
    Panel(
        "Queued requests",
        "Requests waiting at a router for a slot or for their model to load.",
        (
            (
                f"sum by (pool, bundle) (sie_router_queued_requests{{{POOL}}})",
                "{{pool}}/{{bundle}}",
            ),
        ),
    ),
    Panel(
        "Models by state",
        "Models on the workers of each pool by state (unloaded, loading, ready, failed).",
        ((f"sum by (pool, state) (sie_models{{{POOL}}})", "{{pool}} {{state}}"),),
    ),
    Panel(
        "Model load time",
        "Time from a load's start to its engine being ready (weight download included).",
        _quantiles("sie_model_load_duration_seconds", "pool", POOL),
        unit="s",
    ),
    Panel(
        "Model loads by outcome",
        "Loads that ended in the interval: ready, or the code of the error they failed with.",
        (
            (
                f"sum by (pool, outcome) (increase(sie_model_loads_total{{{POOL}}}{RATE}))",
                "{{pool}} {{outcome}}",
            ),
        ),
    ),
    Panel(
        "Engine exits and evictions",
        "Models stopped in the interval by reason (engine_exit: the engine crashed).",
        (
            (
                f"sum by (pool, reason) (increase(sie_model_evictions_total{{{POOL}}}{RATE}))",
                "{{pool}} {{reason}}",
            ),
        ),
    ),
    Panel(
        "Slot routing decisions",
        "Why each pod's router sent a request to its slot: prefix (it holds the longest cached "
        "prefix of the prompt), model ready, loading, free device, evict_lru, "
        "least_outstanding, named_slot (per second).",
        (
            (
                f"sum by (pool, reason) (rate(sie_router_decisions_total{{{POOL}}}{RATE}))",
                "{{pool}} {{reason}}",
            ),
        ),
        unit="reqps",
    ),
)

WORKER = (
    Panel(
        "Requests per second",
        "Requests answered per model and HTTP status.",
        (
            (
                f"sum by (model, code) (rate(sie_request_duration_seconds_count{{{MODEL}}}{RATE}))",
                "{{model}} {{code}}",
            ),
        ),
        unit="reqps",
    ),
    Panel(
        "Request duration",
        "Time to the last byte of the answer, per model.",
        _quantiles("sie_request_duration_seconds", "model", MODEL),
        unit="s",
    ),
    Panel(
        "Time to first token",
        "Streams: from the request's arrival at the worker to its first relayed event.",
        _quantiles("sie_time_to_first_token_seconds", "model", MODEL),
        unit="s",
    ),
    Panel(
        "Inter-token latency",
        "Streams: time between two relayed writes of events.",
        _quantiles("sie_inter_token_latency_seconds", "model", MODEL),
        unit="s",
    ),
    Panel(
        "In flight",
        "Requests being served per model.",
        ((f"sum by (model) (sie_inflight_requests{{{MODEL}}})", "{{model}}"),),
    ),
    Panel(
        "Model state",
        "Workers on which each model is in each state.",
        (
            (
                f"sum by (model, state) (sie_model_state{{{MODEL}}} == 1)",
                "{{model}} {{state}}",
            ),
        ),
    ),
    Panel(
        "Engine: waiting and running requests",
        "The engine's own queue and running batch, passed through by the worker: SGLang's "
        "sglang:num_queue_reqs and sglang:num_running_reqs, vLLM's vllm:num_requests_waiting "
        "and vllm:num_requests_running.",
        (
            (
                f"sum by (model) (sglang:num_queue_reqs{{{MODEL}}} "
                f"or vllm:num_requests_waiting{{{MODEL}}})",
                "{{model}} waiting",
            ),
            (
                f"sum by (model) (sglang:num_running_reqs{{{MODEL}}} "
                f"or vllm:num_requests_running{{{MODEL}}})",
                "{{model}} running",
            ),
        ),
    ),
    Panel(
        "Engine: KV cache use",
        "Share of the engine's KV cache in use (SGLang's sglang:token_usage, vLLM's "
        "vllm:kv_cache_usage_perc).",
        (
            (
                f"max by (model) (sglang:token_usage{{{MODEL}}} "
                f"or vllm:kv_cache_usage_perc{{{MODEL}}})",
                "{{model}}",
            ),
        ),
        unit="percentunit",
    ),
    Panel(
        "Engine: generation throughput",
        "Tokens per second the engine generates (SGLang's sglang:gen_throughput; vLLM's "
        "counter vllm:generation_tokens_total as a rate).",
        (
            (
                f"sum by (model) (sglang:gen_throughput{{{MODEL}}}) or sum by (model) "
                f"(rate(vllm:generation_tokens_total{{{MODEL}}}{RATE}))",
                "{{model}}",
            ),
        ),
    ),
    Panel(
        "Device memory reserved",
        "Share of each device's memory reserved by the models placed on it.",
        (
            (
                f"max by (pod, container, device) (sie_device_memory_reserved_bytes{{{POOL}}} "
                f"/ sie_device_memory_total_bytes{{{POOL}}})",
                "{{pod}} {{container}} {{device}}",
            ),
        ),
        unit="percentunit",
    ),
)

GATEWAY = (
    Panel(
        "Routing decisions",
        "Why each request went to its pod: prefix (it holds the longest cached prefix of the "
        "prompt), affinity or affinity_spill (session key), model ready, loading, free slot, "
        "least outstanding (per second).",
        (
            (
                f"sum by (pool, reason) (rate(sie_gateway_decisions_total{{{POOL}}}{RATE}))",
                "{{pool}} {{reason}}",
            ),
        ),
        unit="reqps",
    ),
    Panel(
        "Requests by code",
        "Answers per pool and HTTP status (per second).",
        (
            (
                f"sum by (pool, code) (rate(sie_gateway_requests_total{{{POOL}}}{RATE}))",
                "{{pool}} {{code}}",
            ),
        ),
        unit="reqps",
    ),
    Panel(
        "Errors by code",
        "Answers other than 2xx per pool and status: 429 queue_full, 503 provisioning, 502 "
        "engine_unavailable, ... (per second).",
        (
            (
                f'sum by (pool, code) (rate(sie_gateway_requests_total{{{POOL},code!~"2.."}}'
                f"{RATE}))",
                "{{pool}} {{code}}",
            ),
        ),
        unit="reqps",
    ),
    Panel(
        "Held requests",
        "Requests held now for a pool without a ready pod.",
        (
            (
                f"sum by (pool, bundle) (sie_gateway_pending_requests{{{POOL}}})",
                "{{pool}}/{{bundle}}",
            ),
        ),
    ),
    Panel(
        "Hold time",
        "How long held requests waited for a ready pod.",
        _quantiles("sie_gateway_hold_seconds", "pool", POOL),
        unit="s",
    ),
    Panel(
        "Hold outcomes",
        "How holds ended in the interval: served, provisioning (timed out), queue_full, "
        "drained, client_gone.",
        (
            (
                f"sum by (pool, outcome) (increase(sie_gateway_held_requests_total{{{POOL}}}"
                f"{RATE}))",
                "{{pool}} {{outcome}}",
            ),
        ),
    ),
    Panel(
        "Request duration",
        "From a request's arrival at the gateway to the end of its answer.",
        _quantiles("sie_gateway_request_duration_seconds", "pool", POOL),
        unit="s",
    ),
    Panel(
        "In flight",
        "Requests the gateway has relayed to each pool and not yet finished.",
        (
            (
                f"sum by (pool, bundle) (sie_gateway_inflight_requests{{{POOL}}})",
                "{{pool}}/{{bundle}}",
            ),
        ),
    ),
    Panel(
        "Pods by state",
        "Pods of each pool as the gateway sees them: discovered, up (answering), ready.",
        (
            (
                f"max by (pool, state) (sie_gateway_pods{{{POOL}}})",
                "{{pool}} {{state}}",
            ),
        ),
    ),
)

DASHBOARDS: dict[str, tuple[str, str, tuple[Panel, ...]]] = {
    "fleet": ("SIE fleet", "Pools, replicas, held requests and model loads.", FLEET),
    "worker": ("SIE workers", "Per model: requests, latency, engine saturation.", WORKER),
    "gateway": ("SIE gateway", "Routing decisions, holds and errors by code.", GATEWAY),
}


def _query_variable(name: str, label: str, query: str) -> gd.QueryVariable:
    return (
        gd.QueryVariable(name)
        .label(label)
        .datasource(_DATASOURCE)
        .query({"query": query, "refId": name})
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def _panel(panel: Panel) -> timeseries.Panel | stat.Panel:
    builder = timeseries.Panel() if panel.kind == "timeseries" else stat.Panel()
    builder.title(panel.title).description(panel.description).unit(panel.unit)
    builder.datasource(_DATASOURCE).span(panel.width).height(8)
    for index, (expr, legend) in enumerate(panel.targets):
        builder.with_target(
            prometheus.Dataquery().expr(expr).legend_format(legend).ref_id("ABCDEFGH"[index])
        )
    return builder


def build(name: str) -> dict[str, Any]:
    """One dashboard as plain JSON data (the chart sets uid, title and the constants)."""
    title, description, panels = DASHBOARDS[name]
    board = (
        gd.Dashboard(title)
        .uid(f"sie-{name}")
        .description(description)
        .tags(["sie-workers"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .editable()
        .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(gd.ConstantVariable("namespace").value(""))
        .with_variable(gd.ConstantVariable("release").value(""))
        .with_variable(
            _query_variable("pool", "Pool", f"label_values(sie_router_slots{{{SEL}}}, pool)")
        )
        .with_variable(
            _query_variable(
                "bundle", "Bundle", f'label_values(sie_router_slots{{{SEL},pool=~"$pool"}}, bundle)'
            )
        )
    )
    if name == "worker":
        board.with_variable(
            _query_variable(
                "model", "Model", f"label_values(sie_inflight_requests{{{POOL}}}, model)"
            )
        )
    for panel in panels:
        board.with_panel(_panel(panel))
    data: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(board.build()))
    return data


def render(name: str) -> str:
    return json.dumps(build(name), indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for name in DASHBOARDS:
        path = OUTPUT / f"{name}.json"
        text = render(name)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(CHART.parent)))
            continue
        OUTPUT.mkdir(exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
        print(f"wrote {path.relative_to(CHART.parent)}")
    if stale:
        print(f"stale: {', '.join(stale)}; run .venv/bin/python {COMMAND}", file=sys.stderr)
        return 1
    if args.check:
        print("chart/dashboards are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
