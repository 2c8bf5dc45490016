"""Router settings from the environment: slots, worker ports and the fallbacks."""

from __future__ import annotations

import pytest

from sie_worker.router.settings import RouterSettings, RouterSettingsError


def test_worker_ports_list_gives_one_slot_per_port() -> None:
    settings = RouterSettings.from_env(
        {"SIE_WORKER_PORTS": "8081, 8082,8083,", "SIE_GPU_COUNT": "3"}
    )
    assert settings.worker_ports == (8081, 8082, 8083)
    assert settings.slot_count == 3
    assert settings.worker_url(1) == "http://127.0.0.1:8082"


def test_gpu_count_alone_counts_ports_up_from_the_base_port() -> None:
    settings = RouterSettings.from_env({"SIE_GPU_COUNT": "4", "SIE_WORKER_BASE_PORT": "9000"})
    assert settings.worker_ports == (9000, 9001, 9002, 9003)


def test_gpu_count_alone_defaults_to_base_port_8081() -> None:
    assert RouterSettings.from_env({"SIE_GPU_COUNT": "2"}).worker_ports == (8081, 8082)


def test_nothing_set_means_one_slot_on_the_base_port() -> None:
    assert RouterSettings.from_env({}).worker_ports == (8081,)


def test_ports_alone_set_the_slot_count() -> None:
    assert RouterSettings.from_env({"SIE_WORKER_PORTS": "7001,7002"}).slot_count == 2


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {"SIE_WORKER_PORTS": "8081,8082", "SIE_GPU_COUNT": "3"},
            "lists 2 port(s) but SIE_GPU_COUNT is 3",
        ),
        ({"SIE_WORKER_PORTS": "8081,http"}, "SIE_WORKER_PORTS: 'http' is not a port number"),
        ({"SIE_WORKER_PORTS": "8081,8081"}, "port 8081 is listed twice"),
        ({"SIE_WORKER_PORTS": "70000"}, "SIE_WORKER_PORTS: port 70000 is outside 1..65535"),
        ({"SIE_GPU_COUNT": "0"}, "SIE_GPU_COUNT: must be an integer above zero"),
        ({"SIE_GPU_COUNT": "two"}, "SIE_GPU_COUNT: 'two' is not an integer"),
        ({"SIE_GPU_COUNT": "4", "SIE_WORKER_BASE_PORT": "65534"}, "runs past port 65535"),
        ({"SIE_ROUTER_POLL_INTERVAL_S": "-1"}, "SIE_ROUTER_POLL_INTERVAL_S: must be a finite"),
        ({"SIE_MAX_BODY_BYTES": "lots"}, "SIE_MAX_BODY_BYTES: 'lots' is not an integer"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(RouterSettingsError) as info:
        RouterSettings.from_env(env)
    assert fragment in str(info.value)


def test_api_key_and_timeouts_are_read() -> None:
    settings = RouterSettings.from_env(
        {
            "SIE_API_KEY": "k",
            "SIE_ROUTER_POLL_INTERVAL_S": "0.25",
            "SIE_ROUTER_READ_TIMEOUT_S": "60",
        }
    )
    assert settings.api_key == "k"
    assert settings.poll_interval_s == 0.25
    assert settings.read_timeout_s == 60.0


def test_the_prefix_index_is_on_by_default_and_its_two_sizes_are_read() -> None:
    default = RouterSettings.from_env({}).prefix
    assert (default.block_chars, default.index_blocks, default.enabled) == (256, 32768, True)
    env = {"SIE_ROUTER_PREFIX_BLOCK_CHARS": "64", "SIE_ROUTER_PREFIX_INDEX_BLOCKS": "0"}
    off = RouterSettings.from_env(env).prefix
    assert (off.block_chars, off.index_blocks, off.enabled) == (64, 0, False)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {"SIE_ROUTER_PREFIX_BLOCK_CHARS": "0"},
            "SIE_ROUTER_PREFIX_BLOCK_CHARS: must be an integer above zero",
        ),
        (
            {"SIE_ROUTER_PREFIX_INDEX_BLOCKS": "-1"},
            r"SIE_ROUTER_PREFIX_INDEX_BLOCKS: must be 0 \(off\)",
        ),
        (
            {"SIE_ROUTER_PREFIX_INDEX_BLOCKS": "many"},
            r"SIE_ROUTER_PREFIX_INDEX_BLOCKS: must be 0 \(off\) .* got 'many'",
        ),
    ],
)
def test_bad_prefix_sizes_are_refused_naming_the_variable(
    env: dict[str, str], fragment: str
) -> None:
    with pytest.raises(RouterSettingsError, match=fragment):
        RouterSettings.from_env(env)


@pytest.mark.parametrize(("raw", "resume_max"), [(None, 2), ("0", 0), ("5", 5)])
def test_resumptions_per_stream_default_to_two_and_zero_turns_them_off(
    raw: str | None, resume_max: int
) -> None:
    env = {} if raw is None else {"SIE_ROUTER_RESUME_MAX": raw}
    assert RouterSettings.from_env(env).resume_max == resume_max


def test_a_bad_resume_max_is_refused_naming_the_variable() -> None:
    with pytest.raises(RouterSettingsError, match="SIE_ROUTER_RESUME_MAX: must be an integer >= 0"):
        RouterSettings.from_env({"SIE_ROUTER_RESUME_MAX": "-1"})
