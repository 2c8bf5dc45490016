"""What the worker reads from a request before it acquires an engine: the payload, the
served model that answers it (grammar routing), the endpoint's task, ``Prefer: wait``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.worker_fixtures import WorkerProcess, fake_model

from sie_worker.config.files.reader import parse_config
from sie_worker.config.model import ModelConfig, served_models
from sie_worker.config.runtime import is_grammar_constrained
from sie_worker.worker.request import (
    ENDPOINT_TASKS,
    SIE_CLIENT_LOAD_WAIT_S,
    load_wait,
    prefer_wait,
    task_of,
)
from sie_worker.worker.serving import serving_facts

StartWorker = Callable[..., WorkerProcess]
GRAMMAR_REQUESTS: list[dict[str, Any]] = [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "regex", "regex": "[a-z]+"}},
    {"response_format": {"type": "ebnf", "ebnf": 'root ::= "a"'}},
    {"regex": "[0-9]+"},
    {"ebnf": 'root ::= "a"'},
    {"json_schema": "{}"},
    {"structural_tag": "{}"},
]
PLAIN_REQUESTS: list[dict[str, Any]] = [
    {},
    {"response_format": {"type": "text"}},
    {"response_format": {}},
    {"response_format": "json_object"},  # not the OpenAI shape: not a grammar
    {"regex": None},
    {"temperature": 0},
]


def _config(grammar_profile: str | None = "structured") -> Any:
    doc: dict[str, Any] = {
        "sie_id": "org/m",
        "hf_id": "org/m",
        "tasks": {"generate": {}},
        "profiles": {"default": {}, "structured": {"extends": "default"}, "fast": {}},
    }
    if grammar_profile is not None:
        doc["grammar_profile"] = grammar_profile
    return parse_config(doc, source=None)


def served_id(config: ModelConfig, model_id: str, payload: dict[str, Any]) -> str:
    """The served model the route picks for ``payload`` sent to ``model_id``: its facts'
    grammar id when the payload is grammar-constrained (``worker/inference.py``)."""
    served = {s.id: s for s in served_models(config)}[model_id]
    return serving_facts(served).grammar_id if is_grammar_constrained(payload) else model_id


@pytest.mark.parametrize("extra", GRAMMAR_REQUESTS)
def test_grammar_constrained_request_to_the_base_model_goes_to_the_grammar_profile(
    extra: dict[str, Any],
) -> None:
    payload = {"model": "org/m", **extra}
    assert is_grammar_constrained(payload)
    assert served_id(_config(), "org/m", payload) == "org/m:structured"


@pytest.mark.parametrize("extra", PLAIN_REQUESTS)
def test_unconstrained_request_stays_with_the_model_it_names(extra: dict[str, Any]) -> None:
    payload = {"model": "org/m", **extra}
    assert not is_grammar_constrained(payload)
    assert served_id(_config(), "org/m", payload) == "org/m"


@pytest.mark.parametrize("extra", GRAMMAR_REQUESTS)
def test_model_without_a_grammar_profile_stays_put(extra: dict[str, Any]) -> None:
    assert served_id(_config(None), "org/m", {"model": "org/m", **extra}) == "org/m"


@pytest.mark.parametrize("extra", GRAMMAR_REQUESTS)
def test_grammar_request_naming_the_grammar_profile_stays_there(extra: dict[str, Any]) -> None:
    payload = {"model": "org/m:structured", **extra}
    assert served_id(_config(), "org/m:structured", payload) == "org/m:structured"


@pytest.mark.parametrize("extra", GRAMMAR_REQUESTS)
def test_grammar_request_to_a_variant_that_may_speculate_goes_to_the_grammar_profile(
    extra: dict[str, Any],
) -> None:
    payload = {"model": "org/m:fast", **extra}
    assert served_id(_config(), "org/m:fast", payload) == "org/m:structured"
    assert served_id(_config(), "org/m:fast", {"model": "org/m:fast"}) == "org/m:fast"


@given(
    st.dictionaries(
        st.sampled_from(["regex", "ebnf", "json_schema", "structural_tag", "response_format", "x"]),
        st.one_of(st.none(), st.text(max_size=3), st.fixed_dictionaries({"type": st.text()})),
    )
)
def test_served_id_is_the_named_model_or_its_grammar_profile(extra: dict[str, Any]) -> None:
    chosen = served_id(_config(), "org/m", {"model": "org/m", **extra})
    assert chosen == ("org/m:structured" if is_grammar_constrained(extra) else "org/m")


def test_endpoints_name_their_task() -> None:
    assert {path: task_of(path) for path in ENDPOINT_TASKS} == {
        "/v1/chat/completions": "generate",
        "/v1/completions": "generate",
        "/v1/embeddings": "encode",
    }


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("wait=5", 5.0),
        ("respond-async, wait=2.5", 2.5),
        ("WAIT = 10", 10.0),
        ("handling=lenient", None),
        ("wait=", None),
    ],
)
def test_prefer_wait_reads_rfc_7240(header: str | None, seconds: float | None) -> None:
    assert prefer_wait({"prefer": header} if header else {}) == seconds


def test_grammar_request_is_served_by_the_grammar_profile_over_http(
    start_worker: StartWorker,
) -> None:
    config = fake_model("org/g", profiles={"structured": {"extends": "default"}})
    config["grammar_profile"] = "structured"
    plain = fake_model("org/p")
    worker = start_worker([config, plain], devices="cuda:0,cuda:1")
    grammar = {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}
    messages = [{"role": "user", "content": "hi"}]
    with worker.client() as client:
        for model in ("org/g", "org/p"):
            body = {"model": model, "max_tokens": 2, "messages": messages, **grammar}
            response = client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
    states = {m: e["state"] for m, e in worker.models().items()}
    assert states["org/g:structured"] == "ready"
    assert states["org/g"] == "unloaded"
    assert states["org/p"] == "ready"


def test_sie_routes_and_sie_sdk_wait_for_a_load_less_than_the_sdk_reads() -> None:
    # sie-sdk reads for at most 150 s and never retries a read timeout; it retries a 503
    assert SIE_CLIENT_LOAD_WAIT_S < 150
    assert load_wait({}, sie_route=False) is None
    assert load_wait({}, sie_route=True) == SIE_CLIENT_LOAD_WAIT_S
    assert load_wait({"x-sie-sdk-version": "0.10.1"}, sie_route=False) == SIE_CLIENT_LOAD_WAIT_S
    assert load_wait({"prefer": "wait=3"}, sie_route=True) == 3.0


def test_the_engines_rerank_endpoint_needs_the_score_task() -> None:
    assert task_of("/v1/rerank") == "score"
    assert task_of("/v1/embeddings") == "encode"
