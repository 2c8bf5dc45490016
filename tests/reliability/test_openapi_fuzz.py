"""schemathesis against ``/openapi.json`` of a running worker with fake engines behind it.

Its CLI runs the coverage, fuzzing and stateful phases (a bounded number of examples per
operation, a fixed seed so CI is reproducible; set ``SIE_FUZZ_SEED`` to explore). The checks:
no 5xx, every status, content type, header and body as described, and with ``SIE_API_KEY``
set, no operation served without or with a wrong key. Not checked: whether schema-valid
OpenAI bodies are accepted (the engine decides what a valid prompt is); the ``Allow``
header of 405 answers has a test of its own below.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability._support import Launcher, assert_clean
from tests.support import loopback
from tests.support.worker_fixtures import fake_model

_KEY = "fuzz-key-0123456789"
_CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "missing_required_header",
        "ignored_auth",
        "use_after_free",
        "ensure_resource_availability",
    ]
)


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    launcher: Launcher, tmp_path: Path
) -> None:
    worker = launcher.start(
        [
            fake_model("org/gen", profiles={"fast": {"extends": "default"}}),
            fake_model("org/emb", task="encode"),
            fake_model("org/tp2", width=2),
        ],
        api_key=_KEY,
    )
    st = Path(sys.executable).with_name("st")
    argv = [
        str(st),
        "run",
        f"{worker.url}/openapi.json",
        *("--header", f"Authorization: Bearer {_KEY}"),
        *("--checks", _CHECKS),
        *("--max-examples", "25"),
        *("--seed", os.environ.get("SIE_FUZZ_SEED", "20261129")),
        *("--request-timeout", "60"),
        *("--warnings", "off"),
        # Ids may hold '/', which the fuzzer filters out of path parameters; that is a limit
        # of the generator, not a finding about the API.
        *("--suppress-health-check", "filter_too_much"),
        "--no-color",
    ]
    result = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False
    )
    report = result.stdout[-12000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert "No issues found" in result.stdout, report
    log = worker.logs()
    assert "unexpected error" not in log
    assert "Exception in ASGI application" not in log
    assert loopback.get(worker.url + "/healthz").status_code == 200
    assert_clean(worker, probe=None)  # the fuzzer pinned, loaded, deleted what it liked


def test_method_not_allowed_answers_name_the_allowed_methods(launcher: Launcher) -> None:
    worker = launcher.start([], devices="cuda:0")
    with worker.client() as client:
        response = client.request("TRACE", "/v1/models")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert set(response.headers["allow"].split(", ")) == {"GET", "HEAD"}  # HEAD comes with GET
