"""Hypothesis fuzzing of config validation where ``worker/tests/test_config.py`` stops: the
Config API's body reader against the file reader, and real PUTs against a running worker.

``worker/tests/test_config.py`` already fuzzes ``parse_config`` / ``parse_config_text`` with
arbitrary JSON values, mutations of the seed example and YAML noise (every refusal is an
``InvalidConfig`` with ``$`` paths), and ``worker/tests/test_loadtime.py`` the load-time
rules. Added here:

- a body the Config API accepts is exactly a document a config file may hold (same verdict,
  same problems), for YAML and JSON bodies (found: deep nesting crashed the JSON reader,
  and bodies over the 1 MiB file limit were accepted, then refused at the next start);
- any PUT is stored (and then loads from its file at start) or refused with
  ``invalid_config`` naming ``$`` paths; never a 5xx.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sie_worker.config.files.reader import load_config_file, parse_config_text
from sie_worker.config.model import ModelConfig
from sie_worker.errors import InvalidConfig, Problem
from sie_worker.worker.config_store import parse_body

from tests.reliability._support import Launcher, Worker, assert_clean
from tests.support.config_strategies import json_values, mutated
from tests.support.worker_fixtures import fake_model

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["--tp=2", "--port", "CUDA_VISIBLE_DEVICES", "default", "..", "/x", "\x00"]),
)
_json = json_values(_leaf, max_size=3, max_leaves=12)


def _valid() -> dict[str, Any]:
    return fake_model("org/fuzz", profiles={"fast": {"extends": "default"}})


def _documents() -> st.SearchStrategy[Any]:
    """A valid config with up to three random changes: replaced values or new keys."""
    return mutated(_valid, _json, min_changes=0, max_changes=3)


def _verdict(read: Callable[[], ModelConfig]) -> tuple[str, ...]:
    """() when ``read`` accepts; else the sorted problem paths (each a ``$`` path)."""
    try:
        read()
    except InvalidConfig as exc:
        problems: tuple[Problem, ...] = exc.problems
        assert problems
        assert all(p.path.startswith("$") and p.message for p in problems)
        return tuple(sorted(_paired(p.path) for p in problems))
    return ()


def _paired(text: str) -> str:
    # The YAML reader keeps a JSON escape of an astral character ("\ud800\udc00") as two
    # lone surrogates where json.loads pairs them: the same key, spelt differently.
    return text.encode("utf-16", "surrogatepass").decode("utf-16")


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(doc=_documents(), as_json=st.booleans())
def test_a_config_api_body_is_judged_exactly_like_a_config_file(doc: Any, as_json: bool) -> None:
    if as_json:
        text = json.dumps(doc).encode()
        media = "application/json"
    else:
        text = yaml.safe_dump(doc, allow_unicode=True).encode()
        media = "application/yaml"
    api = _verdict(lambda: parse_body(text, media)[0])
    file = _verdict(lambda: parse_config_text(text, source="<request>"))
    assert api == file


@pytest.mark.parametrize("media", ["application/json", "application/yaml"])
def test_bodies_the_file_reader_refuses_by_size_or_depth_are_refused_by_the_api_too(
    media: str,
) -> None:
    padded = fake_model("org/fuzz", env={"PAD": "x" * (1024 * 1024)})
    big = json.dumps(padded).encode() if "json" in media else yaml.safe_dump(padded).encode()
    for body, says in ((big, "larger than"), (b"[" * 100_000, "nested")):
        with pytest.raises(InvalidConfig) as refused:
            parse_body(body, media)
        assert refused.value.problems[0].path == "$"
        assert says in refused.value.problems[0].message


@pytest.fixture(scope="module")
def worker(module_launcher: Launcher) -> Worker:
    return module_launcher.start([fake_model("org/ok")], devices="cuda:0")


@settings(
    max_examples=80,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    deadline=None,
)
@given(doc=_documents(), as_json=st.booleans())
def test_any_config_put_is_stored_and_loadable_or_refused_with_paths(
    worker: Worker, doc: Any, as_json: bool
) -> None:
    body = json.dumps(doc).encode() if as_json else yaml.safe_dump(doc).encode()
    media = "application/json" if as_json else "application/yaml"
    with worker.client() as client:
        response = client.put("/v1/configs/org/fuzz", content=body, headers={"Content-Type": media})
    assert response.status_code in (200, 201, 400), response.text
    if response.status_code == 400:
        error = response.json()["error"]
        assert error["code"] == "invalid_config"
        assert "$" in error["message"]
        return
    stored = worker.config_dir / "org" / "fuzz.yaml"
    assert load_config_file(stored).sie_id == "org/fuzz"  # what the next start will read


def test_the_fuzzed_worker_is_clean(worker: Worker) -> None:
    assert_clean(worker, probe="org/ok")
