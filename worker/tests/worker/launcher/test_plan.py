"""The engine's argv and environment (pure): mapping, order, version spellings, mask."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from tests.support.example_config import GENERATION, example_profile

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import ServedModel, served_model
from sie_worker.engines.sglang.release import (
    disable_cuda_graph_args,
    engine_version,
    prefill_graph_flag,
    version_key,
)
from sie_worker.settings import Settings
from sie_worker.sizing.memory_needs import EngineShare
from sie_worker.worker.launcher.plan import engine_env, env_delta, plan_launch
from sie_worker.worker.placement.claims import cpu_kv_inputs

EMBEDDING = "sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter"
CHAT = "sie_server.adapters.sglang.chat:SGLangChatAdapter"
TRANSFORMERS = "sie_server.adapters.transformers:TransformersAdapter"
EIGHT = tuple(f"cuda:{i}" for i in range(8))


def served(profile: dict[str, Any], *, profile_name: str = "default", **top: Any) -> ServedModel:
    doc = {
        "sie_id": "org/model",
        "hf_id": "org/model-weights",
        "tasks": {"generate": {"context_length": 8192, "max_output_tokens": 512}},
        "profiles": {"default": profile},
        **top,
    }
    return served_model(parse_config(doc, source="m.yaml"), profile_name)


def argv_of(
    model: ServedModel,
    settings: Settings | None = None,
    *,
    version: str | None = "0.5.23",
    devices: tuple[str, ...] | None = None,
) -> list[str]:
    settings = settings or Settings(devices=EIGHT, bundle="sglang")
    options = resolve_load_options(model, settings, env={})
    plan = plan_launch(
        model,
        options,
        devices or settings.devices[: options.width],
        port=30007,
        nccl_port=options.nccl_port or 30407,
        settings=settings,
        version=version,
    )
    return list(plan.argv)


def value_of(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_seed_example_argv_in_full() -> None:
    assert argv_of(served(example_profile())) == [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", "org/model-weights",
        "--served-model-name", "org/model",
        "--tp-size", "4",
        "--host", "127.0.0.1",
        "--port", "30007",
        "--nccl-port", "30407",
        "--enable-metrics",
        "--dtype", "bfloat16",
        "--context-length", "8192",
        "--trust-remote-code",
        "--disable-prefill-cuda-graph",
    ]  # fmt: skip


def test_sie_budgets_are_not_engine_flags() -> None:
    # max_batch_tokens and kv_budget_tokens are SIE's batching and admission budgets; SIE
    # never passes them to SGLang, whose KV pool is sized from mem_fraction_static.
    argv = argv_of(served(example_profile()))
    assert "--max-total-tokens" not in argv
    assert "--max-prefill-tokens" not in argv
    profile = {**example_profile(), "extra_launch_args": ["--max-total-tokens", "65536"]}
    assert argv_of(served(profile))[-2:] == ["--max-total-tokens", "65536"]


def test_sglang_command_prefix_replaces_python_m_sglang() -> None:
    settings = Settings(
        devices=EIGHT,
        engine_commands={
            "SIE_SGLANG_COMMAND": ("numactl", "--interleave=all", "python3", "fake.py")
        },
    )
    argv = argv_of(served(example_profile()), settings)
    assert argv[:5] == ["numactl", "--interleave=all", "python3", "fake.py", "--model-path"]


def test_revision_is_passed_with_the_hub_id() -> None:
    argv = argv_of(served(example_profile(), revision="v1.2"))
    assert value_of(argv, "--revision") == "v1.2"


def test_local_model_path_replaces_the_hub_id_and_revision(tmp_path: Path) -> None:
    argv = argv_of(served(example_profile(), model_path=str(tmp_path), revision="v1"))
    assert value_of(argv, "--model-path") == str(tmp_path)
    assert "--revision" not in argv


def test_non_default_profiles_are_served_under_their_own_name() -> None:
    model = served(example_profile(), profile_name="default")
    doc = dict(model.config.raw)
    doc["profiles"] = {**doc["profiles"], "fast": {"extends": "default"}}
    fast = served_model(parse_config(doc, source=None), "fast")
    assert value_of(argv_of(fast), "--served-model-name") == "org/model:fast"


def test_nccl_port_is_always_passed_and_declared_ports_win() -> None:
    assert value_of(argv_of(served(example_profile(nccl_port=31000))), "--nccl-port") == "31000"
    one = {"adapter_path": GENERATION}
    assert value_of(argv_of(served(one)), "--nccl-port") == "30407"


def test_optional_profile_fields_are_left_to_the_engine_when_unset() -> None:
    argv = argv_of(served({"adapter_path": GENERATION}, tasks={"generate": {}}))
    for flag in (
        "--dtype",
        "--context-length",
        "--max-total-tokens",
        "--max-prefill-tokens",
        "--watchdog-timeout",
        "--revision",
        "--is-embedding",
        "--chat-template",
    ):
        assert flag not in argv


def test_embedding_adapter_adds_is_embedding_and_its_sequence_length() -> None:
    model = served({"adapter_path": EMBEDDING}, tasks={"encode": {"max_sequence_length": 512}})
    argv = argv_of(model)
    assert "--is-embedding" in argv
    assert value_of(argv, "--context-length") == "512"


def test_chat_adapter_adds_its_template() -> None:
    model = served(
        {"adapter_path": CHAT, "adapter_options": {"loadtime": {"chat_template": "chatml"}}}
    )
    assert value_of(argv_of(model), "--chat-template") == "chatml"


@pytest.mark.parametrize(("declared", "flag"), [(600, "600"), (120.5, "120.5"), (1, "1")])
def test_watchdog_is_passed_in_seconds(declared: float, flag: str) -> None:
    argv = argv_of(served(example_profile(watchdog_timeout_s=declared)))
    assert value_of(argv, "--watchdog-timeout") == flag


def test_stream_interval_is_passed_as_sglang_s_flag() -> None:
    argv = argv_of(served(example_profile(stream_interval=4)))
    assert value_of(argv, "--stream-interval") == "4"
    assert "--stream-interval" not in argv_of(served(example_profile()))


@pytest.mark.parametrize(
    ("version", "flag"),
    [
        ("0.5.23", "--disable-prefill-cuda-graph"),
        ("0.5.20", "--disable-prefill-cuda-graph"),
        ("0.5.20.post1", "--disable-prefill-cuda-graph"),
        ("0.5.19", "--disable-piecewise-cuda-graph"),
        ("0.5.10.post1", "--disable-piecewise-cuda-graph"),
        ("0.4.10", "--disable-piecewise-cuda-graph"),
    ],
)
def test_prefill_graph_flag_is_spelled_for_the_sglang_release(version: str, flag: str) -> None:
    argv = argv_of(served(example_profile()), version=version)
    assert argv[-1] == flag
    assert prefill_graph_flag(version) == flag


def test_prefill_graph_flag_is_omitted_when_the_profile_keeps_capture_on() -> None:
    argv = argv_of(served(example_profile(disable_piecewise_cuda_graph=False)))
    assert not any("piecewise" in a or "prefill-cuda-graph" in a for a in argv)


@pytest.mark.parametrize(
    ("version", "args"),
    [
        (
            "0.5.23",
            ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"],
        ),
        (
            "0.5.19",
            ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"],
        ),
        ("0.5.18", ["--disable-cuda-graph"]),
        ("0.5.10.post1", ["--disable-cuda-graph"]),
    ],
)
def test_disable_cuda_graph_replaces_the_prefill_flag(version: str, args: list[str]) -> None:
    argv = argv_of(served(example_profile(disable_cuda_graph=True)), version=version)
    assert argv[-len(args) :] == args
    assert prefill_graph_flag(version) not in argv
    assert disable_cuda_graph_args(version) == tuple(args)


def test_disable_cuda_graph_in_extra_launch_args_drops_the_prefill_flag() -> None:
    profile = {**example_profile(), "extra_launch_args": ["--disable-cuda-graph"]}
    argv = argv_of(served(profile))
    assert argv[-1] == "--disable-cuda-graph"
    assert "--disable-prefill-cuda-graph" not in argv
    assert "--cuda-graph-backend-decode" not in argv


def test_extra_launch_args_come_last_in_order() -> None:
    args = ["--mem-fraction-static", "0.8", "--stream-interval", "4"]
    profile = {**example_profile(), "extra_launch_args": args}
    assert argv_of(served(profile))[-4:] == args


def test_transformers_adapter_runs_the_default_engine() -> None:
    model = served(
        {
            "adapter_path": TRANSFORMERS,
            "compute_precision": "float32",
            "adapter_options": {"loadtime": {"device": "cpu", "threads": 2, "max_batch_size": 8}},
        },
        tasks={"encode": {"max_sequence_length": 256}},
        revision="main",
    )
    argv = argv_of(model, Settings(devices=("cpu",)))
    assert argv == [
        sys.executable, "-m", "sie_worker.engines.transformers",
        "--model-path", "org/model-weights",
        "--host", "127.0.0.1", "--port", "30007",
        "--task", "encode", "--served-model-name", "org/model",
        "--dtype", "float32",
        "--device", "cpu", "--threads", "2", "--max-batch-size", "8",
        "--revision", "main",
        "--context-length", "256",
    ]  # fmt: skip


def test_transformers_plan_has_no_rendezvous_port() -> None:
    model = served({"adapter_path": TRANSFORMERS}, tasks={"generate": {}})
    settings = Settings(devices=("cpu",), engine_commands={"SIE_SGLANG_COMMAND": ("ignored",)})
    options = resolve_load_options(model, settings, env={})
    plan = plan_launch(model, options, ("cpu",), port=30001, nccl_port=30401, settings=settings)
    assert plan.nccl_port is None
    assert plan.argv[1:3] == ("-m", "sie_worker.engines.transformers")
    assert "--task" in plan.argv
    assert plan.argv[plan.argv.index("--task") + 1] == "generate"


# --- environment ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "mask"),
    [(("cuda:2", "cuda:3"), "2,3"), (("cuda:0",), "0"), (("cpu",), ""), (("cpu:1",), "")],
)
def test_device_mask_comes_from_the_block(devices: tuple[str, ...], mask: str) -> None:
    model = served({"extra_env": {"NCCL_DEBUG": "INFO"}})
    delta = env_delta(model, devices, "transformers")
    assert delta == {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": mask}


def test_sglang_on_cpu_devices_runs_its_cpu_engine_one_core_set_per_rank_and_no_nccl() -> None:
    model = served({"extra_env": {"SGLANG_USE_CPU_ENGINE": "0", "OMP_NUM_THREADS": "8"}})
    cores = ((0, 1), (2, 3))
    assert env_delta(model, ("cpu:0", "cpu:1"), "sglang", cores) == {
        "SGLANG_USE_CPU_ENGINE": "1",  # the binding is written after the profile's env
        "OMP_NUM_THREADS": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "SGLANG_NCCL_SO_PATH": "/nonexistent/no-nccl-on-cpu-devices",
        "SGLANG_CPU_OMP_THREADS_BIND": "0-1|2-3",
    }
    assert env_delta(model, ("cuda:0",), "sglang") == {
        "SGLANG_USE_CPU_ENGINE": "0",
        "OMP_NUM_THREADS": "8",
        "CUDA_VISIBLE_DEVICES": "0",
    }


def test_mask_is_written_after_the_profile_environment() -> None:
    model = served({"extra_env": {"A": "1", "B": "2"}})
    assert list(env_delta(model, ("cuda:1",))) == ["A", "B", "CUDA_VISIBLE_DEVICES"]


def test_engine_env_is_the_worker_env_then_the_delta() -> None:
    model = served({**example_profile(), "extra_env": {"PATH_EXTRA": "x", "SHARED": "profile"}})
    settings = Settings(devices=EIGHT)
    options = resolve_load_options(model, settings, env={})
    plan = plan_launch(model, options, EIGHT[4:], port=1, nccl_port=2, settings=settings)
    base = {"SHARED": "worker", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "HOME": "/h"}
    assert engine_env(base, plan) == {
        "SHARED": "profile",
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
        "HOME": "/h",
        "PATH_EXTRA": "x",
    }


def test_plan_summary_is_what_plan_prints() -> None:
    model = served(example_profile())
    settings = Settings(devices=EIGHT)
    options = resolve_load_options(model, settings, env={})
    plan = plan_launch(model, options, EIGHT[2:6], port=30001, nccl_port=30401, settings=settings)
    summary = plan.summary()
    assert list(summary) == ["model", "width", "devices", "argv", "env"]
    assert summary["devices"] == ["cuda:2", "cuda:3", "cuda:4", "cuda:5"]
    assert summary["env"] == {"CUDA_VISIBLE_DEVICES": "2,3,4,5"}
    assert (plan.health_path, plan.port, plan.nccl_port) == ("/health", 30001, 30401)


def test_plan_refuses_a_block_of_the_wrong_size() -> None:
    model = served(example_profile())
    settings = Settings(devices=EIGHT)
    options = resolve_load_options(model, settings, env={})
    with pytest.raises(ValueError, match="width 4 placed on 2 devices"):
        plan_launch(model, options, EIGHT[:2], port=1, nccl_port=2, settings=settings)


# --- which release ----------------------------------------------------------------------------


def test_the_bundle_release_wins_over_the_installed_one() -> None:
    try:
        installed = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        pytest.skip("sglang is not installed")
    assert engine_version("sglang", {}) == "0.5.10.post1"
    assert engine_version("default", {}) == installed
    assert engine_version("sglang", {"SIE_SGLANG_VERSION": "9.9.9"}) == "9.9.9"


def test_release_is_the_environment_then_the_bundle_then_the_installed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sie_worker.engines.sglang import release as sglang_version

    monkeypatch.setattr(sglang_version, "installed_version", lambda: None)
    assert engine_version("sglang", {"SIE_SGLANG_VERSION": "0.5.21"}) == "0.5.21"
    assert engine_version("sglang", {}) == "0.5.10.post1"
    assert engine_version("sglang-cu130", {}) == "0.5.23"
    assert engine_version("default", {}) == "0.5.23"
    monkeypatch.setattr(sglang_version, "installed_version", lambda: "0.5.21")
    assert engine_version("default", {}) == "0.5.21"


def test_a_mismatched_installed_release_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from sie_worker.engines.sglang import release as sglang_version

    monkeypatch.setattr(sglang_version, "installed_version", lambda: "0.5.23")
    assert sglang_version.release_mismatch("sglang-cu130", {}) is None
    message = sglang_version.release_mismatch("sglang", {})
    assert message is not None
    assert "SGLang 0.5.23 is installed" in message
    assert "0.5.10.post1 (SIE_BUNDLE=sglang)" in message
    assert sglang_version.release_mismatch("sglang", {"SIE_SGLANG_VERSION": "0.5.23"}) is None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("0.5.23", (0, 5, 23)),
        ("0.5.20.post1", (0, 5, 20)),
        ("0.5", (0, 5, 0)),
        ("0.6.0rc1", (0, 6, 0)),
        ("1.0.0+cu130", (1, 0, 0)),
    ],
)
def test_version_key(text: str, key: tuple[int, int, int]) -> None:
    assert version_key(text) == key


def test_the_context_length_follows_sie_s_order() -> None:
    tasks = {"generate": {"context_length": 8192}}
    assert value_of(argv_of(served(example_profile(), tasks=tasks)), "--context-length") == "8192"
    top = served(example_profile(), tasks=tasks, max_sequence_length=4096)
    assert value_of(argv_of(top), "--context-length") == "4096"
    own = served(example_profile(max_seq_length=16384), tasks=tasks, max_sequence_length=4096)
    assert value_of(argv_of(own), "--context-length") == "16384"
    # The earlier spelling bounded embeddings only: a generation engine keeps its context.
    both = {"generate": {"context_length": 8192}, "encode": {"max_sequence_length": 512}}
    assert value_of(argv_of(served(example_profile(), tasks=both)), "--context-length") == "8192"


def test_sie_s_cu130_adapters_turn_prefill_graphs_off_at_every_width_on_any_bundle() -> None:
    gemma = {"adapter_path": "sie_server.adapters.sglang.gemma:SGLangGemmaAdapter"}
    argv = argv_of(served(gemma), Settings(devices=EIGHT, bundle="default"))
    assert argv[-1] == "--disable-prefill-cuda-graph"
    plain = argv_of(served({"adapter_path": GENERATION}), Settings(devices=EIGHT, bundle="default"))
    assert "--disable-prefill-cuda-graph" not in plain


def _planned(model: ServedModel, share: float | None, settings: Settings) -> list[str]:
    options = resolve_load_options(model, settings, env={})
    plan = plan_launch(
        model,
        options,
        settings.devices[:1],
        port=30007,
        nccl_port=30407,
        settings=settings,
        version="0.5.23",
        share=EngineShare(share) if share is not None else None,
    )
    return list(plan.argv)


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_the_engines_share_replaces_the_declared_mem_fraction_static() -> None:
    settings = Settings(devices=EIGHT, bundle="sglang")
    model = served(example_profile(tensor_parallel_size=1, mem_fraction_static=0.4))
    assert _flag(_planned(model, None, settings), "--mem-fraction-static") == "0.4"
    argv = _planned(model, 0.68, settings)
    assert _flag(argv, "--mem-fraction-static") == "0.68"
    assert argv.count("--mem-fraction-static") == 1
    undeclared = served(example_profile(tensor_parallel_size=1))
    assert _flag(_planned(undeclared, None, settings), "--mem-fraction-static") is None
    assert _flag(_planned(undeclared, 0.85, settings), "--mem-fraction-static") == "0.85"


def test_the_default_engine_gets_its_share_as_its_cuda_memory_cap() -> None:
    settings = Settings(devices=("cuda:0",), bundle="default")
    model = served({"adapter_path": TRANSFORMERS}, tasks={"encode": {}})
    assert "--cuda-memory-fraction" not in _planned(model, None, settings)
    assert _flag(_planned(model, 0.162, settings), "--cuda-memory-fraction") == "0.162"


def test_sglang_on_cpu_devices_runs_its_cpu_engine_with_its_kv_cache_in_tokens(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    shape = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 128,
    }
    (folder / "config.json").write_text(json.dumps(shape))
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    loadtime = {
        "tensor_parallel_size": 2,
        "mem_fraction_static": 0.5,
        "startup_timeout_s": 300,
        "request_read_timeout_s": 60,
    }
    model = served(
        {"compute_precision": "float32", "adapter_options": {"loadtime": loadtime}},
        model_path=str(folder),
    )
    settings = Settings(devices=("cpu:0", "cpu:1"), device_cores=((0,), (1,)), bundle="sglang")
    options = resolve_load_options(model, settings, env={})
    weights, token_bytes = cpu_kv_inputs(model, options, on_cuda=False)
    # 2 (K, V) x 2 layers x 1 KV head of each rank's 2 x 32 wide x 4 bytes (float32).
    assert token_bytes == 2 * 2 * 1 * 32 * 4
    assert weights is not None
    assert weights >= 4096
    assert cpu_kv_inputs(model, options, on_cuda=True) == (None, None)
    plan = plan_launch(
        model,
        options,
        ("cpu:0", "cpu:1"),
        port=30007,
        nccl_port=30407,
        settings=settings,
        share=EngineShare(None, kv_tokens=123456),
    )
    argv = list(plan.argv)
    assert argv[argv.index("--device") + 1] == "cpu"
    assert "--disable-overlap-schedule" in argv
    assert "--sleep-on-idle" in argv  # an idle scheduler would spin on the worker's cores
    assert argv[argv.index("--max-total-tokens") + 1] == "123456"
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert plan.cores == (0, 1)  # the engine's affinity: the block's cores
    assert plan.env["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"
    # On GPUs the command line is as before.
    on_gpu = argv_of(model, Settings(devices=EIGHT, bundle="sglang"))
    cpu_only = {"--device", "--disable-overlap-schedule", "--sleep-on-idle", "--max-total-tokens"}
    assert not cpu_only & set(on_gpu)
