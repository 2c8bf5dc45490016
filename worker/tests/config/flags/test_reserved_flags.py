"""Reserved SGLang flags in extra_launch_args, matched as SGLang's argparse would match them.

These tests use the shipped option tables (generated from SGLang's real parser); the
comparison with the live parser itself is in test_sglang_parser.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_worker.config.flags import option_tables, reserved_flags
from sie_worker.engines.sglang.release import BUNDLE_VERSIONS, PINNED_VERSION

TABLES = option_tables.option_tables()


def _strings(table: option_tables.OptionTable, *, reserved: bool) -> list[str]:
    return sorted(
        s for s, d in table.options.items() if (d in reserved_flags.RESERVED_DESTS) == reserved
    )


SEED_FLAGS = [
    "--tensor-parallel-size",
    "--tp-size",
    "--data-parallel-size",
    "--dp-size",
    "--expert-parallel-size",
    "--ep-size",
    "--pipeline-parallel-size",
    "--pp-size",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--base-gpu-id",
    "--gpu-id-step",
    "--host",
    "--port",
    "--nccl-port",
]


def test_tables_ship_for_the_pinned_releases() -> None:
    assert [t.version for t in TABLES] == ["0.5.23", "0.5.10.post1"]
    assert {t.version for t in TABLES} == {*BUNDLE_VERSIONS.values(), PINNED_VERSION}
    assert all(t.complete for t in TABLES)


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.version)
@pytest.mark.parametrize("flag", SEED_FLAGS)
def test_every_release_knows_every_seed_flag_under_a_reserved_dest(
    table: option_tables.OptionTable, flag: str
) -> None:
    # 0.5.10.post1 stores --tp-size as tensor_parallel_size, 0.5.23 as tp_size.
    assert table.options[flag] in reserved_flags.RESERVED_DESTS
    assert reserved_flags.reserved_flag_problem(flag, [table]) is not None


def test_a_token_is_refused_when_any_shipped_table_reads_it_as_reserved() -> None:
    newer = option_tables.OptionTable(
        "9.0.0", {"--tp-size": "tp_size", "--dist-timeout": "dist_timeout"}
    )
    older = option_tables.OptionTable(
        "8.0.0",
        {"--tp-size": "tensor_parallel_size", "--dist-init-addr": "dist_init_addr"},
    )
    assert reserved_flags.reserved_flag_problem("--dist-i", [newer]) is None
    message = reserved_flags.reserved_flag_problem("--dist-i", [newer, older])
    assert message is not None
    assert "--dist-init-addr" in message
    assert reserved_flags.reserved_flag_problem("--tp=2", [older]) is not None
    assert reserved_flags.reserved_flag_problem("--dist-timeout=5", [newer, older]) is None


@pytest.mark.parametrize("flag", SEED_FLAGS)
def test_every_flag_the_seed_names_is_refused(flag: str) -> None:
    assert reserved_flags.reserved_flag_problem(flag) is not None
    assert reserved_flags.reserved_flag_problem(f"{flag}=1") is not None


@pytest.mark.parametrize(
    ("token", "named"),
    [
        ("--tp=2", "--tensor-parallel-size/--tp-size"),
        ("--tp", "--tensor-parallel-size/--tp-size"),
        ("--tensor-parallel", "--tensor-parallel-size/--tp-size"),
        ("--po", "--port"),
        ("--ho=0.0.0.0", "--host"),
        ("--ep", "--expert-parallel-size/--ep-size/--ep"),
        ("--nccl-init-addr=10.0.0.1:5000", "--dist-init-addr/--nccl-init-addr"),
        ("--base", "--base-gpu-id"),
        ("--nnod", "--nnodes"),
    ],
)
def test_abbreviations_and_aliases_name_the_full_flag(token: str, named: str) -> None:
    message = reserved_flags.reserved_flag_problem(token)
    assert message is not None
    assert named in message
    assert repr(token) in message


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("--tp=2", "the worker sets it from the declared width"),
        ("--nccl-port=30001", "adapter_options.loadtime.nccl_port"),
        ("--port", "SIE owns the engine's HTTP host and port"),
        ("--host", "SIE owns the engine's HTTP host and port"),
        ("--dp-size", "declared width alone"),
        ("--base-gpu-id", "CUDA_VISIBLE_DEVICES"),
    ],
)
def test_refusals_say_why_and_how_to_fix(token: str, says: str) -> None:
    message = reserved_flags.reserved_flag_problem(token)
    assert message is not None
    assert says in message


@pytest.mark.parametrize("token", ["--p", "--nccl", "--n", "--d"])
def test_ambiguous_prefix_with_a_reserved_candidate_is_refused(token: str) -> None:
    message = reserved_flags.reserved_flag_problem(token)
    assert message is not None
    assert "ambiguous" in message


@pytest.mark.parametrize(
    "token",
    [
        "--chat-template",
        "--mem-fraction-static=0.8",
        "--trust-remote-code",
        "--disable-cuda-graph",
        "--grammar-backend",
        "0.85",
        "-tp",
        "--tp 2",
        "--TP=2",
        "tp-size",
        "",
    ],
)
def test_ordinary_flags_and_values_are_allowed(token: str) -> None:
    assert reserved_flags.reserved_flag_problem(token) is None


def test_problems_carry_the_index_of_each_reserved_token() -> None:
    args = ["--mem-fraction-static", "0.8", "--tp=2", "--port", "8000"]
    assert [i for i, _ in reserved_flags.reserved_flag_problems(args)] == [2, 3]


def test_disable_cuda_graph_is_found_in_any_spelling_sglang_accepts() -> None:
    assert option_tables.disables_cuda_graph(["--disable-cuda-graph"])
    assert option_tables.disables_cuda_graph(["--log-level", "info", "--disable-cuda-graph"])
    assert not option_tables.disables_cuda_graph(["--disable-cuda-graph-padding"])
    assert not option_tables.disables_cuda_graph(["--disable-prefill-cuda-graph"])


def test_without_a_table_any_prefix_of_a_reserved_flag_is_refused() -> None:
    fallback = [reserved_flags.fallback_table()]
    message = reserved_flags.reserved_flag_problem("--tp=2", fallback)
    assert message is not None
    assert "prefix of the reserved flag --tensor-parallel-size/--tp-size" in message
    assert reserved_flags.reserved_flag_problem("--chat-template", fallback) is None


# --- properties against the real option lists, every shipped release -------------------------


def _prefixes(strings: list[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(strings).flatmap(
        lambda s: st.integers(min_value=3, max_value=len(s)).map(lambda n: s[:n])
    )


_values = st.one_of(st.none(), st.text(max_size=12))
_tables = pytest.mark.parametrize("table", TABLES, ids=lambda t: t.version)


@_tables
@settings(max_examples=300)
@given(data=st.data(), value=_values)
def test_any_prefix_of_a_reserved_flag_is_refused_unless_it_is_another_option(
    table: option_tables.OptionTable, data: st.DataObject, value: str | None
) -> None:
    prefix = data.draw(_prefixes(_strings(table, reserved=True)))
    token = prefix if value is None else f"{prefix}={value}"
    exact_other = (
        prefix in table.options and table.options[prefix] not in reserved_flags.RESERVED_DESTS
    )
    refused = reserved_flags.reserved_flag_problem(token, [table]) is not None
    assert refused != exact_other


@_tables
@settings(max_examples=300)
@given(data=st.data(), value=_values)
def test_a_non_reserved_option_spelled_out_is_allowed(
    table: option_tables.OptionTable, data: st.DataObject, value: str | None
) -> None:
    option = data.draw(st.sampled_from(_strings(table, reserved=False)))
    token = option if value is None else f"{option}={value}"
    assert reserved_flags.reserved_flag_problem(token) is None


@_tables
@settings(max_examples=300)
@given(data=st.data(), value=_values)
def test_a_unique_prefix_resolves_to_the_one_option_it_starts(
    table: option_tables.OptionTable, data: st.DataObject, value: str | None
) -> None:
    prefix = data.draw(_prefixes(sorted(table.options)))
    token = prefix if value is None else f"{prefix}={value}"
    match = option_tables.resolve(token, table)
    # argparse also matches its own -h/--help, which the table's lookup adds to the options.
    starting = [s for s in table.lookup if s.startswith(prefix)]
    if prefix in table.lookup:
        assert match.dest == table.lookup[prefix]
    elif len(starting) == 1:
        assert match.dest == table.lookup[starting[0]]
    else:
        assert match.ambiguous
        assert set(match.candidates) == set(starting)


@given(text=st.text(max_size=30).filter(lambda t: not t.startswith("--")))
def test_tokens_that_are_not_long_options_are_never_refused(text: str) -> None:
    assert reserved_flags.reserved_flag_problem(text) is None
