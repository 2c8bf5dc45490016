"""One model-id rule at every hop (gateway -> slot router -> worker -> fake engine, every
one a real process): a served id in another case is served; a name two served ids match
but for case is 400 ``ambiguous_model`` naming both; an unknown name is 404
``unknown_model``, whichever hop the client talks to, on OpenAI and SIE routes alike."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support import loopback
from tests.support.gateway_fixtures import GatewayProcess, PodProcess
from tests.support.worker_fixtures import fake_model

pytestmark = pytest.mark.slow


def test_every_hop_answers_a_model_name_alike(
    start_pod: Callable[..., PodProcess], start_gateway: Callable[..., GatewayProcess]
) -> None:
    pod = start_pod([fake_model("org/m"), fake_model("Org/Dup"), fake_model("org/dup")])
    gateway = start_gateway([{"pool": "p", "bundle": "sglang", "gpu_type": "l4",
                              "endpoints": [pod.url]}])  # fmt: skip
    hops = {"worker": pod.workers[0].url, "router": pod.url, "gateway": gateway.url}
    with loopback.client(timeout=60) as client:
        load = client.post(f"{pod.url}/v1/models/org/m/load")
        assert load.status_code == 200, load.text
        seen: dict[str, list[tuple[int, str | None]]] = {}
        for hop, url in hops.items():
            answers = [
                client.post(f"{url}/v1/completions", json={"model": m, "prompt": "x"})
                for m in ("ORG/M", "ORG/DUP", "nobody/knows")
            ]
            answers += [
                client.post(f"{url}/v1/generate/{m}", json={"prompt": "x", "max_new_tokens": 2})
                for m in ("ORG__M", "ORG__DUP", "nobody__knows")
            ]
            seen[hop] = [
                (a.status_code, a.json().get("error", {}).get("code") if a.is_error else None)
                for a in answers
            ]
            ambiguous = answers[1].json()["error"]["message"]
            assert "Org/Dup, org/dup" in ambiguous, (hop, ambiguous)
    expected = [(200, None), (400, "ambiguous_model"), (404, "unknown_model")] * 2
    assert seen == dict.fromkeys(hops, expected)
