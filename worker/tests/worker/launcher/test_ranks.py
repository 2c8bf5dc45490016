"""Pipeline parallelism and groups of nodes, planned: widths, ranks, rendezvous ports, argv.

Pure: no processes. The engines' own parsers read these argvs in
``worker/tests/config/flags/test_group_parsers.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.load_options import LoadOptions, declared_width
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import served_models
from sie_worker.config.widths import (
    MAX_WIDTH,
    group_width_problem,
    model_width,
    rank_width,
    stages_problem,
    width_fits,
)
from sie_worker.engines.registry import family_of
from sie_worker.errors import InvalidConfig
from sie_worker.settings import Settings
from sie_worker.worker.launcher.plan import LaunchPlan, plan_launch
from sie_worker.worker.launcher.ranks import GROUP_PORT_BASE, GroupRank, group_port

SGLANG = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
VLLM = "sie_server.adapters.vllm.generation:VLLMGenerationAdapter"
ID = "org/wide"
LT = "$.profiles.default.adapter_options.loadtime"


def gpus(count: int) -> tuple[str, ...]:
    return tuple(f"cuda:{i}" for i in range(count))


def served(adapter: str = SGLANG, model_path: str | None = None, **loadtime: Any) -> Any:
    loadtime = {"startup_timeout_s": 900, "request_read_timeout_s": 600, **loadtime}
    doc: dict[str, Any] = {
        "sie_id": ID,
        "hf_id": ID,
        "tasks": {"generate": {"context_length": 4096}},
        "profiles": {
            "default": {"adapter_path": adapter, "adapter_options": {"loadtime": loadtime}}
        },
    }
    if model_path is not None:
        doc["model_path"] = model_path
    return served_models(parse_config(doc, source="<t>"))[0]


def group_settings(
    devices: int, nodes: int = 1, rank: int = 0, bundle: str = "sglang", **more: Any
) -> Settings:
    group: dict[str, Any] = {}
    if nodes > 1:
        group = {"nodes": nodes, "node_rank": rank, "leader_address": "sie-0.sie"}
    return Settings(devices=gpus(devices), bundle=bundle, **group, **more)


def resolve(served_model: Any, settings: Settings) -> LoadOptions:
    return resolve_load_options(served_model, settings, env={})


def refusals(served_model: Any, settings: Settings) -> dict[str, str]:
    with pytest.raises(InvalidConfig) as caught:
        resolve(served_model, settings)
    return {p.path.removeprefix(LT + "."): p.message for p in caught.value.problems}


def plan_of(options: LoadOptions, served_model: Any, settings: Settings) -> LaunchPlan:
    group = None
    if options.grouped:
        port = group_port(served_model.id, options.nccl_port, settings.pinned_models)
        assert settings.leader_address is not None
        group = GroupRank(settings.nodes, settings.node_rank, settings.leader_address, port)
    return plan_launch(
        served_model,
        options,
        settings.devices[: options.claim_width],
        port=30001,
        nccl_port=30499,
        settings=settings,
        group=group,
    )


# --- widths ---------------------------------------------------------------------------------


@given(st.integers(1, MAX_WIDTH), st.integers(1, MAX_WIDTH))
def test_the_width_is_tensor_times_stages(tensor: int, stages: int) -> None:
    assert model_width(tensor, stages) == tensor * stages
    loadtime = {"tensor_parallel_size": tensor, "pipeline_parallel_size": stages}
    assert declared_width(served(**loadtime)) == tensor * stages


@pytest.mark.parametrize("value", [0, 9, 2.0, "2", True, False, None, [2]])
def test_stages_must_be_an_integer_from_one_to_eight_when_a_config_is_read(value: object) -> None:
    message = stages_problem(value)
    assert message is not None
    assert message.startswith("must be an integer from 1 to 8")
    with pytest.raises(InvalidConfig) as caught:
        served(pipeline_parallel_size=value)
    assert [(p.path, p.message) for p in caught.value.problems] == [
        (f"{LT}.pipeline_parallel_size", message)
    ]


@given(
    width=st.integers(1, 64),
    devices=st.integers(1, 8),
    nodes=st.integers(1, 8),
)
def test_a_width_is_served_by_one_worker_or_spread_equally_over_the_group(
    width: int, devices: int, nodes: int
) -> None:
    problem = group_width_problem(width, devices, nodes)
    if width_fits(width, devices):
        assert problem is None  # one worker serves it, group or not
    elif nodes == 1:
        assert problem is not None
        assert "SIE_NODES is unset" in problem
    elif width % nodes:
        assert problem is not None
        assert f"multiple of {nodes}" in problem
    elif width > devices * nodes:
        assert problem is not None
        assert f"{nodes} nodes x {devices} devices" in problem
    else:
        assert problem is None
        assert 1 <= rank_width(width, nodes) <= devices
        assert rank_width(width, nodes) * nodes == width


def test_pipeline_stages_widen_the_block_on_one_worker() -> None:
    settings = group_settings(4)
    options = resolve(served(tensor_parallel_size=2, pipeline_parallel_size=2), settings)
    assert (options.width, options.tensor_width, options.stages) == (4, 2, 2)
    assert (options.claim_width, options.grouped) == (4, False)
    argv = list(plan_of(options, served(), settings).argv)
    assert argv[argv.index("--tp-size") + 1 : argv.index("--tp-size") + 4] == [
        "2",
        "--pp-size",
        "2",
    ]
    assert "--nnodes" not in argv
    assert argv[argv.index("--nccl-port") + 1] == "30499"


def test_the_head_check_applies_to_the_tensor_width_only(tmp_path: Any) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"num_attention_heads": 6, "num_key_value_heads": 2}')
    settings = group_settings(8)
    # 2 splits 6 heads; the 4 stages split layers, not heads: width 8 is fine.
    ok = served(model_path=str(folder), tensor_parallel_size=2, pipeline_parallel_size=4)
    assert resolve(ok, settings).width == 8
    # 4 does not split 6 heads, whatever the stages.
    bad = served(model_path=str(folder), tensor_parallel_size=4, pipeline_parallel_size=2)
    assert "tensor_parallel_size" in refusals(bad, settings)


def test_a_model_wider_than_one_worker_needs_a_group() -> None:
    found = refusals(served(tensor_parallel_size=8, pipeline_parallel_size=2), group_settings(8))
    assert "SIE_NODES is unset" in found["pipeline_parallel_size"]
    assert "gpu.nodes" in found["pipeline_parallel_size"]


def test_a_group_model_must_be_pinned() -> None:
    settings = group_settings(8, nodes=2)
    found = refusals(served(tensor_parallel_size=8, pipeline_parallel_size=2), settings)
    assert found["pipeline_parallel_size"].endswith(f"add {ID} to SIE_PINNED_MODELS")


def test_a_group_model_must_split_equally_over_the_nodes() -> None:
    settings = group_settings(4, nodes=3, pinned_models=(ID,))
    found = refusals(served(tensor_parallel_size=8), settings)
    assert "multiple of 3" in found["tensor_parallel_size"]
    settings = group_settings(4, nodes=2, pinned_models=(ID,))
    found = refusals(served(tensor_parallel_size=8, pipeline_parallel_size=2), settings)
    assert "2 nodes x 4 devices = 8" in found["pipeline_parallel_size"]


def test_a_model_that_fits_a_worker_of_a_group_is_that_workers_alone() -> None:
    settings = group_settings(8, nodes=2, rank=0)
    options = resolve(served(tensor_parallel_size=4), settings)
    assert (options.claim_width, options.grouped) == (4, False)


# --- rendezvous ports and ranks -------------------------------------------------------------


@given(
    pinned=st.lists(st.text("abc/", min_size=1, max_size=4), unique=True, max_size=8),
    declared=st.none() | st.integers(1024, 65535),
)
def test_every_rank_finds_the_same_rendezvous_port(pinned: list[str], declared: int | None) -> None:
    for index, model in enumerate(pinned):
        port = group_port(model, declared, tuple(pinned))
        assert port == (declared if declared is not None else GROUP_PORT_BASE + index)
    ports = {group_port(m, None, tuple(pinned)) for m in pinned}
    assert len(ports) == len(pinned)  # one port per group model


@given(nodes=st.integers(2, 8), data=st.data())
def test_rank_flags_name_the_group_and_the_leader(nodes: int, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, nodes - 1))
    group = GroupRank(nodes, rank, "sie-0.sie", 30402)
    sglang = family_of("sglang").rank_args(group)
    assert sglang == [
        "--nnodes", str(nodes), "--node-rank", str(rank), "--dist-init-addr", "sie-0.sie:30402"
    ]  # fmt: skip
    vllm = family_of("vllm").rank_args(group)
    assert vllm[:8] == [
        "--nnodes", str(nodes), "--node-rank", str(rank),
        "--master-addr", "sie-0.sie", "--master-port", "30402",
    ]  # fmt: skip
    assert ("--headless" in vllm) == (rank > 0)


def test_an_ipv6_leader_is_bracketed_for_sglang() -> None:
    args = family_of("sglang").rank_args(GroupRank(2, 1, "fd00::1", 30400))
    assert args[-1] == "[fd00::1]:30400"


def test_the_default_engine_has_no_ranks_across_nodes() -> None:
    with pytest.raises(ValueError, match="no ranks across nodes"):
        family_of("transformers").rank_args(GroupRank(2, 0, "h", 30400))


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_each_rank_claims_its_share_from_cuda0_and_starts_its_engine_rank(
    engine: str, rank: int
) -> None:
    adapter, bundle = (SGLANG, "sglang") if engine == "sglang" else (VLLM, "vllm")
    settings = group_settings(8, nodes=3, rank=rank, bundle=bundle, pinned_models=("other", ID))
    model = served(adapter, tensor_parallel_size=6, pipeline_parallel_size=2)
    options = resolve(model, settings)
    assert (options.width, options.claim_width, options.grouped) == (12, 4, True)
    plan = plan_of(options, model, settings)
    assert plan.devices == gpus(4)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    summary = plan.summary()
    assert (summary["width"], summary["rank"], summary["nodes"]) == (12, rank, 3)
    assert summary["rendezvous"] == "sie-0.sie:30401"  # index 1 of the pinned models
    argv = list(plan.argv)
    assert argv[argv.index("--node-rank") + 1] == str(rank)
    if engine == "sglang":
        assert argv[argv.index("--tp-size") + 1] == "6"
        assert argv[argv.index("--pp-size") + 1] == "2"
        assert argv[argv.index("--dist-init-addr") + 1] == "sie-0.sie:30401"
        assert "--nccl-port" not in argv
        assert plan.health_path == "/health"
    else:
        assert argv[argv.index("--tensor-parallel-size") + 1] == "6"
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
        assert argv[argv.index("--master-port") + 1] == "30401"
        assert argv.count("--master-port") == 1
        assert ("--headless" in argv) == (rank > 0)
        # Only `vllm serve` runs headless (its API server module would start an engine).
        module = (
            ["vllm.entrypoints.cli.main", "serve"]
            if rank
            else ["vllm.entrypoints.openai.api_server"]
        )
        assert argv[1 : 2 + len(module)] == ["-m", *module]
        # A headless rank serves no HTTP: it is ready once started.
        assert plan.health_path == (None if rank else "/health")


def test_a_vllm_command_prefix_runs_vllm_serve_on_headless_ranks() -> None:
    prefix = ("numactl", "-N", "0", "/opt/py", "-m", "vllm.entrypoints.openai.api_server")
    model = served(VLLM, tensor_parallel_size=8, pipeline_parallel_size=2)
    for rank, head in (
        (0, list(prefix)),
        (1, [*prefix[:-1], "vllm.entrypoints.cli.main", "serve"]),
    ):
        settings = group_settings(8, nodes=2, rank=rank, bundle="vllm", pinned_models=(ID,))
        settings = settings.with_overrides(engine_commands={"SIE_VLLM_COMMAND": prefix})
        argv = list(plan_of(resolve(model, settings), model, settings).argv)
        assert argv[: len(head)] == head
        assert argv[len(head)] == "--model"


def test_a_group_model_needs_its_rank_to_be_planned() -> None:
    settings = group_settings(8, nodes=2, pinned_models=(ID,))
    model = served(tensor_parallel_size=8, pipeline_parallel_size=2)
    options = resolve(model, settings)
    with pytest.raises(ValueError, match="needs its rank"):
        plan_launch(model, options, gpus(8), port=1, nccl_port=None, settings=settings)
