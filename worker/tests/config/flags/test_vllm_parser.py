"""vLLM's own argument parser accepts every argv the worker builds for it, reads the width,
listener, memory and LoRA flags as planned, and resolves flags the way
:mod:`sie_worker.config.flags.option_tables` says it does (FlexibleArgumentParser's rewriting
included), so the reserved-flag refusals are exactly what vLLM would read as them.

The parser is the release the ``vllm`` bundle runs, from ``.venv-vllm`` (vLLM's CPU build of
that release, scripts/setup-vllm), in a subprocess: the worker never imports vLLM. These tests
run in the ``pytest vllm`` step; without ``.venv-vllm`` they fail, saying how to make it.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.vllm_engine import VLLM_PYTHON

from sie_worker.config.files.reader import parse_config
from sie_worker.config.flags import option_tables, reserved_flags
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import served_models
from sie_worker.engines.vllm.release import BUNDLE_VERSIONS, PINNED_VERSION
from sie_worker.settings import Settings
from sie_worker.sizing.memory_needs import EngineShare
from sie_worker.worker.launcher.plan import plan_launch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[4]
HARNESS = ROOT / "tests" / "support" / "vllm_parser_harness.py"
TABLE_SCRIPT = ROOT / "scripts" / "vllm-options"
DATA = ROOT / "worker" / "src" / "sie_worker" / "config" / "data"
GPUS = tuple(f"cuda:{i}" for i in range(8))
CPUS = tuple(f"cpu:{i}" for i in range(4))
ADAPTERS = {
    "generation": "sie_server.adapters.vllm.generation:VLLMGenerationAdapter",
    "embedding": "sie_server.adapters.vllm.embedding:VLLMEmbeddingAdapter",
}
OPTION_SETS: dict[str, dict[str, Any]] = {
    "minimal": {},
    "memory": {"loadtime": {"gpu_memory_utilization": 0.45}},
    "everything": {
        "compute_precision": "bfloat16",
        "revision": "v1.0",
        "loadtime": {
            "max_seq_length": 4096,
            "trust_remote_code": False,
            "enforce_eager": True,
            "quantization": "fp8",
            "kv_cache_dtype": "fp8",
            "enable_prefix_caching": False,
        },
        "extra_launch_args": ["--max-num-seqs", "8", "--block-size=16"],
    },
    "switches-on": {"loadtime": {"enforce_eager": False, "enable_prefix_caching": True}},
    "nccl-port": {"loadtime": {"nccl_port": 31000}, "min_width": 2},
    "lora": {
        "loadtime": {
            "lora_paths": {"sql": "org/sql-lora", "chat": "org/chat-lora"},
            "max_loras_per_batch": 2,
            "max_lora_rank": 32,
        },
        "generation_only": True,
    },
}


def _config(adapter: str, width: int, option_set: dict[str, Any]) -> dict[str, Any]:
    loadtime = {"tensor_parallel_size": width, **option_set.get("loadtime", {})}
    if adapter == "generation" and width > 1:
        loadtime |= {"startup_timeout_s": 600, "request_read_timeout_s": 120}
    profile: dict[str, Any] = {
        "adapter_path": ADAPTERS[adapter],
        "adapter_options": {"loadtime": loadtime},
    }
    for key in ("compute_precision", "extra_launch_args"):
        if key in option_set:
            profile[key] = option_set[key]
    doc: dict[str, Any] = {
        "sie_id": f"test/{adapter}-{width}",
        "hf_id": "test/model",
        "tasks": {"encode": {}} if adapter == "embedding" else {"generate": {}},
        "profiles": {"default": profile},
    }
    if "revision" in option_set:
        doc["hf_revision"] = option_set["revision"]
    return doc


def _cases() -> Iterator[tuple[str, dict[str, Any], list[str]]]:
    for adapter, width, (name, option_set), devices in itertools.product(
        ADAPTERS, (1, 2, 4, 8), OPTION_SETS.items(), (GPUS, CPUS)
    ):
        if width < option_set.get("min_width", 1) or width > len(devices):
            continue
        if option_set.get("generation_only") and adapter == "embedding":
            continue
        served = served_models(parse_config(_config(adapter, width, option_set), source="<t>"))[0]
        cores = tuple((i,) for i in range(len(devices))) if devices is CPUS else ()
        settings = Settings(devices=devices, device_cores=cores, bundle="vllm")
        options = resolve_load_options(served, settings, env={})
        share = 0.45 if name == "memory" else None
        plan = plan_launch(
            served, options, devices[:width], port=30000, nccl_port=30400, settings=settings,
            share=EngineShare(share, 1 if devices is CPUS else None),
        )  # fmt: skip
        argv = list(plan.argv)
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        case = f"{adapter}/width={width}/{name}/{devices[0].split(':')[0]}"
        yield case, {"width": width, "name": name, "adapter": adapter, "env": plan.env}, argv[3:]


def _prefix_tokens(options: list[str]) -> list[str]:
    """Every prefix of every option string, ``=value`` and underscore forms, short aliases
    and their prefixes, ``--name.key`` JSON arguments."""
    tokens = {s[:i] for s in options if s.startswith("--") for i in range(3, len(s) + 1)}
    tokens |= {s[:i] for s in options if not s.startswith("--") for i in range(2, len(s) + 1)}
    tokens |= {f"{t}=1" for t in list(tokens)}
    tokens |= {t.replace("-", "_").replace("__", "--", 1) for t in list(tokens)}
    tokens |= {"--tensor-parallel-size.x", "--compilation-config.mode", "-O3", "-tp2", "--tp 2"}
    tokens |= {f"{s}.x" for s in options if not s.startswith("--")}  # -tp.x is -tp to vLLM
    tokens |= {"-n2", "-n\t2", "-r.x=1", "-d.x", "-tp.x=2"}
    return sorted(tokens)


@pytest.fixture(scope="module")
def parsed() -> dict[str, Any]:
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/setup-vllm (make test does)")
    cases = list(_cases())
    table = json.loads((DATA / f"vllm-options-{PINNED_VERSION}.json").read_text("utf-8"))
    tokens = _prefix_tokens(list(table["options"]))
    done = subprocess.run(
        [str(VLLM_PYTHON), str(HARNESS)],
        input=json.dumps(
            {
                "argvs": [argv for _, _, argv in cases],
                "tokens": tokens,
                "table_script": str(TABLE_SCRIPT),
            }
        ),
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return {
        **result,
        "table_text": result["table"],
        "cases": cases,
        "tokens_asked": tokens,
        "table": table,
    }


def test_the_parser_is_the_release_the_vllm_bundle_runs(parsed: dict[str, Any]) -> None:
    assert BUNDLE_VERSIONS == {"vllm": PINNED_VERSION}
    assert parsed["version"] == PINNED_VERSION == parsed["table"]["vllm"]


def test_vllm_accepts_every_planned_argv(parsed: dict[str, Any]) -> None:
    refused = {
        case: result["error"]
        for (case, _, _), result in zip(parsed["cases"], parsed["argvs"], strict=True)
        if not result["ok"]
    }
    assert not refused


def test_vllm_reads_width_listener_memory_and_lora_as_planned(parsed: dict[str, Any]) -> None:
    for (case, facts, _), result in zip(parsed["cases"], parsed["argvs"], strict=True):
        values = result["values"]
        assert values["tensor_parallel_size"] == facts["width"], case
        assert (values["host"], values["port"]) == ("127.0.0.1", 30000), case
        assert values["served_model_name"] == [f"test/{facts['adapter']}-{facts['width']}"], case
        assert values["model"] == "test/model", case
        assert values["disable_uvicorn_access_log"] is True, case
        if facts["adapter"] == "embedding":
            assert values["runner"] == "pooling", case
        if facts["name"] == "memory":
            assert values["gpu_memory_utilization"] == 0.45, case
        if facts["name"] == "nccl-port":
            assert values["master_port"] == 31000, case
        if facts["name"] == "everything":
            assert values["max_model_len"] == 4096, case
            assert values["enforce_eager"] is True, case
            assert values["enable_prefix_caching"] is False, case
            assert values["trust_remote_code"] is False, case
            assert (values["quantization"], values["kv_cache_dtype"]) == ("fp8", "fp8"), case
            assert values["revision"] == "v1.0", case
            assert values["max_num_seqs"] == 8, case
        if facts["name"] == "lora":
            assert values["enable_lora"] is True, case
            assert (values["max_loras"], values["max_lora_rank"]) == (2, 32), case


def test_flag_resolution_matches_vllms_parser_for_every_spelling(parsed: dict[str, Any]) -> None:
    table = option_tables.table_for(PINNED_VERSION, "vllm")
    assert table is not None
    mismatches = {}
    for token, actual in zip(parsed["tokens_asked"], parsed["tokens"], strict=True):
        match = option_tables.resolve(token, table)
        ours: dict[str, Any] = (
            {"ambiguous": True} if match.ambiguous else ({"dest": match.dest} if match.dest else {})
        )
        if ours != actual:
            mismatches[token] = (ours, actual)
    assert not mismatches


def test_reserved_refusals_are_what_vllm_would_read_as_reserved(parsed: dict[str, Any]) -> None:
    table = option_tables.table_for(PINNED_VERSION, "vllm")
    wrong = {}
    for token, actual in zip(parsed["tokens_asked"], parsed["tokens"], strict=True):
        refused = reserved_flags.reserved_flag_problem(token, (table,)) is not None
        sets_reserved = actual.get("dest") in reserved_flags.VLLM_RESERVED_DESTS
        if sets_reserved and not refused:
            wrong[token] = "vLLM reads it as a reserved flag; the worker lets it through"
        if refused and not (sets_reserved or actual.get("ambiguous")):
            wrong[token] = "refused, yet vLLM reads no reserved flag in it"
    assert not wrong


def test_the_shipped_option_table_is_current(parsed: dict[str, Any]) -> None:
    shipped = (DATA / f"vllm-options-{PINNED_VERSION}.json").read_text("utf-8")
    assert shipped == parsed["table_text"], "stale: run .venv-vllm/bin/python scripts/vllm-options"
