"""``sie-worker fetch`` against a fake hub: downloads, idempotence, resumption, refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.fake_hub import (
    FakeHub,
    fetched_files,
    gguf_repo_files,
    synthetic_model_files,
)

SELECTED = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as fake:
        yield fake


def write(folder: Path, sie_id: str, **fields: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "sie_id": sie_id,
        "hf_id": fields.pop("hf_id", sie_id),
        "tasks": {"generate": {}},
        "profiles": {"default": {}, **fields.pop("profiles", {})},
        **fields,
    }
    path = folder / (sie_id.replace("/", "--") + ".yaml")
    path.write_text(yaml.safe_dump(config))
    return path


def fetch(hub: FakeHub, hf_home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "HF_"))}
    base.update({"HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home), "TRANSFORMERS_OFFLINE": ""})
    base.update(env)
    return subprocess.run(
        [sys.executable, "-m", "sie_worker", "fetch", *args],
        capture_output=True,
        text=True,
        env=base,
        timeout=120,
    )


def test_fetch_downloads_each_snapshot_once_and_a_second_run_needs_no_network(
    hub: FakeHub, tmp_path: Path
) -> None:
    commit = hub.add_repo("org/a", synthetic_model_files())
    hub.add_repo("org/b", synthetic_model_files(shards=2))
    configs = tmp_path / "configs"
    write(configs, "org/a", profiles={"fast": {"extends": "default"}})
    write(configs, "org/b")

    first = fetch(hub, tmp_path / "hf", str(configs))

    assert first.returncode == 0, first.stderr
    assert sorted(fetched_files(hub, "org/a")) == SELECTED  # two profiles, one snapshot
    snapshot = tmp_path / "hf" / "hub" / "models--org--a" / "snapshots" / commit
    assert "org/a@main (org/a, org/a:fast): 4 files" in first.stdout
    assert str(snapshot) in first.stdout
    assert "downloaded" in first.stdout
    hub.requests.clear()
    hub.stop()

    again = fetch(hub, tmp_path / "hf", str(configs))

    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already complete in the cache") == 2
    assert hub.requests == []


def test_fetch_takes_the_models_named_and_skips_local_model_paths(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo("org/a", synthetic_model_files())
    hub.add_repo("org/b", synthetic_model_files())
    configs = tmp_path / "configs"
    write(configs, "org/a")
    write(configs, "org/b")
    (configs / "weights").mkdir()
    write(configs, "org/local", model_path="weights")

    done = fetch(hub, tmp_path / "hf", str(configs), "--models", "org/b,org/local")

    assert done.returncode == 0, done.stderr
    assert fetched_files(hub, "org/a") == []
    assert sorted(fetched_files(hub, "org/b")) == SELECTED
    assert "org/local: local model_path, nothing to fetch" in done.stderr


def test_fetch_names_each_failed_model_with_401_or_404_and_no_traceback(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo("org/gated", synthetic_model_files(), gated_token="hf_x")
    hub.add_repo("org/fine", synthetic_model_files())
    configs = tmp_path / "configs"
    write(configs, "org/gated")
    write(configs, "org/missing")
    write(configs, "org/fine")

    done = fetch(hub, tmp_path / "hf", str(configs))

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert any("org/gated@main: 401 Unauthorized" in line and "HF_TOKEN" in line for line in lines)
    assert any("org/missing@main: 404 Not Found" in line for line in lines)
    assert lines[-1] == ("sie-worker fetch: 2 of 3 snapshot(s) failed: org/gated, org/missing")
    assert "org/fine@main" in done.stdout  # the others are still fetched


def test_an_interrupted_fetch_resumes_with_the_files_it_lacks(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo("org/a", synthetic_model_files(shards=3))
    configs = tmp_path / "configs"
    write(configs, "org/a")
    shard = "model-00003-of-00003.safetensors"
    hub.drop("org/a", shard, after_bytes=1000, times=20)
    assert fetch(hub, tmp_path / "hf", str(configs)).returncode == 1
    # Nothing is trusted offline: the snapshot is incomplete.
    offline = fetch(hub, tmp_path / "hf", str(configs), HF_HUB_OFFLINE="1")
    assert offline.returncode == 1
    assert "incomplete" in offline.stderr

    hub.drop("org/a", shard, after_bytes=0, times=0)
    hub.requests.clear()
    done = fetch(hub, tmp_path / "hf", str(configs))

    assert done.returncode == 0, done.stderr
    assert fetched_files(hub, "org/a") == [shard]


def test_refresh_follows_a_branch_that_moved(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo("org/a", synthetic_model_files())
    configs = tmp_path / "configs"
    write(configs, "org/a")
    assert fetch(hub, tmp_path / "hf", str(configs)).returncode == 0
    newer = hub.add_repo("org/a", synthetic_model_files(weights_bytes=1_000_000))

    stays = fetch(hub, tmp_path / "hf", str(configs))
    moves = fetch(hub, tmp_path / "hf", str(configs), "--refresh")

    assert newer not in stays.stdout
    assert newer in moves.stdout
    ref = tmp_path / "hf" / "hub" / "models--org--a" / "refs" / "main"
    assert ref.read_text() == newer


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "name model config files or folders, or set SIE_CONFIG_DIR"),
        (("nowhere",), "nowhere: no such file or folder"),
    ],
)
def test_bad_arguments_exit_2(
    hub: FakeHub, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    done = fetch(hub, tmp_path / "hf", *args)
    assert done.returncode == 2
    assert done.stderr.strip() == f"sie-worker fetch: {message}"


def test_an_unknown_model_id_lists_the_known_ones(hub: FakeHub, tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    write(configs, "org/a")
    done = fetch(hub, tmp_path / "hf", str(configs), "--models", "org/zz")
    assert done.returncode == 2
    assert "--models names org/zz, which no config here serves; known: org/a" in done.stderr


def test_an_invalid_config_is_reported_like_validate(hub: FakeHub, tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "bad.yaml").write_text("sie_id: org/bad\n")
    done = fetch(hub, tmp_path / "hf", str(configs))
    assert done.returncode == 1
    assert f"{configs / 'bad.yaml'}: $" in done.stderr


def test_the_config_dir_comes_from_sie_config_dir(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo("org/a", synthetic_model_files())
    configs = tmp_path / "configs"
    write(configs, "org/a")
    done = fetch(hub, tmp_path / "hf", SIE_CONFIG_DIR=str(configs))
    assert done.returncode == 0, done.stderr
    assert sorted(fetched_files(hub, "org/a")) == SELECTED


def test_slow_fetches_report_progress_lines_when_not_on_a_terminal(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sie_worker.commands import fetch as command

    monkeypatch.setattr(command, "_STATUS_EVERY_S", 0.3)
    hub.add_repo("org/a", synthetic_model_files(weights_bytes=3 << 20))
    hub.bytes_per_s = 2 << 20
    configs = tmp_path / "configs"
    write(configs, "org/a")
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    err = tmp_path / "err"
    with err.open("w") as out:
        monkeypatch.setattr(sys, "stderr", out)
        from sie_worker.cli import main

        assert main(["fetch", str(configs)]) == 0
    lines = [line for line in err.read_text().splitlines() if line.startswith("org/a@main: ")]
    assert lines
    assert any(" GB (" in line and "%)" in line for line in lines)


def test_on_a_terminal_progress_is_a_tqdm_bar_of_bytes() -> None:
    import io
    from concurrent.futures import Future

    from sie_worker.commands import fetch as command
    from sie_worker.worker.weights.cache import SnapshotKey
    from sie_worker.worker.weights.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    progress = Progress()
    progress.expect({"model.safetensors": 3_000_000}, {"model.safetensors": 3_000_000})
    done: Future[Any] = Future()
    done.set_result(None)
    out = Terminal()
    command._report(command._Target(SnapshotKey("org/a")), done, progress, out)
    last = out.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("org/a@main: 100%")
    assert "3.00M/3.00M" in last


def test_fetch_downloads_a_profiles_hub_lora_adapters_too(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo("org/a", synthetic_model_files())
    adapter = {"adapter_config.json": b'{"r": 4}', "adapter_model.safetensors": b"\0" * 64}
    commit = hub.add_repo("org/sql-lora", adapter)
    configs = tmp_path / "configs"
    (tmp_path / "local-lora").mkdir()  # outside the config folder: its JSON is no config
    (tmp_path / "local-lora" / "adapter_config.json").write_text("{}")
    loadtime = {"lora_paths": {"sql": "org/sql-lora", "local": "../local-lora"}}
    write(configs, "org/a", profiles={"default": {"adapter_options": {"loadtime": loadtime}}})

    done = fetch(hub, tmp_path / "hf", str(configs))

    assert done.returncode == 0, done.stderr
    assert sorted(fetched_files(hub, "org/sql-lora")) == sorted(adapter)
    assert "org/sql-lora@main (org/a:sql): 2 files" in done.stdout
    snapshot = tmp_path / "hf" / "hub" / "models--org--sql-lora" / "snapshots" / commit
    assert (snapshot / "adapter_model.safetensors").is_file()


LLAMACPP = "sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter"


def _gguf_config(folder: Path, sie_id: str, gguf_file: str) -> Path:
    loadtime = {"gguf_file": gguf_file}
    profile = {"adapter_path": LLAMACPP, "adapter_options": {"loadtime": loadtime}}
    return write(folder, sie_id, hf_id="org/tiny-GGUF", profiles={"default": profile})


def test_a_llamacpp_model_fetches_only_its_gguf_file_and_another_config_the_other(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo("org/tiny-GGUF", gguf_repo_files())
    q4 = _gguf_config(tmp_path / "q4", "org/tiny-q4", "tiny-Q4_K_M.gguf")
    q8 = _gguf_config(tmp_path / "q8", "org/tiny-q8", "tiny-Q8_0.gguf")
    first = fetch(hub, tmp_path / "hf", str(q4))
    assert first.returncode == 0, first.stderr
    assert sorted(fetched_files(hub, "org/tiny-GGUF")) == ["config.json", "tiny-Q4_K_M.gguf"]
    assert "org/tiny-GGUF@main [tiny-Q4_K_M.gguf] (org/tiny-q4): 2 files" in first.stdout
    hub.requests.clear()
    second = fetch(hub, tmp_path / "hf", str(q8))
    assert second.returncode == 0, second.stderr
    assert fetched_files(hub, "org/tiny-GGUF") == ["tiny-Q8_0.gguf"]
    snapshots = list((tmp_path / "hf" / "hub" / "models--org--tiny-GGUF" / "snapshots").iterdir())
    assert len(snapshots) == 1
    assert sorted(p.name for p in snapshots[0].iterdir()) == [
        "config.json",
        "tiny-Q4_K_M.gguf",
        "tiny-Q8_0.gguf",
    ]
    # Both are complete now: offline, neither needs the hub.
    hub.requests.clear()
    both = fetch(hub, tmp_path / "hf", str(q4), str(q8), HF_HUB_OFFLINE="1")
    assert both.returncode == 0, both.stderr
    assert both.stdout.count("already complete in the cache") == 2
    assert hub.requests == []


def test_a_gguf_file_the_repo_lacks_fails_naming_the_files_it_holds(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo("org/tiny-GGUF", gguf_repo_files())
    config = _gguf_config(tmp_path / "c", "org/tiny-q5", "tiny-Q5_K_M.gguf")
    done = fetch(hub, tmp_path / "hf", str(config))
    assert done.returncode == 1
    assert "its .gguf files: tiny-Q4_K_M.gguf, tiny-Q8_0.gguf" in done.stderr
    assert fetched_files(hub, "org/tiny-GGUF") == []
