"""The engines' own parsers read every rank's argv of a pipeline-parallel model and of a model
a group of nodes serves exactly as planned: tensor width, stages, nodes, rank, rendezvous.

SGLang: the venv's release (its ``ServerArgs`` too) and the old bundle's (argparse only, as
in ``test_sglang_parser.py``); vLLM: ``.venv-vllm``'s release. One parser run per release.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.support import sglang_parser
from tests.support.ci import missing
from tests.support.vllm_engine import VLLM_PYTHON

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import served_models
from sie_worker.settings import Settings
from sie_worker.worker.launcher.plan import plan_launch
from sie_worker.worker.launcher.ranks import group_rank

pytestmark = pytest.mark.slow  # each release's parser imports in a fresh interpreter

ROOT = Path(__file__).resolve().parents[4]
OLD_PATH = Path(os.environ.get("SIE_SGLANG_OLD_PATH", ROOT / ".tools" / "sglang-0.5.10"))
ADAPTERS = {
    "sglang": "sie_server.adapters.sglang.generation:SGLangGenerationAdapter",
    "vllm": "sie_server.adapters.vllm.generation:VLLMGenerationAdapter",
}
# (tensor, stages, nodes, devices per worker): one worker with stages; groups of 2 and 3.
LAYOUTS = [(2, 2, 1, 4), (8, 2, 2, 8), (6, 2, 3, 4), (8, 1, 2, 4)]
LEADER = "10.1.2.3"


def _cases(engine: str, bundle: str) -> list[tuple[dict[str, int], list[str]]]:
    cases = []
    for tensor, stages, nodes, devices in LAYOUTS:
        loadtime = {
            "tensor_parallel_size": tensor,
            "pipeline_parallel_size": stages,
            "startup_timeout_s": 900,
            "request_read_timeout_s": 600,
        }
        doc = {
            "sie_id": "org/wide",
            "hf_id": "org/wide",
            "tasks": {"generate": {"context_length": 4096}},
            "profiles": {
                "default": {
                    "adapter_path": ADAPTERS[engine],
                    "adapter_options": {"loadtime": loadtime},
                }
            },
        }
        served = served_models(parse_config(doc, source="<t>"))[0]
        for rank in range(nodes):
            group = (
                {"nodes": nodes, "node_rank": rank, "leader_address": LEADER} if nodes > 1 else {}
            )
            settings = Settings(
                devices=tuple(f"cuda:{i}" for i in range(devices)),
                bundle=bundle,
                pinned_models=("org/other", "org/wide"),
                **group,  # type: ignore[arg-type]
            )
            options = resolve_load_options(served, settings, env={})
            ranked = group_rank(served.id, None, settings) if options.grouped else None
            plan = plan_launch(
                served,
                options,
                settings.devices[: options.claim_width],
                port=30001,
                nccl_port=30499,
                settings=settings,
                group=ranked,
            )
            want = {"tensor": tensor, "stages": stages, "nodes": nodes, "rank": rank}
            # vLLM's headless ranks run `vllm serve`: its subcommand's parser is the same.
            start = 4 if plan.argv[3:4] == ("serve",) else 3
            cases.append((want, list(plan.argv[start:])))
    return cases


def _parse(python: Path, harness: str, argvs: list[list[str]], **request: Any) -> list[Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if "pythonpath" in request:
        env["PYTHONPATH"] = str(request.pop("pythonpath"))
    done = subprocess.run(
        [str(python), str(ROOT / "tests" / "support" / harness)],
        input=json.dumps({"argvs": argvs, **request}),
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[Any] = json.loads(done.stdout)["argvs"]
    return results


def _check_sglang(cases: list[tuple[dict[str, int], list[str]]], results: list[Any]) -> None:
    assert len(results) == len(cases)
    for (want, argv), result in zip(cases, results, strict=True):
        assert result["ok"], (argv, result["error"])
        values = result["values"]
        tp = values.get("tp_size", values.get("tensor_parallel_size"))
        pp = values.get("pp_size", values.get("pipeline_parallel_size"))
        assert (tp, pp) == (want["tensor"], want["stages"]), argv
        assert (values["nnodes"], values["node_rank"]) == (want["nodes"], want["rank"]), argv
        if want["nodes"] > 1:
            assert values["dist_init_addr"] == f"{LEADER}:30401", argv


@pytest.mark.torch  # SGLang's own parser and ServerArgs
def test_sglangs_parser_and_server_args_read_every_ranks_argv() -> None:
    if importlib.util.find_spec("sglang") is None:
        missing("sglang is not installed (scripts/setup installs its parser)")
    cases = _cases("sglang", "sglang-cu130")
    request = {"argvs": [a for _, a in cases], "server_args": True}
    _check_sglang(cases, sglang_parser.parse(request)["argvs"])


@pytest.mark.torch  # SGLang 0.5.10's own parser
def test_the_old_sglang_bundles_parser_reads_every_ranks_argv() -> None:
    if not (OLD_PATH / "sglang").is_dir():
        missing(f"no SGLang 0.5.10 parser in {OLD_PATH} (scripts/setup-tools puts it there)")
    cases = _cases("sglang", "sglang")
    request = {"argvs": [a for _, a in cases], "server_args": False}
    _check_sglang(cases, sglang_parser.parse(request, OLD_PATH)["argvs"])


@pytest.mark.vllm
def test_vllms_parser_reads_every_ranks_argv() -> None:
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/setup-vllm (make test does)")
    cases = _cases("vllm", "vllm")
    results = _parse(VLLM_PYTHON, "vllm_parser_harness.py", [a for _, a in cases])
    assert len(results) == len(cases)
    for (want, argv), result in zip(cases, results, strict=True):
        assert result["ok"], (argv, result["error"])
        values = result["values"]
        assert values["tensor_parallel_size"] == want["tensor"], argv
        assert values["pipeline_parallel_size"] == want["stages"], argv
        if want["nodes"] > 1:
            assert (values["nnodes"], values["node_rank"]) == (want["nodes"], want["rank"])
            assert (values["master_addr"], values["master_port"]) == (LEADER, 30401)
            assert values["headless"] is (want["rank"] > 0)
        else:
            assert values["master_port"] != 30401  # one node: vLLM's own rendezvous
