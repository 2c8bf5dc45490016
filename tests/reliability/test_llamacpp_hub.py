"""A real llama.cpp model whose GGUF comes from a hub: the worker fetches only the file its
``gguf_file`` names (and the support files) from the fake hub (``HF_ENDPOINT``) into its
cache, and starts ``llama-server`` on it from the snapshot folder."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.reliability._engine_group import complete, engine_group, load
from tests.reliability._support import Launcher
from tests.support.fake_hub import FakeHub, fetched_files
from tests.support.llamacpp_models import LLAMACPP_BUNDLE, llamacpp_command, llamacpp_model
from tests.support.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

MODEL = "tiny/llamacpp-hub"
REPO = "tests/tiny-GGUF"


def _config(gguf_file: str) -> dict[str, Any]:
    config = llamacpp_model(MODEL, Path("unused"), gguf_file=gguf_file)
    del config["model_path"]
    return {**config, "hf_id": REPO}


def test_a_hub_gguf_model_fetches_only_its_file_and_serves_from_the_snapshot(
    launcher: Launcher, tmp_path: Path
) -> None:
    first = write_tiny_gguf(tmp_path / "a")
    other = tmp_path / "tiny-other.gguf"
    shutil.copyfile(write_tiny_gguf(tmp_path / "b", seed=1), other)
    files = {
        "README.md": b"# tiny GGUF\n",
        "config.json": b'{"model_type": "llama"}',
        "tiny-llama.gguf": first,
        "tiny-other.gguf": other,
    }
    hf_home = tmp_path / "hf"
    with FakeHub() as hub:
        commit = hub.add_repo(REPO, files)
        env = {
            "SIE_BUNDLE": LLAMACPP_BUNDLE,
            "SIE_LLAMACPP_COMMAND": llamacpp_command(),
            "SIE_WEIGHTS_DOWNLOAD": "worker",
            "HF_HUB_OFFLINE": "",
            "TRANSFORMERS_OFFLINE": "",
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(hf_home),
        }
        worker = launcher.start([_config("tiny-other.gguf")], devices="cpu:0", env=env)
        loaded = load(worker, MODEL)
        assert loaded.status_code == 200, loaded.text
        assert sorted(fetched_files(hub, REPO)) == ["config.json", "tiny-other.gguf"]
    snapshot = hf_home / "hub" / "models--tests--tiny-GGUF" / "snapshots" / commit
    (server,) = engine_group(worker, MODEL)
    argv = server.cmdline()
    assert argv[argv.index("-m") + 1] == str(snapshot / "tiny-other.gguf")
    answer = complete(worker, MODEL, ignore_eos=True)  # the hub is gone: all is local
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 6
