"""scripts/llamacpp-options reads llama-server's own help into the option table the worker
ships (config/data/llamacpp-options-<release>.json): every spelling, negative forms and
environment variables included; and the shipped table is what the built llama-server says,
read as its parser reads a command line (the tests marked llamacpp run the binary)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.llamacpp_engine import LLAMA_SERVER, llamacpp_binary, llamacpp_env
from tests.support.repo import ROOT

DATA = ROOT / "worker" / "src" / "sie_worker" / "config" / "data"
RELEASE = "0c1e570"
SHIPPED = DATA / f"llamacpp-options-{RELEASE}.json"
# DESIGN.md, "Engines": what the worker sets itself, in every spelling llama-server reads
RESERVED = ("-m", "--host", "--port", "--rpc", "-sm", "-ts", "-mg", "-ngl", "-dev", "-np")
RESERVED += ("--api-key", "--metrics", "-a")

# The shape of common_arg::to_string: options and hints padded to column 40, help after it
# (or on the next lines, 40 spaces in, when the options are longer than 37 columns).
HELP = """\
----- common params -----

-h,    --help, --usage                  print usage and exit
-t,    --threads N                      number of CPU threads to use during generation
                                        (env: LLAMA_ARG_THREADS)
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto')
                                        (env: LLAMA_ARG_FLASH_ATTN)
-kvo,  --kv-offload, -nkvo, --no-kv-offload
                                        whether to enable KV cache offloading (default: enabled)
                                        (env: LLAMA_ARG_KV_OFFLOAD)
-sm,   --split-mode {none,layer,row,tensor}
                                        how to split the model across multiple GPUs, one of:
--control-vector-layer-range START END
                                        layer range to apply the control vector(s) to, start and end
--metrics                               enable prometheus compatible metrics endpoint
                                        (env:
                                        LLAMA_ARG_ENDPOINT_METRICS)
"""
COMPLETION = 'opts="-h --help --usage -t --threads -fa --flash-attn -kvo --kv-offload -sm '
COMPLETION += '--split-mode --control-vector-layer-range --metrics"'


@pytest.fixture(scope="module")
def script() -> ModuleType:
    path = ROOT / "scripts" / "llamacpp-options"
    loader = importlib.machinery.SourceFileLoader("sie_scripts_llamacpp_options", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses resolve their module by name
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def table(script: ModuleType) -> dict[str, object]:
    built: dict[str, object] = script.table_of_help(HELP, COMPLETION, RELEASE, "version: x")
    return built


def test_every_spelling_of_an_option_sets_its_longest_long_name(table: dict) -> None:
    options = table["options"]
    assert options["-t"] == options["--threads"] == "threads"
    assert options["--usage"] == "help"
    assert "-h" not in options  # as the argparse tables leave -h and --help out
    assert options["-nkvo"] == options["--no-kv-offload"] == "kv_offload"


def test_an_option_with_negative_spellings_is_boolean_and_reads_both_variables(
    table: dict,
) -> None:
    assert table["actions"]["kv_offload"]["kind"] == "BooleanOptional"
    assert table["env"]["kv_offload"] == ["LLAMA_ARG_KV_OFFLOAD", "LLAMA_ARG_NO_KV_OFFLOAD"]
    assert table["actions"]["metrics"]["kind"] == "StoreTrue"
    assert table["env"]["metrics"] == ["LLAMA_ARG_ENDPOINT_METRICS"]  # wrapped in the help


def test_a_hint_that_lists_values_gives_the_choices(table: dict) -> None:
    assert table["actions"]["split_mode"]["choices"] == ["layer", "none", "row", "tensor"]
    assert table["actions"]["flash_attn"]["choices"] == ["auto", "off", "on"]
    assert table["actions"]["threads"] == {
        "kind": "Store",
        "type": None,
        "nargs": None,
        "choices": None,
        "hint": "N",
    }
    assert table["actions"]["control_vector_layer_range"]["nargs"] == 2


def test_the_table_says_how_the_parser_reads_a_token(table: dict) -> None:
    assert table["allow_abbrev"] is False
    assert table["underscores_as_dashes"] is True
    assert table["equals_value"] is False
    assert table["llamacpp"] == RELEASE


def test_the_release_is_the_pinned_commit_the_binary_reports(script: ModuleType) -> None:
    pin = (ROOT / "tools" / "llamacpp.txt").read_text()
    assert script.release_of("version: 0.5.0-dev (build 1, commit 0c1e570)", pin) == RELEASE
    assert script.release_of("version: 0.5.0-dev (build 0, commit unknown)", pin) == RELEASE
    with pytest.raises(SystemExit, match="reports commit 1234567"):
        script.release_of("version: 0.5.0-dev (build 9, commit 1234567)", pin)


def test_the_shipped_table_holds_every_reserved_flag_and_its_variable() -> None:
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))
    for flag in RESERVED:
        dest = shipped["options"][flag]
        assert shipped["env"][dest], flag
    assert shipped["env"]["api_key"] == ["LLAMA_API_KEY"]
    assert {o for o, d in shipped["options"].items() if d == "n_gpu_layers"} == {
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
    }


@pytest.mark.llamacpp
def test_the_shipped_table_is_what_the_built_llama_server_says(script: ModuleType) -> None:
    llamacpp_binary(LLAMA_SERVER)
    built = script.render(script.build_table())
    assert SHIPPED.read_text(encoding="utf-8") == built, "stale: run scripts/llamacpp-options"


def _accepts(tmp_path: Path, *args: str) -> bool:
    """Whether llama-server's parser takes ``args`` (--version then exits before a load)."""
    done = subprocess.run(
        [str(llamacpp_binary(LLAMA_SERVER)), *args, "--version"],
        env=llamacpp_env(tmp_path),
        capture_output=True,
        timeout=30,
    )
    return done.returncode == 0


@pytest.mark.llamacpp
def test_llama_server_reads_tokens_as_the_table_says(tmp_path: Path) -> None:
    assert _accepts(tmp_path, "--n-gpu-layers", "0")
    assert _accepts(tmp_path, "--n_gpu_layers", "0")  # underscores_as_dashes
    assert not _accepts(tmp_path, "-n_gpu_layers", "0")  # ... of "--" tokens only
    assert not _accepts(tmp_path, "--port=8080")  # equals_value false
    assert not _accepts(tmp_path, "--gpu-lay", "0")  # no abbreviations
