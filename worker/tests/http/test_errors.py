"""Every error carries SIE's code in X-SIE-Error-Code, from one table; sie-sdk's typed
load failure reads the body, so its requests get SIE's code there."""

from __future__ import annotations

import json

import pytest

import sie_worker.errors as errors_module
from sie_worker.errors import SIE_ERROR_CODES, LoadFailed, SieError, StartupTimeout, UnknownModel
from sie_worker.http.errors import error_body, error_response, from_sie_sdk, sse_error_event


def _subclasses(cls: type[SieError]) -> list[type[SieError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_every_code_of_the_error_family_has_an_sie_code() -> None:
    codes = {SieError.code} | {cls.code for cls in _subclasses(SieError)}
    assert codes <= set(SIE_ERROR_CODES), codes - set(SIE_ERROR_CODES)
    assert all(name in vars(errors_module) for name in errors_module.__all__)


@pytest.mark.parametrize(
    ("error", "sie_code"),
    [
        (UnknownModel("x"), "MODEL_NOT_FOUND"),
        (errors_module.InvalidRequest("x"), "INVALID_INPUT"),
        (errors_module.PlacementFailed("x"), "RESOURCE_EXHAUSTED"),
        (errors_module.ModelLoading("x"), "MODEL_LOADING"),
        (LoadFailed("x"), "MODEL_LOAD_FAILED"),
        (errors_module.Unauthorized(), "UNAUTHORIZED"),
        (SieError("x", status=418), "INTERNAL_ERROR"),
    ],
)
def test_a_response_carries_sies_code_beside_ours(error: SieError, sie_code: str) -> None:
    response = error_response(error)
    assert response.headers["x-sie-error-code"] == sie_code
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.body)["error"]["code"] == error.code


def test_a_load_failure_body_has_sies_detail_and_its_code_for_sie_sdk_only() -> None:
    error = LoadFailed("engine exited")
    ours = error_body(error)["error"]
    assert ours == {"code": "load_failed", "message": "engine exited", "error_class": "ENGINE",
                    "permanent": False, "attempts": 1}  # fmt: skip
    sdk = error_body(error, sie_sdk=True)["error"]
    assert (sdk["code"], sdk["worker_code"]) == ("MODEL_LOAD_FAILED", "load_failed")
    # a 504 is no ModelLoadFailedError for the SDK: its body keeps our code
    assert error_body(StartupTimeout("slow"), sie_sdk=True)["error"]["code"] == "startup_timeout"
    assert error_body(UnknownModel("x"), sie_sdk=True)["error"]["code"] == "unknown_model"


def test_the_param_is_in_the_body_and_in_stream_error_events() -> None:
    error = errors_module.InvalidRequest("items: required", param="items")
    assert error_body(error)["error"]["param"] == "items"
    assert json.loads(sse_error_event(error)[6:])["error"]["param"] == "items"


def test_sie_sdk_is_recognised_by_its_version_header() -> None:
    assert from_sie_sdk({"x-sie-sdk-version": "0.10.1"})
    assert not from_sie_sdk({"user-agent": "python-httpx"})
