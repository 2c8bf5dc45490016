"""SGLang's own argument parser accepts every argv the worker builds, and resolves flags the
way :mod:`sie_worker.config.flags.option_tables` says it does.

Each bundle's argvs meet the parser of the release that bundle runs: ``default`` and
``sglang-cu130`` the venv's SGLang 0.5.23, ``sglang`` SGLang 0.5.10.post1 from the ``--no-deps``
target folder that ``scripts/setup-tools`` installs (``.tools/sglang-0.5.10``;
``SIE_SGLANG_OLD_PATH`` points elsewhere). The parser runs in a subprocess (the worker never
imports SGLang). Without a parser the tests skip locally and fail in CI (``CI=true``).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import sglang_parser
from tests.support.ci import missing

from sie_worker.config.files.reader import parse_config
from sie_worker.config.flags import option_tables, reserved_flags
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import served_models
from sie_worker.engines.sglang.release import BUNDLE_VERSIONS, PINNED_VERSION, version_key
from sie_worker.settings import Settings
from sie_worker.worker.launcher.plan import plan_launch

ROOT = Path(__file__).resolve().parents[4]
TABLE_SCRIPT = ROOT / "scripts" / "sglang-options"
DATA = ROOT / "worker" / "src" / "sie_worker" / "config" / "data"
OLD_RELEASE = BUNDLE_VERSIONS["sglang"]
OLD_PATH = Path(os.environ.get("SIE_SGLANG_OLD_PATH", ROOT / ".tools" / "sglang-0.5.10"))
DEVICES = tuple(f"cuda:{i}" for i in range(8))
ADAPTERS = {
    "generation": "sie_server.adapters.sglang.generation:SGLangGenerationAdapter",
    "embedding": "sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter",
    "chat": "sie_server.adapters.sglang.chat:SGLangChatAdapter",
    "gemma": "sie_server.adapters.sglang.gemma:SGLangGemmaAdapter",
    "cuda13": "sie_server.adapters.sglang.cuda13:SGLangCuda13Adapter",
    "strict": "sie_server.adapters.sglang.cuda13:SGLangStrictThinkingAdapter",
}
# SIE's adapters that need SGLang 0.5.20 or later (its sglang-cu130 bundle).
CU130_ONLY = ("gemma", "cuda13", "strict")
SHA = "627c5ec1458b9086b841a91e0512fd31fd2fbbf1"
# Option sets layered over the minimum each width needs; every one is planned at every
# width, for every adapter and bundle.
OPTION_SETS: dict[str, dict[str, Any]] = {
    "minimal": {},
    "budgets": {"max_batch_tokens": 8192, "kv_budget_tokens": 65536, "compute_precision": "auto"},
    "float16": {"compute_precision": "float16"},
    "float32-revision": {"compute_precision": "float32", "revision": "v1.0"},
    "watchdog": {"loadtime": {"watchdog_timeout_s": 120.5}},
    "piecewise-on": {"loadtime": {"disable_piecewise_cuda_graph": True}},
    "piecewise-off": {"loadtime": {"disable_piecewise_cuda_graph": False}},
    "no-cuda-graph": {"loadtime": {"disable_cuda_graph": True}},
    "no-cuda-graph-flag": {"extra_launch_args": ["--disable-cuda-graph"]},
    "nccl-port": {"loadtime": {"nccl_port": 31000}, "min_width": 2},
    "extra-args": {"extra_launch_args": ["--mem-fraction-static", "0.85", "--trust-remote-code"]},
    "everything": {
        "max_batch_tokens": 4096,
        "kv_budget_tokens": 32768,
        "compute_precision": "bfloat16",
        "loadtime": {"watchdog_timeout_s": 600, "request_read_timeout_s": 30},
        "extra_launch_args": ["--log-level", "warning"],
    },
    # SIE's load-time options, as its catalogue writes them.
    "sie-common": {
        "compute_precision": None,
        "loadtime": {
            "mem_fraction_static": 0.8,
            "max_seq_length": 16384,
            "trust_remote_code": False,
            "revision": SHA,
            "compute_precision": "bfloat16",
        },
    },
    "sie-generation": {
        "generation_only": True,
        "loadtime": {
            "mem_fraction_static": 0.85,
            "attention_backend": "triton",
            "grammar_backend": "xgrammar",
            "reasoning_parser": "qwen3",
            "tool_call_parser": "qwen3_coder",
            "served_model_name": "test/model",
            "json_number_max_digits": 19,
        },
    },
    "sie-speculative": {
        "generation_only": True,
        "loadtime": {
            "speculative": {
                "enabled": True,
                "algorithm": "nextn",
                "num_steps": 3,
                "eagle_topk": 1,
                "num_draft_tokens": 4,
                "draft_model": "test/draft",
                "draft_model_revision": SHA,
            },
            "speculative_needs_extra_buffer": False,
        },
    },
    "loadtime-extra-args": {
        "loadtime": {"extra_launch_args": ["--stream-interval", "8"], "extra_env": {"A": "1"}}
    },
    "stream-interval": {"generation_only": True, "loadtime": {"stream_interval": 4}},
    # LoRA adapters in SIE's mapping form and SGLang's list forms (a pinned one as JSON).
    "lora-sie": {
        "loadtime": {
            "lora_paths": {"sql": "org/sql-lora", "java": {"id": "org/java-lora", "revision": SHA}},
            "max_loras_per_batch": 3,
        }
    },
    "lora-sglang": {
        "loadtime": {
            "lora_paths": [
                "sql=org/sql-lora",
                "org/bare-lora",
                {"lora_name": "p", "lora_path": "org/pinned-lora", "pinned": True},
            ],
        }
    },
}
BUNDLES = ("default", "sglang", "sglang-cu130")


def _bundles_of(release: str) -> tuple[str, ...]:
    """The bundles whose engine runs ``release``."""
    return tuple(b for b in BUNDLES if BUNDLE_VERSIONS.get(b, PINNED_VERSION) == release)


def _config(adapter: str, width: int, option_set: dict[str, Any]) -> dict[str, Any]:
    loadtime: dict[str, Any] = {"tensor_parallel_size": width, "startup_timeout_s": 600}
    if adapter != "embedding":
        loadtime["request_read_timeout_s"] = 300
    if adapter == "chat":
        loadtime["chat_template"] = "chatml"
    loadtime.update(option_set.get("loadtime", {}))
    task = (
        {"encode": {"max_sequence_length": 512}}
        if adapter == "embedding"
        else {"generate": {"context_length": 8192}}
    )
    profile: dict[str, Any] = {
        "adapter_path": ADAPTERS[adapter],
        "adapter_options": {"loadtime": loadtime},
    }
    for key in ("max_batch_tokens", "kv_budget_tokens", "compute_precision", "extra_launch_args"):
        if key in option_set:
            profile[key] = option_set[key]
    doc: dict[str, Any] = {
        "sie_id": f"test/{adapter}-{width}",
        "hf_id": "test/model",
        "tasks": task,
        "profiles": {"default": profile},
    }
    if "revision" in option_set:
        doc["revision"] = option_set["revision"]
    return doc


def _cases(sglang_version: str) -> Iterator[tuple[str, list[str]]]:
    for adapter, width, (name, option_set), bundle in itertools.product(
        ADAPTERS, (1, 2, 4, 8), OPTION_SETS.items(), _bundles_of(sglang_version)
    ):
        if width < option_set.get("min_width", 1):
            continue
        if option_set.get("generation_only") and adapter == "embedding":
            continue
        release = BUNDLE_VERSIONS.get(bundle, PINNED_VERSION)
        if adapter in CU130_ONLY and version_key(release) < (0, 5, 20):
            continue
        config = parse_config(_config(adapter, width, option_set), source="<test>")
        served = served_models(config)[0]
        settings = Settings(devices=DEVICES, bundle=bundle)
        options = resolve_load_options(served, settings, env={})
        plan = plan_launch(
            served,
            options,
            DEVICES[:width],
            port=30000,
            nccl_port=options.nccl_port or 30400,
            settings=settings,
            version=sglang_version,
        )
        argv = list(plan.argv)
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        yield f"{adapter}/width={width}/{name}/{bundle}", argv[3:]


def _run_parser(python_path: Path | None, request: dict[str, Any]) -> dict[str, Any]:
    return sglang_parser.parse(request, python_path)


def _prefix_tokens(options: list[str]) -> list[str]:
    """Every prefix (from ``--x``) of every option string, plus ``=value`` forms of each."""
    tokens = {s[:i] for s in options for i in range(3, len(s) + 1)}
    tokens |= {f"{t}=1" for t in list(tokens)}
    tokens |= {"--", "---tp", "-tp", "--tp 2", "--TP", "tp", "--port x"}
    return sorted(tokens)


def _release(version: str, python_path: Path | None, *, server_args: bool) -> dict[str, Any]:
    """Plan this release's argvs and run its parser on them (and ``ServerArgs`` when asked)."""
    cases = list(_cases(version))
    table = json.loads((DATA / f"sglang-options-{version}.json").read_text(encoding="utf-8"))
    tokens = _prefix_tokens(list(table["options"]))
    result = _run_parser(
        python_path,
        {
            "argvs": [argv for _, argv in cases],
            "tokens": tokens,
            "server_args": server_args,
            "table_script": str(TABLE_SCRIPT),
        },
    )
    return {
        "version": result["version"],
        "cases": cases,
        "argvs": result["argvs"],
        "tokens": tokens,
        "tokens_result": result["tokens"],
        "table": table,
        "table_text": result["table"],
    }


# Every test here runs a release of SGLang's own parser (torch imported with it).
pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def sglang_pinned() -> dict[str, Any]:
    if importlib.util.find_spec("sglang") is None:
        missing(
            f"no SGLang {PINNED_VERSION} in the venv: scripts/setup installs it "
            "(requirements/sglang-nodeps.txt)"
        )
    return _release(PINNED_VERSION, None, server_args=True)


@pytest.fixture(scope="module")
def sglang_old() -> dict[str, Any]:
    if not (OLD_PATH / "sglang").is_dir():
        missing(
            f"no SGLang {OLD_RELEASE} parser at {OLD_PATH}: scripts/setup-tools installs it "
            "(requirements/sglang-0.5.10-nodeps.txt), or point SIE_SGLANG_OLD_PATH at such a "
            "folder"
        )
    # Its ServerArgs.__post_init__ probes for an accelerator and loads the model's config, so
    # on a CPU machine only its argparse layer (what accepts or refuses an argv) is run.
    return _release(OLD_RELEASE, OLD_PATH, server_args=False)


# Module-scoped, so that the module's tests run in one xdist worker and each release is
# imported once (a function-scoped one hid the module fixtures from conftest's grouping).
@pytest.fixture(scope="module", params=[PINNED_VERSION, OLD_RELEASE])
def release(request: pytest.FixtureRequest) -> dict[str, Any]:
    fixture = "sglang_pinned" if request.param == PINNED_VERSION else "sglang_old"
    result: dict[str, Any] = request.getfixturevalue(fixture)
    return result


@pytest.mark.slow  # imports a whole SGLang release in a fresh interpreter
def test_parser_runs_the_release_under_test(release: dict[str, Any]) -> None:
    assert release["version"] == release["table"]["sglang"]


def test_every_bundle_is_checked_against_the_release_it_runs() -> None:
    assert set(_bundles_of(PINNED_VERSION)) == {"default", "sglang-cu130"}
    assert _bundles_of(OLD_RELEASE) == ("sglang",)
    assert OLD_RELEASE == "0.5.10.post1"
    assert set(_bundles_of(PINNED_VERSION) + _bundles_of(OLD_RELEASE)) == set(BUNDLES)


def _sglang_pin(lock: str) -> str:
    text = (ROOT / "requirements" / lock).read_text(encoding="utf-8")
    found = re.search(r"^sglang==(\S+)", text, re.MULTILINE)
    assert found, f"requirements/{lock} pins no sglang"
    return found.group(1)


def test_bundle_releases_are_the_ones_the_images_and_parsers_install() -> None:
    # The worker's fallback per bundle, the image locks and the parsers the tests run agree.
    assert _sglang_pin("bundle-sglang.txt") == BUNDLE_VERSIONS["sglang"]
    assert _sglang_pin("sglang-0.5.10-nodeps.txt") == BUNDLE_VERSIONS["sglang"]
    assert _sglang_pin("bundle-sglang-cu130.txt") == BUNDLE_VERSIONS["sglang-cu130"]
    assert _sglang_pin("sglang-nodeps.txt") == PINNED_VERSION


def test_every_planned_argv_is_for_a_bundle_of_the_release(release: dict[str, Any]) -> None:
    bundles = {name.rsplit("/", 1)[1] for name, _ in release["cases"]}
    assert bundles == set(_bundles_of(release["version"]))


def test_sglang_accepts_every_planned_argv(release: dict[str, Any]) -> None:
    refused = [
        f"{name}: {result['error']}\n    {' '.join(argv)}"
        for (name, argv), result in zip(release["cases"], release["argvs"], strict=True)
        if not result["ok"]
    ]
    assert not refused, "\n".join(refused)


def test_sglang_reads_width_ports_and_budgets_as_planned(release: dict[str, Any]) -> None:
    for (name, argv), result in zip(release["cases"], release["argvs"], strict=True):
        values = result["values"]
        # 0.5.10.post1 stores --tp-size as tensor_parallel_size, 0.5.23 as tp_size.
        tp_size = values.get("tp_size", values.get("tensor_parallel_size"))
        assert tp_size == int(argv[argv.index("--tp-size") + 1]), name
        assert (values["host"], values["port"], values["nccl_port"]) == (
            "127.0.0.1",
            30000,
            (31000 if "nccl-port" in name else 30400),
        ), name
        assert values["is_embedding"] == name.startswith("embedding"), name
        if "--max-prefill-tokens" in argv:
            assert values["max_prefill_tokens"] == int(argv[argv.index("--max-prefill-tokens") + 1])


def test_prefill_graph_capture_is_off_exactly_when_the_seed_says(release: dict[str, Any]) -> None:
    newer = version_key(release["version"]) >= (0, 5, 20)
    for (name, argv), result in zip(release["cases"], release["argvs"], strict=True):
        values = result["values"]
        width = int(argv[argv.index("--tp-size") + 1])
        if "no-cuda-graph" in name:
            expected_off = True  # everything off; the prefill switch is then irrelevant
        elif "piecewise-on" in name or "piecewise-off" in name:
            expected_off = "piecewise-on" in name
        else:
            # On sglang-cu130, and with SIE's adapters for it, off at every width.
            cu130 = name.endswith("/sglang-cu130") or name.split("/")[0] in CU130_ONLY
            expected_off = width > 1 or cu130
        prefill_off = (
            values.get("disable_prefill_cuda_graph") is True
            or values.get("disable_piecewise_cuda_graph") is True  # before 0.5.20
            or values.get("cuda_graph_backend_prefill") == "disabled"
            or values.get("disable_cuda_graph") is True
        )
        assert prefill_off == expected_off, name
        if "no-cuda-graph" not in name and expected_off and not newer:
            assert "--disable-piecewise-cuda-graph" in argv, name


def test_sglang_reads_sie_s_options_as_the_flags_they_mean(release: dict[str, Any]) -> None:
    expected = {
        "sie-common": {"mem_fraction_static": 0.8, "context_length": 16384, "revision": SHA,
                       "dtype": "bfloat16", "trust_remote_code": False},
        "sie-generation": {"attention_backend": "triton", "grammar_backend": "xgrammar",
                           "reasoning_parser": "qwen3", "tool_call_parser": "qwen3_coder",
                           "mem_fraction_static": 0.85, "trust_remote_code": True},
        "sie-speculative": {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3,
                            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                            "speculative_draft_model_path": "test/draft",
                            "speculative_draft_model_revision": SHA},
        "loadtime-extra-args": {"stream_interval": 8},
        "stream-interval": {"stream_interval": 4},
    }  # fmt: skip
    checked = 0
    for (name, _), result in zip(release["cases"], release["argvs"], strict=True):
        option_set = name.split("/")[2]
        for dest, value in expected.get(option_set, {}).items():
            assert result["values"][dest] == value, (name, dest)
            checked += 1
        if name.startswith("strict/"):
            assert result["values"]["enable_strict_thinking"] is True, name
    assert checked


def test_sglang_reads_the_lora_adapters_as_declared(release: dict[str, Any]) -> None:
    expected = {
        "lora-sie": (["sql=org/sql-lora", "java=org/java-lora"], 3),
        "lora-sglang": (
            ["sql=org/sql-lora", "org/bare-lora=org/bare-lora",
             {"lora_name": "p", "lora_path": "org/pinned-lora", "pinned": True}],
            None,
        ),
    }  # fmt: skip
    checked = 0
    for (name, _), result in zip(release["cases"], release["argvs"], strict=True):
        option_set = name.split("/")[2]
        values = result["values"]
        if option_set not in expected:
            assert not values.get("enable_lora"), name
            assert not values.get("lora_paths"), name
            continue
        paths, limit = expected[option_set]
        assert values["enable_lora"] is True, name
        assert values["lora_paths"] == paths, name
        # SIE's defaults when undeclared: 4 for generation, 8 for embeddings.
        default = 8 if name.startswith("embedding") else 4
        assert values["max_loras_per_batch"] == (limit or default), name
        checked += 1
    assert checked


def test_cuda_graphs_are_off_entirely_when_disable_cuda_graph_is_set(
    release: dict[str, Any],
) -> None:
    for (name, _), result in zip(release["cases"], release["argvs"], strict=True):
        if "no-cuda-graph" in name:
            values = result["values"]
            off = values.get("disable_cuda_graph") is True or (
                values.get("cuda_graph_backend_decode") == "disabled"
                and values.get("cuda_graph_backend_prefill") == "disabled"
            )
            assert off, name


def test_flag_resolution_matches_sglang_argparse_for_every_prefix(release: dict[str, Any]) -> None:
    table = option_tables.OptionTable(release["version"], release["table"]["options"])
    mismatches = []
    for token, oracle in zip(release["tokens"], release["tokens_result"], strict=True):
        match = option_tables.resolve(token, table)
        if oracle.get("ambiguous"):
            ok = match.ambiguous
        elif "dest" in oracle:
            ok = match.dest == oracle["dest"]
        else:
            ok = not match.candidates
        if not ok:
            mismatches.append((token, oracle, match))
    assert not mismatches, mismatches[:20]


def test_reserved_refusal_matches_what_sglang_would_set(release: dict[str, Any]) -> None:
    table = option_tables.OptionTable(release["version"], release["table"]["options"])
    for token, oracle in zip(release["tokens"], release["tokens_result"], strict=True):
        refused = reserved_flags.reserved_flag_problem(token, [table]) is not None
        if "dest" in oracle:
            assert refused == (oracle["dest"] in reserved_flags.RESERVED_DESTS), token
        elif oracle.get("ambiguous"):
            candidates = option_tables.resolve(token, table).dests
            assert refused == any(d in reserved_flags.RESERVED_DESTS for d in candidates), token
        else:
            assert not refused, token


def test_shipped_option_table_is_current(release: dict[str, Any]) -> None:
    shipped = (DATA / f"sglang-options-{release['version']}.json").read_text(encoding="utf-8")
    assert release["table_text"] == shipped, (
        f"sglang-options-{release['version']}.json is stale: run scripts/sglang-options"
    )
