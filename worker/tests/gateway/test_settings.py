"""Gateway settings from the environment: defaults, and refusals that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie_worker.gateway.settings import GatewaySettings, GatewaySettingsError


def test_defaults_need_only_the_pools_file() -> None:
    settings = GatewaySettings.from_env({"SIE_GATEWAY_POOLS": "/etc/sie/gateway/pools.yaml"})
    assert settings.pools_file == Path("/etc/sie/gateway/pools.yaml")
    assert (settings.max_held, settings.hold_s, settings.retry_after_s) == (256, 60.0, 5)
    assert settings.slot_target == 4
    assert settings.config_dir is None


def test_variables_override_the_defaults() -> None:
    settings = GatewaySettings.from_env(
        {
            "SIE_GATEWAY_POOLS": "p.yaml",
            "SIE_GATEWAY_MAX_HELD": "10",
            "SIE_GATEWAY_HOLD_S": "2.5",
            "SIE_CONFIG_DIR": "/etc/sie/models",
            "SIE_GATEWAY_NAMESPACE": "ml",
        }
    )
    assert (settings.max_held, settings.hold_s, settings.namespace) == (10, 2.5, "ml")
    assert settings.config_dir == Path("/etc/sie/models")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "SIE_GATEWAY_POOLS is not set"),
        ({"SIE_GATEWAY_HOLD_S": "150"}, "not below 150 s, the read timeout of sie-sdk"),
        ({"SIE_GATEWAY_HOLD_S": "soon"}, "SIE_GATEWAY_HOLD_S: 'soon' is not a number"),
        ({"SIE_GATEWAY_MAX_HELD": "0"}, "SIE_GATEWAY_MAX_HELD: must be an integer above zero"),
    ],
)
def test_unusable_values_are_refused_naming_the_variable(env: dict[str, str], message: str) -> None:
    if env:
        env = {"SIE_GATEWAY_POOLS": "p.yaml", **env}
    with pytest.raises(GatewaySettingsError, match=message):
        GatewaySettings.from_env(env)


def test_the_prefix_index_sizes_are_read_and_a_bad_one_is_refused_by_name() -> None:
    env = {
        "SIE_GATEWAY_POOLS": "p.yaml",
        "SIE_GATEWAY_PREFIX_BLOCK_CHARS": "128",
        "SIE_GATEWAY_PREFIX_INDEX_BLOCKS": "1000",
    }
    prefix = GatewaySettings.from_env(env).prefix
    assert (prefix.block_chars, prefix.index_blocks) == (128, 1000)
    with pytest.raises(GatewaySettingsError, match="SIE_GATEWAY_PREFIX_BLOCK_CHARS"):
        GatewaySettings.from_env({**env, "SIE_GATEWAY_PREFIX_BLOCK_CHARS": "0"})


def test_resumptions_per_stream_are_read_and_a_bad_count_is_refused_by_name() -> None:
    env = {"SIE_GATEWAY_POOLS": "p.yaml"}
    assert GatewaySettings.from_env(env).resume_max == 2
    assert GatewaySettings.from_env({**env, "SIE_GATEWAY_RESUME_MAX": "0"}).resume_max == 0
    with pytest.raises(GatewaySettingsError, match="SIE_GATEWAY_RESUME_MAX: must be an integer"):
        GatewaySettings.from_env({**env, "SIE_GATEWAY_RESUME_MAX": "twice"})
