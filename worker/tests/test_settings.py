from __future__ import annotations

from pathlib import Path

import pytest

from sie_worker.settings import Settings, SettingsError


def test_settings_read_every_variable() -> None:
    settings = Settings.from_env(
        {
            "SIE_DEVICES": "cuda:0,cuda:1",
            "SIE_BUNDLE": "sglang-cu130",
            "SIE_MODEL_READY_TIMEOUT_S": "600",
            "SIE_SGLANG_GENERATE_READ_TIMEOUT_S": "120",
            "SIE_API_KEY": "k",
            "SIE_SGLANG_COMMAND": "numactl --cpunodebind=0 python -m sglang.launch_server",
            "SIE_PINNED_MODELS": " a/b , c:fast,a/b,",
            "SIE_WORKER_LIVENESS_BUDGET_S": "960",
            "SIE_CONFIG_DIR": "/etc/sie/models",
            "SIE_CONFIG_API": "read-only",
            "SIE_WEIGHTS_DOWNLOAD": " Engine ",
        },
        gpu=True,
    )
    assert settings.devices == ("cuda:0", "cuda:1")
    assert settings.bundle == "sglang-cu130"
    assert settings.model_ready_timeout_s == 600
    assert settings.generate_read_timeout_s == 120
    assert settings.api_key == "k"
    assert settings.engine_commands.get("SIE_SGLANG_COMMAND") == (
        "numactl",
        "--cpunodebind=0",
        "python",
        "-m",
        "sglang.launch_server",
    )
    assert settings.pinned_models == ("a/b", "c:fast")
    assert settings.liveness_budget_s == 960
    assert settings.config_dir == Path("/etc/sie/models")
    assert settings.config_api == "read-only"
    assert settings.weights_download == "engine"


def test_defaults_without_environment() -> None:
    settings = Settings.from_env({}, gpu=False)
    assert settings.devices == ("cpu",)
    assert settings.bundle == "default"
    assert settings.model_ready_timeout_s is None
    assert settings.engine_commands.get("SIE_SGLANG_COMMAND") is None
    assert settings.config_api == "read-write"
    assert settings.weights_download == "worker"  # the worker fetches hub weights itself
    assert settings.engine == "transformers"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SIE_MODEL_READY_TIMEOUT_S", "soon", "SIE_MODEL_READY_TIMEOUT_S: 'soon' is not a number"),
        ("SIE_MODEL_READY_TIMEOUT_S", "-1", "above zero"),
        ("SIE_SGLANG_GENERATE_READ_TIMEOUT_S", "inf", "finite"),
        ("SIE_CONFIG_API", "maybe", "SIE_CONFIG_API"),
        ("SIE_MAX_BODY_BYTES", "lots", "SIE_MAX_BODY_BYTES"),
        ("SIE_DEVICES", "cuda:0,cpu", "SIE_DEVICES"),
        (
            "SIE_WEIGHTS_DOWNLOAD",
            "sglang",
            "SIE_WEIGHTS_DOWNLOAD: 'sglang' is not one of worker, engine",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({name: value}, gpu=False)
