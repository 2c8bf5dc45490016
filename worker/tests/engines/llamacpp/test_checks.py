"""What the worker refuses of a llama.cpp profile before llama-server would: reserved flags in
every spelling, the ``--flag=value`` form, and the variables llama-server reads as flags."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.config.flags.launch_rules import args_problems, env_problems
from sie_worker.config.flags.option_tables import table_for
from sie_worker.engines.llamacpp.checks import extra_arg_problems
from sie_worker.engines.llamacpp.release import PINNED_VERSION
from sie_worker.engines.llamacpp.reserved import RESERVED

TABLE = table_for(PINNED_VERSION, "llamacpp")


@pytest.mark.parametrize(
    ("token", "named"),
    [
        ("-ngl", "-ngl"),
        ("--n-gpu-layers", "--n-gpu-layers"),
        ("--n_gpu_layers", "--n-gpu-layers"),
        ("--rpc", "--rpc"),
        ("-ts", "-ts"),
        ("--api_key", "--api-key"),
        ("--port=8081", "--port"),
        ("-a", "-a"),
    ],
)
def test_a_reserved_flag_is_refused_in_any_spelling_naming_it(token: str, named: str) -> None:
    [(index, message)] = extra_arg_problems([token, "1"], TABLE)
    assert index == 0
    assert f"sets the reserved flag {named}:" in message


def test_any_flag_equals_value_form_is_refused_naming_both_arguments() -> None:
    [(_, message)] = extra_arg_problems(["--ctx-size=512"], TABLE)
    assert "pass '--ctx-size' and '512' as two arguments" in message


def test_flags_the_worker_leaves_alone_pass() -> None:
    assert extra_arg_problems(["-fa", "on", "--cache-reuse", "256", "--temp", "0.7"], TABLE) == []


def test_a_long_option_the_release_does_not_know_is_refused_with_the_closest() -> None:
    [(_, message)] = extra_arg_problems(["--cache-reus", "256"], TABLE)
    assert (
        message == "--cache-reus is not an option of llama.cpp 0c1e570; did you mean --cache-reuse?"
    )


def test_every_reserved_spelling_is_one_llama_server_reads() -> None:
    assert TABLE is not None
    assert [s for s in RESERVED if not TABLE.has(s)] == []


@given(st.sampled_from(sorted(RESERVED)))
def test_every_reserved_spelling_is_refused_when_the_config_is_read(option: str) -> None:
    problems = args_problems([option, "1"], ("extra_launch_args",), "llamacpp")
    assert [p.path for p in problems] == ["$.extra_launch_args[0]"]


@pytest.mark.parametrize(
    "variable", ["LLAMA_ARG_N_GPU_LAYERS", "llama_arg_threads", "LLAMA_API_KEY"]
)
def test_a_variable_llama_server_reads_as_a_flag_is_refused_in_extra_env(variable: str) -> None:
    [problem] = env_problems({variable: "1"}, ("extra_env",))
    assert "llama.cpp reads as one of its flags" in problem.message
