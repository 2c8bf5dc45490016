"""Flags in extra_launch_args are read as SGLang's argparse reads them, from the shipped
option tables."""

from __future__ import annotations

import pytest

from sie_worker.config.flags.option_tables import flag_value, option_tables, table_for

TABLE = table_for("0.5.23")


@pytest.mark.parametrize(
    ("args", "value"),
    [
        (("--max-lora-rank", "64"), "64"),
        (("--max-lora-rank=32",), "32"),
        (("--max-lora-r", "16"), "16"),  # a unique prefix, as argparse takes it
        (("--max-lora-rank", "8", "--max-lora-rank=128"), "128"),  # the last one wins
        (("--mem-fraction-static", "0.8"), None),
        (("--max-lora-rank",), None),  # no value follows
        ((), None),
    ],
)
def test_the_value_of_a_flag_is_the_last_one_argparse_would_read(
    args: tuple[str, ...], value: str | None
) -> None:
    assert TABLE is not None
    assert flag_value(args, {"max_lora_rank"}, TABLE) == value


def test_every_shipped_table_knows_the_lora_flags() -> None:
    for table in option_tables():
        for dest in ("lora_paths", "max_loras_per_batch", "max_lora_rank", "enable_lora"):
            assert table.strings_of(dest), (table.version, dest)
