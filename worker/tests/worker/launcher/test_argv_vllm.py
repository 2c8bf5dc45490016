"""vLLM's command line and environment for a load (pure): the argv DESIGN "Engines" fixes,
the memory flag, the binding to cpu devices' cores, and what the other engines keep."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import ServedModel, served_model
from sie_worker.settings import Settings
from sie_worker.sizing.memory_needs import EngineShare
from sie_worker.worker.launcher.plan import LaunchPlan, exports_metrics, plan_launch

GENERATION = "sie_server.adapters.vllm.generation:VLLMGenerationAdapter"
EMBEDDING = "sie_server.adapters.vllm.embedding:VLLMEmbeddingAdapter"
FOUR = tuple(f"cuda:{i}" for i in range(4))
MODULE = ("-m", "vllm.entrypoints.openai.api_server")


def _served(
    loadtime: dict[str, Any] | None = None,
    *,
    adapter: str = GENERATION,
    args: list[str] | None = None,
    **top: Any,
) -> ServedModel:
    profile: dict[str, Any] = {
        "adapter_path": adapter,
        "adapter_options": {"loadtime": loadtime or {}},
    }
    if args is not None:
        profile["extra_launch_args"] = args
    tasks = {"encode": {"dense": {"dim": 8}}} if adapter == EMBEDDING else {"generate": {}}
    doc = {
        "sie_id": "org/m",
        "hf_id": "org/m-weights",
        "tasks": tasks,
        "profiles": {"default": profile},
    }
    return served_model(parse_config({**doc, **top}, source="m.yaml"), "default")


def _plan(
    model: ServedModel,
    settings: Settings | None = None,
    *,
    share: float | None = None,
    kv_cache_gib: int | None = None,
) -> LaunchPlan:
    settings = settings or Settings(devices=FOUR, bundle="vllm")
    options = resolve_load_options(model, settings, env={})
    return plan_launch(
        model,
        options,
        settings.devices[: options.width],
        port=30011,
        nccl_port=30411,
        settings=settings,
        share=None if share is None and kv_cache_gib is None else EngineShare(share, kv_cache_gib),
    )


def _value(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_vllm_runs_its_openai_api_server_with_the_model_the_width_and_the_workers_port() -> None:
    plan = _plan(_served({"tensor_parallel_size": 2, "startup_timeout_s": 60,
                          "request_read_timeout_s": 60}))  # fmt: skip
    argv = plan.argv
    assert argv[:3] == (sys.executable, *MODULE)
    assert _value(argv, "--model") == "org/m-weights"
    assert _value(argv, "--served-model-name") == "org/m"
    assert _value(argv, "--tensor-parallel-size") == "2"
    assert (_value(argv, "--host"), _value(argv, "--port")) == ("127.0.0.1", "30011")
    assert "--trust-remote-code" in argv  # SIE's default
    assert "--disable-uvicorn-access-log" in argv
    # One node: vLLM finds its own rendezvous; the worker's pick is not passed.
    assert "--master-port" not in argv
    assert plan.nccl_port is None
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert plan.cores is None
    assert "cores" not in plan.summary()


def test_sie_vllm_command_replaces_python_m_and_a_declared_nccl_port_is_the_master_port() -> None:
    settings = Settings(
        devices=FOUR,
        bundle="vllm",
        engine_commands={"SIE_VLLM_COMMAND": ("numactl", "-N", "0", "vllm-py")},
    )
    model = _served({"tensor_parallel_size": 2, "nccl_port": 31000, "startup_timeout_s": 60,
                     "request_read_timeout_s": 60})  # fmt: skip
    plan = _plan(model, settings)
    assert plan.argv[:4] == ("numactl", "-N", "0", "vllm-py")
    assert _value(plan.argv, "--master-port") == "31000"
    assert plan.nccl_port == 31000


def test_options_become_the_vllm_flags_they_mean_and_extra_args_come_last() -> None:
    model = _served(
        {
            "max_seq_length": 4096,
            "compute_precision": "bfloat16",
            "trust_remote_code": False,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "quantization": "fp8",
            "kv_cache_dtype": "fp8",
            "gpu_memory_utilization": 0.5,
        },
        args=["--max-num-seqs", "8"],
        hf_revision="abc123",
    )
    argv = _plan(model).argv
    assert _value(argv, "--max-model-len") == "4096"
    assert _value(argv, "--dtype") == "bfloat16"
    assert "--trust-remote-code" not in argv
    assert "--enforce-eager" in argv
    assert "--no-enable-prefix-caching" in argv
    assert (_value(argv, "--quantization"), _value(argv, "--kv-cache-dtype")) == ("fp8", "fp8")
    assert _value(argv, "--gpu-memory-utilization") == "0.5"
    assert _value(argv, "--revision") == "abc123"
    assert argv[-2:] == ("--max-num-seqs", "8")


def test_the_memory_flag_is_the_engines_share_where_the_worker_knows_memory() -> None:
    assert _value(_plan(_served()).argv, "--gpu-memory-utilization") is None
    assert _value(_plan(_served(), share=0.9).argv, "--gpu-memory-utilization") == "0.9"
    declared = _served({"gpu_memory_utilization": 0.3})
    assert _value(_plan(declared, share=0.3).argv, "--gpu-memory-utilization") == "0.3"


def test_the_embedding_adapter_starts_vllms_pooling_runner() -> None:
    argv = _plan(_served(adapter=EMBEDDING)).argv
    assert _value(argv, "--runner") == "pooling"
    assert "--runner" not in _plan(_served()).argv


def test_lora_adapters_are_vllm_lora_modules(tmp_path: Path) -> None:
    for name in ("sql", "chat"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text('{"r": 8}')
    lora = {"lora_paths": {"sql": str(tmp_path / "sql"), "chat": str(tmp_path / "chat")},
            "max_loras_per_batch": 2, "max_lora_rank": 8}  # fmt: skip
    argv = _plan(_served(lora)).argv
    start = argv.index("--enable-lora")
    assert argv[start : start + 6] == (
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--lora-modules"
    )  # fmt: skip
    assert argv[start + 6 : start + 8] == (f"sql={tmp_path / 'sql'}", f"chat={tmp_path / 'chat'}")


def test_on_cpu_devices_each_rank_runs_on_its_devices_cores_with_its_kv_cache() -> None:
    settings = Settings(
        devices=("cpu:0", "cpu:1", "cpu:2", "cpu:3"),
        device_cores=((0, 1), (2, 3), (4, 5), (6, 7)),
        bundle="vllm",
    )
    model = _served({"tensor_parallel_size": 2, "startup_timeout_s": 60,
                     "request_read_timeout_s": 60})  # fmt: skip
    plan = _plan(model, settings, share=0.1, kv_cache_gib=1)
    assert plan.env == {
        "CUDA_VISIBLE_DEVICES": "",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1|2-3",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    # vLLM binds its ranks itself; its API server and engine core keep the container's CPUs.
    assert plan.cores is None


@pytest.mark.parametrize(
    ("adapter", "tasks"),
    [
        ("sie_server.adapters.sglang.generation:SGLangGenerationAdapter", None),
        ("sie_server.adapters.transformers:TransformersAdapter", {"encode": {}}),
    ],
)
def test_other_engines_on_cpu_devices_run_on_their_cores_without_vllms_binding(
    adapter: str, tasks: dict[str, Any] | None
) -> None:
    sglang = "sglang" in adapter
    settings = Settings(devices=("cpu:0", "cpu:1"), device_cores=((0,), (1,)), bundle="default")
    doc: dict[str, Any] = {"adapter_path": adapter}
    model = served_model(
        parse_config(
            {"sie_id": "org/m", "hf_id": "org/m", "tasks": tasks or {"generate": {}},
             "profiles": {"default": doc}},
            source="m.yaml",
        ),
        "default",
    )  # fmt: skip
    options = resolve_load_options(model, settings, env={})
    plan = plan_launch(model, options, ("cpu:1",), port=1, nccl_port=2, settings=settings)
    own = {  # SGLang's CPU engine, its ranks' core sets (one here), NCCL off
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_NCCL_SO_PATH": "/nonexistent/no-nccl-on-cpu-devices",
        "SGLANG_CPU_OMP_THREADS_BIND": "1",
        "OMP_NUM_THREADS": "1",
    }
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "", **(own if sglang else {})}
    assert plan.cores == (1,)
    assert not any(a.startswith("VLLM") for a in plan.env)


def test_vllm_and_sglang_export_their_metrics_and_the_default_engine_does_not() -> None:
    settings = Settings(devices=FOUR, bundle="vllm")
    assert exports_metrics(resolve_load_options(_served(), settings, env={}))
    transformers = served_model(
        parse_config(
            {"sie_id": "org/e", "hf_id": "org/e", "tasks": {"encode": {}},
             "profiles": {"default": {
                 "adapter_path": "sie_server.adapters.transformers:TransformersAdapter"}}},
            source="m.yaml",
        ),
        "default",
    )  # fmt: skip
    assert not exports_metrics(resolve_load_options(transformers, settings, env={}))


def test_pipeline_stages_on_cpu_devices_run_traced_so_later_stages_get_their_warm_up() -> None:
    timeouts = {"startup_timeout_s": 300, "request_read_timeout_s": 120}
    model = _served({"pipeline_parallel_size": 2, "tensor_parallel_size": 1, **timeouts})
    on_cpu = _plan(model, Settings(devices=("cpu:0", "cpu:1"), bundle="vllm"))
    assert _value(on_cpu.argv, "--pipeline-parallel-size") == "2"
    assert _value(on_cpu.argv, "--compilation-config") == '{"mode": 2, "backend": "eager"}'
    # What the config says on GPUs, and one stage on cpu devices, is left as it is.
    assert "--compilation-config" not in _plan(model).argv
    one_stage = _served({"tensor_parallel_size": 2, **timeouts})
    assert (
        "--compilation-config"
        not in _plan(one_stage, Settings(devices=("cpu:0", "cpu:1"), bundle="vllm")).argv
    )
