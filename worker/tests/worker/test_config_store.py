from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tests.support.worker_fixtures import fake_model

from sie_worker.errors import Forbidden, InvalidConfig, InvalidRequest
from sie_worker.worker.config_store import ConfigStore, parse_body, plain


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    "bad_id",
    ["", "../x", "a/../../x", "/etc/passwd", ".hidden", "a/.b", "a:b", "a\x00b", "a\\b", "a//b"],
)
def test_ids_that_cannot_name_a_file_inside_the_dir_are_refused(
    tmp_path: Path, bad_id: str
) -> None:
    with pytest.raises(InvalidRequest):
        ConfigStore(tmp_path, "read-write").path_for(bad_id)


def test_ids_with_slashes_become_nested_files(tmp_path: Path) -> None:
    path = ConfigStore(tmp_path, "read-write").path_for("org/team/model-1.5")
    assert path == tmp_path.resolve() / "org" / "team" / "model-1.5.yaml"


@pytest.mark.anyio
async def test_write_is_atomic_and_leaves_no_temp_file(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path, "read-write")
    body = yaml.safe_dump(fake_model("org/m")).encode()
    config, media = parse_body(body, "application/yaml")
    assert await store.write("org/m", config, body, media) is True
    assert await store.write("org/m", config, body, media) is False
    assert _files(tmp_path) == [Path("org/m.yaml")]
    assert yaml.safe_load((tmp_path / "org/m.yaml").read_text())["sie_id"] == "org/m"


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


@pytest.mark.anyio
async def test_json_bodies_are_stored_as_yaml(tmp_path: Path) -> None:
    import json

    store = ConfigStore(tmp_path, "read-write")
    body = json.dumps(fake_model("org/j")).encode()
    config, media = parse_body(body, "application/json")
    await store.write("org/j", config, body, media)
    assert yaml.safe_load((tmp_path / "org/j.yaml").read_text()) == plain(config.raw)


def test_stale_temp_files_are_removed(tmp_path: Path) -> None:
    (tmp_path / "org").mkdir()
    stale = tmp_path / "org" / ".m.yaml.x1.sie-tmp"
    stale.write_text("half")
    assert ConfigStore(tmp_path, "read-write").remove_stale_temp_files() == [stale]
    assert not stale.exists()


def test_read_only_and_disabled_modes_refuse_with_the_variable_name(tmp_path: Path) -> None:
    with pytest.raises(Forbidden, match="SIE_CONFIG_API=read-only"):
        ConfigStore(tmp_path, "read-only").check_writable()
    with pytest.raises(Forbidden, match="SIE_CONFIG_API=disabled"):
        ConfigStore(tmp_path, "disabled").check_readable()
    with pytest.raises(Forbidden, match="--config-dir"):
        ConfigStore(None, "read-write").check_writable()


@pytest.mark.parametrize(
    ("body", "kind"), [(b"\xff\xfe", "yaml"), (b"a: [", "yaml"), (b"{", "json"), (b"[]", "json")]
)
def test_unparseable_bodies_are_invalid_config_with_a_path(body: bytes, kind: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        parse_body(body, f"application/{kind}")
    assert caught.value.problems
    assert all(p.path.startswith("$") for p in caught.value.problems)
