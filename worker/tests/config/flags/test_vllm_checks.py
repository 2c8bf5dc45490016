"""Load-time checks of vLLM profiles against the bundle's vLLM release: each option's rule,
extra_launch_args read as vLLM's own parser reads them (reserved, owned by the worker,
unknown), SGLang-only options refused, and the read-time refusals of vLLM's reserved flags."""

from __future__ import annotations

from typing import Any

import pytest

from sie_worker.config.files.reader import parse_config
from sie_worker.config.flags.option_rules import Release
from sie_worker.config.flags.option_tables import table_for
from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import served_model
from sie_worker.config.rules import rule_problems
from sie_worker.engines.vllm.flags import FAMILIES, VLLM_OPTIONS, option_problem, options_for
from sie_worker.errors import InvalidConfig
from sie_worker.settings import Settings

GENERATION = "sie_server.adapters.vllm.generation:VLLMGenerationAdapter"
EMBEDDING = "sie_server.adapters.vllm.embedding:VLLMEmbeddingAdapter"
LT = "$.profiles.default.adapter_options.loadtime"
ARGS = "$.profiles.default.extra_launch_args"
TABLE = table_for("0.32.0", "vllm")
RELEASE = Release("0.32.0", "vllm", TABLE, "vLLM")


def _doc(
    loadtime: dict[str, Any], *, adapter: str | None = GENERATION, args: list[str] | None = None
) -> dict[str, Any]:
    profile: dict[str, Any] = {"adapter_options": {"loadtime": loadtime}}
    if adapter is not None:
        profile["adapter_path"] = adapter
    if args is not None:
        profile["extra_launch_args"] = args
    encode = adapter == EMBEDDING
    return {
        "sie_id": "org/model",
        "hf_id": "org/model",
        "tasks": {"encode": {"dense": {"dim": 8}}} if encode else {"generate": {}},
        "profiles": {"default": profile},
    }


def _load(
    loadtime: dict[str, Any],
    *,
    bundle: str = "vllm",
    devices: tuple[str, ...] = ("cuda:0", "cuda:1"),
    **kwargs: Any,
) -> LoadOptions:
    served = served_model(parse_config(_doc(loadtime, **kwargs), source="m.yaml"), "default")
    settings = Settings(devices=devices, bundle=bundle)
    return resolve_load_options(served, settings, env={})


def _refusal(loadtime: dict[str, Any], **kwargs: Any) -> dict[str, str]:
    with pytest.raises(InvalidConfig) as refused:
        _load(loadtime, **kwargs)
    return {p.path: p.message for p in refused.value.problems}


def test_the_vllm_bundle_ships_the_option_table_of_the_release_it_runs() -> None:
    assert TABLE is not None
    assert TABLE.flexible
    assert TABLE.has("--tensor-parallel-size")
    assert TABLE.has("--gpu-memory-utilization")
    assert _load({}).engine_version == "0.32.0"


def test_a_profile_without_adapter_path_runs_vllm_on_the_vllm_bundle() -> None:
    assert _load({}, adapter=None).adapter == GENERATION
    assert _load({}, adapter=EMBEDDING).task == "encode"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("gpu_memory_utilization", 0.5),
        ("max_seq_length", 4096),
        ("trust_remote_code", False),
        ("enforce_eager", True),
        ("quantization", "fp8"),
        ("kv_cache_dtype", "fp8"),
        ("enable_prefix_caching", False),
        ("max_lora_rank", 64),
        ("compute_precision", "bfloat16"),
        ("revision", "v1.0"),
    ],
)
def test_each_vllm_option_takes_its_value(option: str, value: object) -> None:
    assert _load({option: value}).declared[option] == value


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("gpu_memory_utilization", 1.5, "above 0 and below 1"),
        ("gpu_memory_utilization", True, "above 0 and below 1"),
        ("max_seq_length", 0, "integer from 1"),
        ("enforce_eager", "yes", "true or false"),
        ("kv_cache_dtype", "fp9", "is not a --kv-cache-dtype choice of vLLM 0.32.0 (bundle vllm)"),
        ("max_lora_rank", 12, "is not a --max-lora-rank choice"),
        ("max_lora_rank", "16", "must be an integer"),
        ("quantization", "", "nonempty string"),
    ],
)
def test_a_bad_value_is_refused_naming_the_option(option: str, value: object, says: str) -> None:
    assert says in _refusal({option: value})[f"{LT}.{option}"]


@pytest.mark.parametrize(
    ("option", "hint"),
    [
        ("mem_fraction_static", "accepted:"),
        ("watchdog_timeout_s", "did you mean startup_timeout_s?"),
        ("disable_piecewise_cuda_graph", "accepted:"),
        ("gpu_memory_utilisation", "did you mean gpu_memory_utilization?"),
        ("tensor_parallel", "did you mean tensor_parallel_size?"),
    ],
)
def test_options_vllm_has_no_flag_for_are_refused_with_the_closest_spelling(
    option: str, hint: str
) -> None:
    message = _refusal({option: 1})[f"{LT}.{option}"]
    assert message.startswith("is not a load-time option of VLLMGenerationAdapter")
    assert hint in message


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("-tp=2", "sets the reserved flag --tensor-parallel-size/-tp"),
        ("--tensor_parallel_size=2", "sets the reserved flag --tensor-parallel-size/-tp"),
        ("--tensor-parallel", "abbreviates the reserved flag --tensor-parallel-size/-tp"),
        ("-t", "abbreviates the reserved flag --tensor-parallel-size/-tp"),
        ("--uds", "SIE owns the engine's HTTP host and port"),
        ("--headless", "sets the reserved flag --headless"),
        ("-dpl", "sets the reserved flag --data-parallel-size-local/-dpl"),
        ("--config", "a config file may set the placement and listener flags"),
        ("--distributed-executor-backend=ray", "ranks as its own process group"),
    ],
)
def test_reserved_vllm_flags_are_refused_when_the_config_is_read(token: str, says: str) -> None:
    problems = {p.path: p.message for p in rule_problems(_doc({}, args=[token, "2"]))}
    assert says in problems[f"{ARGS}[0]"]


def test_vllm_flags_are_read_with_vllms_parser_only_for_vllm_adapters() -> None:
    # `-tp` is nothing to SGLang; `--tp-size` nothing to vLLM: each engine's own reading.
    sglang = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
    assert rule_problems(_doc({}, adapter=sglang, args=["-tp", "2"])) == []
    assert rule_problems(_doc({}, args=["--tp-size", "2"])) == []
    assert rule_problems(_doc({}, adapter=sglang, args=["--tp-size", "2"])) != []


def test_a_profile_extending_a_vllm_profile_is_read_with_vllms_parser() -> None:
    doc = _doc({}, args=[])
    doc["profiles"]["child"] = {"extends": "default", "extra_launch_args": ["-tp", "2"]}
    paths = [p.path for p in rule_problems(doc)]
    assert paths == ["$.profiles.child.extra_launch_args[0]"]


def test_on_the_vllm_bundle_a_profile_without_adapter_is_refused_vllms_reserved_flags() -> None:
    # Read time cannot know the bundle; the load checks against the engine it runs.
    found = _refusal({}, adapter=None, args=["-tp", "2"])
    assert "sets the reserved flag --tensor-parallel-size/-tp" in found[f"{ARGS}[0]"]


@pytest.mark.parametrize(
    ("token", "setting"),
    [
        ("--enable-lora", "lora_paths"),
        ("--lora-modules", "lora_paths"),
        ("--max-loras=2", "max_loras_per_batch"),
        ("--gpu_memory_utilization=0.5", "gpu_memory_utilization"),
    ],
)
def test_flags_the_worker_sets_from_load_time_options_are_refused_in_extra_args(
    token: str, setting: str
) -> None:
    message = _refusal({}, args=[token])[f"{ARGS}[0]"]
    assert f"is set by the worker from loadtime.{setting}" in message


def test_an_unknown_flag_is_refused_with_vllms_closest_spelling() -> None:
    found = _refusal({}, args=["--max-num-seq", "4", "--max-num-sequences", "4", "--no-such-flag"])
    assert f"{ARGS}[0]" not in found  # a unique prefix of --max-num-seqs, as vLLM reads it
    assert (
        "--max-num-sequences is not an option of vLLM 0.32.0 (bundle vllm)" in found[f"{ARGS}[2]"]
    )
    assert "did you mean" in found[f"{ARGS}[2]"]
    assert found[f"{ARGS}[4]"].startswith("--no-such-flag is not an option of vLLM 0.32.0")


def test_valid_extra_args_and_values_pass_for_vllm_to_judge() -> None:
    # vLLM refuses a bad value itself when it starts (the load then fails with its message).
    assert _load({}, args=["--max-num-seqs", "many", "--compilation-config.mode", "0", "-O3"])


def test_every_vllm_option_is_accepted_by_the_families_that_list_it() -> None:
    assert set(options_for("generation")) | set(options_for("embedding")) == set(VLLM_OPTIONS)
    for family in FAMILIES:
        assert "tensor_parallel_size" in options_for(family)
    assert "lora_paths" not in options_for("embedding")


@pytest.mark.parametrize("name", sorted(VLLM_OPTIONS))
def test_every_flag_an_option_means_exists_in_the_release(name: str) -> None:
    option = VLLM_OPTIONS[name]
    assert TABLE is not None
    if option.flag is not None:
        assert TABLE.has(option.flag), option.flag
    assert option.meaning
    assert option.default


def test_a_flag_missing_from_a_release_is_refused_naming_it() -> None:
    assert TABLE is not None
    trimmed = type(TABLE)(
        "9.9.9",
        {k: v for k, v in TABLE.options.items() if v != "kv_cache_dtype"},
        engine="vllm",
        flexible=True,
    )
    message = option_problem("kv_cache_dtype", "fp8", Release("9.9.9", "vllm", trimmed, "vLLM"))
    assert message == (
        "needs --kv-cache-dtype, which vLLM 9.9.9 (bundle vllm) lacks: remove it, or serve the "
        "model from a bundle whose vLLM has it"
    )
    assert option_problem("kv_cache_dtype", "fp8", RELEASE) is None


CPUS = ("cpu:0", "cpu:1")
STAGES = {
    "pipeline_parallel_size": 2,
    "tensor_parallel_size": 1,
    "startup_timeout_s": 300,
    "request_read_timeout_s": 120,
}


@pytest.mark.parametrize(
    ("loadtime", "args", "where", "says"),
    [
        ({"enforce_eager": True}, None, f"{LT}.enforce_eager", "drop it"),
        ({"lora_paths": {"sql": "org/sql-lora"}}, None, f"{LT}.lora_paths", "LoRA forces"),
        ({}, ["--enforce-eager"], f"{ARGS}[0]", "'--enforce-eager' is refused"),
        ({}, ["--enforce_eager"], f"{ARGS}[0]", "'--enforce_eager' is refused"),
        ({}, ["-cc", '{"mode": 0}'], f"{ARGS}[0]", "the worker sets the compilation mode"),
        ({}, ["--compilation-config.mode=0"], f"{ARGS}[0]", "remove it"),
        ({}, ["-O0"], f"{ARGS}[0]", "'-O0' is refused"),
    ],
)
def test_what_forces_compilation_mode_none_is_refused_for_stages_on_cpu_devices(
    loadtime: dict[str, Any], args: list[str] | None, where: str, says: str
) -> None:
    refused = _refusal({**STAGES, **loadtime}, devices=CPUS, args=args)
    assert says in refused[where]
    assert "with pipeline_parallel_size 2 on cpu devices" in refused[where]
    assert "skips its warm-up in compilation mode NONE" in refused[where]
    # On GPUs, and with one stage on cpu devices, the same options are the config's to set.
    assert _load({**STAGES, **loadtime}, args=args).stages == 2
    one_stage = {**STAGES, "pipeline_parallel_size": 1, "tensor_parallel_size": 2, **loadtime}
    assert _load(one_stage, devices=CPUS, args=args).width == 2


def test_stages_on_cpu_devices_without_eager_options_load() -> None:
    options = _load({**STAGES, "enforce_eager": False}, devices=CPUS, args=["--max-num-seqs", "4"])
    assert (options.width, options.stages) == (2, 2)
