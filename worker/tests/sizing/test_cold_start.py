"""Cold-start arithmetic, reproducing seed 004's example 17 figure for figure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.sizing.cold_start import (
    DEFAULT_SOURCES,
    ColdStart,
    WeightSource,
    backlog,
    backlog_line,
    cold_starts,
    parse_rate,
    parse_source,
    table_lines,
)

# Seed 004, example 17: the ColdStart program's output, verbatim.
SEED_TABLE = """\
source                      model      load s  total cold start s
Hub download, 1 Gb/s        8B BF16     128.8               188.8
network volume, 1 GB/s      8B BF16      16.1                76.1
local NVMe, 3 GB/s          8B BF16       5.4                65.4
host page cache, 10 GB/s    8B BF16       1.6                61.6
Hub download, 1 Gb/s        70B FP8     564.8               624.8
network volume, 1 GB/s      70B FP8      70.6               130.6
local NVMe, 3 GB/s          70B FP8      23.5                83.5
host page cache, 10 GB/s    70B FP8       7.1                67.1
cold start  70 s:   210 requests pile up before new capacity arrives
cold start 600 s:  1800 requests pile up before new capacity arrives"""


def test_the_seed_cold_start_table_and_backlog_are_reproduced_exactly() -> None:
    rows = cold_starts([("8B BF16", 16.1e9), ("70B FP8", 70.6e9)])
    lines = table_lines(rows)
    # A load step from 2 to 5 requests per second with one replica ready.
    lines += [backlog_line(cold, backlog(5, 2, cold)) for cold in (70, 600)]
    assert "\n".join(lines) == SEED_TABLE


def test_weight_loading_dominates_slow_sources() -> None:
    [hub, volume, nvme, cache] = cold_starts([("70B FP8", 70.6e9)])
    assert hub.load_s == pytest.approx(564.8)
    assert (hub.total_s, cache.total_s) == (pytest.approx(624.8), pytest.approx(67.06))
    assert volume.load_s > nvme.load_s > cache.load_s


def test_start_and_warm_up_are_parameters() -> None:
    [row] = cold_starts([("m", 1e9)], [WeightSource("x", 1e9)], startup_s=5, warmup_s=0)
    assert (row.load_s, row.total_s) == (1.0, 6.0)


def test_no_backlog_when_the_ready_replicas_keep_up() -> None:
    assert backlog(2, 2, 600) == 0
    assert backlog(1, 2, 600) == 0
    assert backlog(5, 0, 70) == 350  # scaling from zero: every arrival waits


@given(st.floats(0, 1e4), st.floats(0, 1e4), st.floats(0, 1e5))
def test_backlog_is_never_negative_and_grows_with_the_cold_start(
    arrival: float, served: float, cold: float
) -> None:
    assert backlog(arrival, served, cold) >= 0
    assert backlog(arrival, served, cold * 2) >= backlog(arrival, served, cold)


def test_lines_round_half_up_as_java_does() -> None:
    row = ColdStart(WeightSource("s", 1.0), "m", 0.0, 2.25, 0.125)
    assert table_lines([row])[1].split()[-2:] == ["2.3", "0.1"]  # Python would print 2.2
    assert (
        backlog_line(2.5, 0.5)
        == "cold start   3 s:     1 requests pile up before new capacity arrives"
    )


def test_a_long_model_name_widens_its_column_on_every_line() -> None:
    lines = table_lines(cold_starts([("meta-llama/Llama-3.1-70B", 70.6e9)]))
    assert len({len(line) for line in lines}) == 1  # header and rows line up
    end_of_load = lines[0].index("load s") + len("load s")
    assert lines[1][:end_of_load] == "Hub download, 1 Gb/s        meta-llama/Llama-3.1-70B    564.8"


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("1Gb/s", 0.125e9),
        ("1 Gbps", 0.125e9),
        ("3GB/s", 3e9),
        ("500MB/s", 5e8),
        ("10Gb/s", 1.25e9),
        (".5GB/s", 5e8),
        ("800kB/s", 8e5),
    ],
)
def test_rates_read_bits_and_bytes(text: str, rate: float) -> None:
    assert parse_rate(text) == pytest.approx(rate)


@pytest.mark.parametrize("text", ["fast", "3 GB", "0GB/s", "-1GB/s", "3XB/s", ""])
def test_a_rate_that_is_not_one_says_how_to_write_it(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


def test_sources_are_label_equals_rate() -> None:
    assert parse_source("NFS share=800MB/s") == WeightSource("NFS share", 8e8)
    assert parse_source("2GB/s") == WeightSource("2GB/s", 2e9)
    with pytest.raises(ValueError, match="name the source"):
        parse_source("=2GB/s")


def test_the_default_sources_are_the_seeds() -> None:
    assert [(s.label, s.bytes_per_second) for s in DEFAULT_SOURCES] == [
        ("Hub download, 1 Gb/s", 0.125e9),
        ("network volume, 1 GB/s", 1e9),
        ("local NVMe, 3 GB/s", 3e9),
        ("host page cache, 10 GB/s", 10e9),
    ]
