"""The chart refuses at render exactly what the worker refuses when it reads a model config:
reserved engine flags in ``extra_launch_args`` and device-visibility variables in
``extra_env``, in a profile and in its ``adapter_options.loadtime``. The chart's tables are
generated from the worker's (scripts/chart_tables.py); these tests fail when the generated
file is stale and when chart and worker disagree on any token of a large tricky set."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from sie_worker.config.files.jsonpath import json_path
from sie_worker.config.flags.option_tables import option_tables
from sie_worker.config.flags.reserved_flags import (
    RESERVED_DESTS,
    VLLM_RESERVED_DESTS,
    reserved_flag_problem,
)
from sie_worker.config.rules import VISIBILITY_VARIABLES, rule_problems
from sie_worker.engines.llamacpp.reserved import RESERVED as LLAMACPP_RESERVED

from tests.chart._render import CHART, helm
from tests.support.repo import load_script

_TABLES = load_script("chart_tables")
_MODEL = "tricky-model"
_VLLM = "sie_server.adapters.vllm.generation:VLLMGenerationAdapter"
_PROFILE = "fast"
_PLACES = {
    "profile": (),
    "loadtime": ("adapter_options", "loadtime"),
}
# One problem line: "- <key>[<index>]: ...", "- <key>.<NAME>: ..." or "- <key>[<Go %q name>]: ...".
_PROBLEM = re.compile(
    r"^- (?P<key>[^\n]*?)"
    r"(?:\[(?P<index>\d+)\]|\[(?P<quoted>\"(?:[^\"\\]|\\.)*\")\]|\.(?P<name>[A-Za-z_]\w*))"
    r": (?P<message>.*)$",
    re.ASCII,
)


def test_generated_chart_tables_are_current() -> None:
    shipped = _TABLES.OUTPUT.read_text(encoding="utf-8") if _TABLES.OUTPUT.is_file() else ""
    assert shipped == _TABLES.render(), (
        f"{_TABLES.OUTPUT.relative_to(CHART.parent)} is stale: "
        "run .venv/bin/python scripts/chart_tables.py"
    )


def _tricky_tokens(engine: str = "sglang") -> list[str]:
    """Every prefix of every option string of the engine's releases, plain and as
    ``--flag=value``; each prefix of a reserved option string also with spaces, case, other
    separators (and for vLLM, whose parser rewrites them, underscores and ``.key``)."""
    tables = option_tables(engine)
    reserved = VLLM_RESERVED_DESTS if engine == "vllm" else RESERVED_DESTS
    prefixes = {
        option[:end] for t in tables for option in t.options for end in range(1, len(option) + 1)
    }
    near_reserved = {
        option[:end]
        for t in tables
        for option, dest in t.options.items()
        if dest in reserved
        for end in range(1, len(option) + 1)
    }
    tokens = prefixes | {f"{p}=2" for p in prefixes}
    for p in near_reserved:
        tokens |= {
            f"{p}=",
            f"{p}==2",
            f"{p}= 2",
            f"{p} 2",
            f"{p} =2",
            f"{p} 2=3",
            f"{p}=2 3",
            f"{p}\t2",
            f"{p}\n",
            f"{p}\u00a0",
            f" {p}",
            f"-{p}",
            p.upper(),
            p.replace("-", "_"),
            p + "x",
        }
        if engine == "vllm":
            tokens |= {f"{p}.x", f"{p}.x=2", f"{p}.x y", p.replace("-", "_").replace("__", "--", 1)}
    tokens |= {"", "-", "--", "--=", "---", "-tp", "-p", "\u2014tp", "--t\uff50", "--tp\x00"}
    return sorted(tokens)


def _refusals(place: str, values: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    """``{path suffix: message}`` the chart refuses at ``place`` of the model's profile."""
    values_file = tmp_path / "values.yaml"
    values_file.write_text(json.dumps(values), encoding="utf-8")
    done = helm("template", "sie", str(CHART), "-n", "sie", "-f", str(values_file), check=False)
    key = ".".join(["models", _MODEL, "profiles", _PROFILE, *_PLACES[place]])
    found: dict[str, str] = {}
    for line in done.stderr.splitlines():
        match = _PROBLEM.match(line)
        if match is None or not match.group("key").startswith(key + "."):
            continue
        field = match.group("key")[len(key) + 1 :]
        which = match.group("index") or match.group("name") or _go_unquote(match.group("quoted"))
        found[f"{field}:{which}"] = match.group("message")
    if not found:
        assert done.returncode == 0, done.stderr[-2000:]
    return found


_GO_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _go_unquote(quoted: str) -> str:
    """The string Go's ``%q`` printed as ``quoted``."""

    def one(match: re.Match[str]) -> str:
        escape = match.group(1)
        if escape[0] in "xuU" and len(escape) > 1:
            return chr(int(escape[1:], 16))
        return _GO_ESCAPES.get(escape, escape)

    return re.sub(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", one, quoted[1:-1])


def _values(place: str, settings: dict[str, Any], adapter: str | None = None) -> dict[str, Any]:
    node: dict[str, Any] = dict(settings)
    for part in reversed(_PLACES[place]):
        node = {part: node}
    if adapter is not None:
        node["adapter_path"] = adapter
    return {"models": {_MODEL: {"sie_id": "org/tricky", "profiles": {_PROFILE: node}}}}


@pytest.mark.parametrize("place", sorted(_PLACES))
def test_chart_refuses_exactly_the_launch_args_the_worker_refuses(
    place: str, tmp_path: Path
) -> None:
    tokens = _tricky_tokens()
    worker = {
        i: message
        for i, token in enumerate(tokens)
        if (message := reserved_flag_problem(token)) is not None
    }
    assert len(worker) > 1000  # the set is tricky enough to mean something
    chart = _refusals(place, _values(place, {"extra_launch_args": tokens}), tmp_path)
    refused = {
        int(k.split(":", 1)[1]): v for k, v in chart.items() if k.startswith("extra_launch_args:")
    }
    assert sorted(refused) == sorted(worker), "chart and worker disagree on: " + ", ".join(
        repr(tokens[i]) for i in sorted(set(refused) ^ set(worker))[:20]
    )
    for index, message in worker.items():
        after_token = message[len(repr(tokens[index])) :]
        assert refused[index].endswith(after_token), (tokens[index], refused[index])
        assert refused[index].startswith(json.dumps(tokens[index])[0])


@pytest.mark.parametrize("place", sorted(_PLACES))
def test_chart_reads_a_vllm_profiles_launch_args_as_the_worker_does(
    place: str, tmp_path: Path
) -> None:
    tokens = _tricky_tokens("vllm")
    doc = {"profiles": {"default": {"adapter_path": _VLLM, "extra_launch_args": tokens}}}
    worker = {
        int(p.path.rsplit("[", 1)[1].rstrip("]")): p.message
        for p in rule_problems(doc)
        if p.path.startswith("$.profiles.default.extra_launch_args[")
    }
    assert len(worker) > 1000
    values = _values(place, {"extra_launch_args": tokens}, adapter=_VLLM)
    chart = _refusals(place, values, tmp_path)
    refused = {
        int(k.split(":", 1)[1]): v for k, v in chart.items() if k.startswith("extra_launch_args:")
    }
    assert sorted(refused) == sorted(worker), "chart and worker disagree on: " + ", ".join(
        repr(tokens[i]) for i in sorted(set(refused) ^ set(worker))[:20]
    )
    for index, message in worker.items():
        assert refused[index].endswith(message[len(repr(tokens[index])) :]), tokens[index]


def test_chart_refuses_vllms_core_binding_in_extra_env(tmp_path: Path) -> None:
    env = {"vllm_cpu_omp_threads_bind ": "0|1", "VLLM_CPU_KVCACHE_SPACE": "4"}
    problems = rule_problems({"profiles": {"default": {"extra_env": env}}})
    assert [p.path for p in problems if "extra_env" in p.path] == [
        json_path(["profiles", "default", "extra_env", "vllm_cpu_omp_threads_bind "])
    ]
    chart = _refusals("profile", _values("profile", {"extra_env": env}), tmp_path)
    assert list(chart) == ["extra_env:vllm_cpu_omp_threads_bind "]
    assert "which the launcher writes itself" in chart["extra_env:vllm_cpu_omp_threads_bind "]


def _tricky_env_names() -> list[str]:
    spaces = _TABLES.PYTHON_WHITESPACE
    names: set[str] = set()
    for variable in VISIBILITY_VARIABLES:
        for spelling in {variable, variable.lower(), variable.title(), variable.swapcase()}:
            names |= {spelling, f" {spelling} ", f"{spelling}\u200b", f"x{spelling}"}
            names |= {spelling[:-1], spelling.replace("_", "-"), spelling.replace("_", " _")}
            names |= {c + spelling for c in spaces} | {spelling + c for c in spaces}
        names |= {variable.lower().replace("i", "\u0131"), variable.lower().replace("s", "\u017f")}
    return sorted(names | {"SIE_FOO", "PATH", "cuda"})


@pytest.mark.parametrize("place", sorted(_PLACES))
def test_chart_refuses_exactly_the_env_names_the_worker_refuses(place: str, tmp_path: Path) -> None:
    names = _tricky_env_names()
    env = dict.fromkeys(names, "0")
    problems = rule_problems({"profiles": {"default": {"extra_env": env}}})
    worker = {p.path for p in problems if "device-visibility" in p.message}
    worker_names = {
        n for n in names if json_path(["profiles", "default", "extra_env", n]) in worker
    }
    assert len(worker_names) > 100
    chart = _refusals(place, _values(place, {"extra_env": env}), tmp_path)
    chart_names = {k.split(":", 1)[1] for k in chart if k.startswith("extra_env:")}
    assert chart_names == worker_names, sorted(chart_names ^ worker_names)[:20]


def test_chart_names_model_profile_item_and_flag_for_an_abbreviated_flag(tmp_path: Path) -> None:
    values = _values("profile", {"extra_launch_args": ["--mem-fraction-static", "0.8", "--tp=2"]})
    chart = _refusals("profile", values, tmp_path)
    assert chart == {
        "extra_launch_args:2": '"--tp=2" abbreviates the reserved flag '
        "--tensor-parallel-size/--tp-size (SGLang accepts any unambiguous prefix): the worker "
        "sets it from the declared width; remove it and set "
        "adapter_options.loadtime.tensor_parallel_size"
    }


_LLAMACPP = "sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter"


def _llamacpp_tokens() -> list[str]:
    """llama-server's reserved spellings plain, with underscores, cased, as prefixes and as
    ``--flag=value``, and flags and values the worker lets through."""
    tokens: set[str] = {"-fa", "on", "--cache-reuse", "256", "-1", "--", "x=y", "-t=2"}
    for spelling in LLAMACPP_RESERVED:
        tokens |= {spelling, spelling.upper(), spelling[:-1], f"{spelling}=1", f"{spelling} 1"}
        tokens |= {spelling.replace("-", "_"), "--" + spelling[2:].replace("-", "_")}
    return sorted(tokens)


@pytest.mark.parametrize("place", sorted(_PLACES))
def test_chart_reads_a_llamacpp_profiles_launch_args_as_the_worker_does(
    place: str, tmp_path: Path
) -> None:
    tokens = _llamacpp_tokens()
    doc = {"profiles": {"default": {"adapter_path": _LLAMACPP, "extra_launch_args": tokens}}}
    worker = {
        int(p.path.rsplit("[", 1)[1].rstrip("]")): p.message
        for p in rule_problems(doc)
        if p.path.startswith("$.profiles.default.extra_launch_args[")
    }
    assert len(worker) > 50
    values = _values(place, {"extra_launch_args": tokens}, adapter=_LLAMACPP)
    chart = _refusals(place, values, tmp_path)
    refused = {
        int(k.split(":", 1)[1]): v for k, v in chart.items() if k.startswith("extra_launch_args:")
    }
    assert sorted(refused) == sorted(worker), "chart and worker disagree on: " + ", ".join(
        repr(tokens[i]) for i in sorted(set(refused) ^ set(worker))[:20]
    )
    for index, message in worker.items():
        # The chart quotes as Go's %q does, the worker as Python's repr: compare the words.
        assert refused[index].replace('"', "'") == message.replace('"', "'"), tokens[index]


def test_chart_refuses_the_variables_llamacpp_reads_as_flags(tmp_path: Path) -> None:
    env = {"LLAMA_ARG_N_GPU_LAYERS": "9", " llama_api_key": "k", "LLAMA_HOME": "/x"}
    problems = rule_problems({"profiles": {"default": {"extra_env": env}}})
    worker = {p.path: p.message for p in problems if "extra_env" in p.path}
    chart = _refusals("profile", _values("profile", {"extra_env": env}), tmp_path)
    assert sorted(chart) == ["extra_env: llama_api_key", "extra_env:LLAMA_ARG_N_GPU_LAYERS"]
    for name in ("LLAMA_ARG_N_GPU_LAYERS", " llama_api_key"):
        message = worker[json_path(["profiles", "default", "extra_env", name])]
        assert chart[f"extra_env:{name}"].replace('"', "'") == message.replace('"', "'")
