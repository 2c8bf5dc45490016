"""Load-time options: accepted sets, defaults, and every load-time refusal."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.load_options import LoadOptions, declared_width
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import ServedModel, served_model
from sie_worker.errors import InvalidConfig
from sie_worker.settings import Settings

GENERATION = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
EMBEDDING = "sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter"
CHAT = "sie_server.adapters.sglang.chat:SGLangChatAdapter"
TRANSFORMERS = "sie_server.adapters.transformers:TransformersAdapter"
LOADTIME = "$.profiles.default.adapter_options.loadtime"
FOUR = Settings(devices=("cuda:0", "cuda:1", "cuda:2", "cuda:3"), bundle="sglang")


def served(
    loadtime: dict[str, Any] | None = None,
    *,
    adapter: str | None = GENERATION,
    tasks: dict[str, Any] | None = None,
    profiles: dict[str, Any] | None = None,
    **top: Any,
) -> ServedModel:
    profile: dict[str, Any] = {"adapter_options": {"loadtime": loadtime or {}}}
    if adapter is not None:
        profile["adapter_path"] = adapter
    doc = {
        "sie_id": "org/model",
        "hf_id": "org/model",
        "tasks": tasks or {"generate": {"context_length": 4096}},
        "profiles": {"default": profile, **(profiles or {})},
        **top,
    }
    return served_model(parse_config(doc, source="m.yaml"), "default")


def resolve(model: ServedModel, settings: Settings = FOUR) -> LoadOptions:
    return resolve_load_options(model, settings, env={})


def refusals(model: ServedModel, settings: Settings = FOUR) -> dict[str, str]:
    with pytest.raises(InvalidConfig) as caught:
        resolve(model, settings)
    assert all(p.file == "m.yaml" for p in caught.value.problems)
    found: dict[str, str] = {}
    for problem in caught.value.problems:  # one path may carry several problems
        found[problem.path] = " | ".join(filter(None, [found.get(problem.path), problem.message]))
    return found


WIDE_GENERATION = {
    "tensor_parallel_size": 2,
    "startup_timeout_s": 600,
    "request_read_timeout_s": 60,
}


# --- defaults (the seed's table) ------------------------------------------------------------


def test_generation_defaults_at_width_1() -> None:
    options = resolve(served())
    assert options.width == 1
    assert options.request_read_timeout_s is None
    assert options.startup_timeout_s == 900
    assert options.watchdog_timeout_s is None
    assert options.disable_piecewise_cuda_graph is False
    assert options.nccl_port is None
    assert options.disable_cuda_graph is False
    assert options.task == "generate"
    assert options.adapter == GENERATION


def test_generation_read_cap_defaults_to_the_environment() -> None:
    options = resolve(served(), Settings(devices=FOUR.devices, generate_read_timeout_s=120))
    assert options.request_read_timeout_s == 120


def test_embedding_read_cap_defaults_to_60_seconds() -> None:
    model = served(adapter=EMBEDDING, tasks={"encode": {}})
    assert (
        resolve(
            model, Settings(devices=FOUR.devices, generate_read_timeout_s=5)
        ).request_read_timeout_s
        == 60
    )


def test_startup_timeout_defaults_to_the_environment_budget_then_900() -> None:
    assert (
        resolve(
            served(), Settings(devices=FOUR.devices, model_ready_timeout_s=300)
        ).startup_timeout_s
        == 300
    )
    assert resolve(served()).startup_timeout_s == 900


@pytest.mark.parametrize(
    ("width", "bundle", "declared", "expected"),
    [
        (1, "sglang", None, False),
        (2, "sglang", None, True),
        (8, "sglang", None, True),
        (1, "sglang-cu130", None, True),
        (4, "sglang-cu130", None, True),
        (1, "default", None, False),
        (2, "sglang", False, False),
        (1, "sglang", True, True),
        (1, "sglang-cu130", False, False),
    ],
)
def test_prefill_graph_default_follows_width_and_bundle(
    width: int, bundle: str, declared: bool | None, expected: bool
) -> None:
    loadtime: dict[str, Any] = {**WIDE_GENERATION, "tensor_parallel_size": width}
    if declared is not None:
        loadtime["disable_piecewise_cuda_graph"] = declared
    settings = Settings(devices=tuple(f"cuda:{i}" for i in range(8)), bundle=bundle)
    assert resolve(served(loadtime), settings).disable_piecewise_cuda_graph is expected


def test_declared_values_are_used() -> None:
    options = resolve(
        served(
            {
                **WIDE_GENERATION,
                "watchdog_timeout_s": 120.5,
                "nccl_port": 31000,
                "disable_cuda_graph": True,
            }
        )
    )
    assert (options.width, options.request_read_timeout_s, options.startup_timeout_s) == (
        2,
        60,
        600,
    )
    assert options.watchdog_timeout_s == 120.5
    assert options.nccl_port == 31000
    assert options.disable_cuda_graph is True


def test_disable_cuda_graph_in_extra_launch_args_counts_as_the_option() -> None:
    model = served(
        profiles={"g": {"extends": "default", "extra_launch_args": ["--disable-cuda-graph"]}}
    )
    options = resolve(served_model(model.config, "g"))
    assert options.disable_cuda_graph is True


# --- unknown options ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "tasks", "option", "closest"),
    [
        (GENERATION, None, "tensor_paralel_size", "tensor_parallel_size"),
        (EMBEDDING, {"encode": {}}, "startup_timeout", "startup_timeout_s"),
        (CHAT, None, "chat_templat", "chat_template"),
        (TRANSFORMERS, {"encode": {}}, "max_batchsize", "max_batch_size"),
        (TRANSFORMERS, {"encode": {}}, "request_read_timeout", "request_read_timeout_s"),
    ],
)
def test_unknown_options_name_the_closest_accepted_spelling(
    adapter: str, tasks: dict[str, Any] | None, option: str, closest: str
) -> None:
    found = refusals(served({option: 1}, adapter=adapter, tasks=tasks))
    assert f"did you mean {closest}?" in found[f"{LOADTIME}.{option}"]


def test_unknown_option_without_a_close_spelling_lists_the_accepted_ones() -> None:
    found = refusals(served({"zzz": 1}))
    assert "accepted: tensor_parallel_size, request_read_timeout_s" in found[f"{LOADTIME}.zzz"]


def test_a_refused_option_is_reported_once_whatever_its_value() -> None:
    model = served(
        {"nccl_port": 80, "watchdog_timeout_s": -1}, adapter=TRANSFORMERS, tasks={"encode": {}}
    )
    found = refusals(model)
    assert found == {
        f"{LOADTIME}.nccl_port": "is not a load-time option of TransformersAdapter; accepted: "
        "request_read_timeout_s, startup_timeout_s, device, threads, max_batch_size, memory_gib, "
        "lora_paths, max_loras_per_batch",
        f"{LOADTIME}.watchdog_timeout_s": "is not a load-time option of TransformersAdapter; "
        "did you mean startup_timeout_s?",
    }


def test_chat_template_is_not_an_option_of_the_generation_adapter() -> None:
    assert f"{LOADTIME}.chat_template" in refusals(served({"chat_template": "chatml"}))


def test_transformers_adapter_refuses_tensor_parallel_size() -> None:
    found = refusals(
        served({"tensor_parallel_size": 1}, adapter=TRANSFORMERS, tasks={"encode": {}})
    )
    assert found[f"{LOADTIME}.tensor_parallel_size"].startswith(
        "TransformersAdapter runs on one device; only the SGLang and vLLM adapters accept "
        "tensor_parallel_size"
    )


def test_default_adapter_on_the_default_bundle_is_transformers() -> None:
    model = served({"tensor_parallel_size": 2}, adapter=None, tasks={"encode": {}})
    found = refusals(model, Settings(devices=FOUR.devices, bundle="default"))
    assert "TransformersAdapter runs on one device" in found[f"{LOADTIME}.tensor_parallel_size"]


@pytest.mark.parametrize(
    ("tasks", "adapter"),
    [
        ({"encode": {}}, EMBEDDING),
        ({"generate": {}}, GENERATION),
        ({"generate": {}, "encode": {}}, GENERATION),
    ],
)
def test_default_adapter_on_sglang_bundles_follows_the_tasks(
    tasks: dict[str, Any], adapter: str
) -> None:
    assert resolve(served(adapter=None, tasks=tasks)).adapter == adapter


def test_adapter_and_tasks_must_agree() -> None:
    found = refusals(served(adapter=EMBEDDING))
    assert "SGLangEmbeddingAdapter serves encode" in found["$.tasks"]
    found = refusals(served(adapter=TRANSFORMERS, tasks={"generate": {}, "encode": {}}))
    assert "serves one task" in found["$.tasks"]


# --- width ----------------------------------------------------------------------------------


def test_width_above_the_device_count_is_refused_naming_both_numbers() -> None:
    two = Settings(devices=("cuda:0", "cuda:1"))
    found = refusals(served({**WIDE_GENERATION, "tensor_parallel_size": 4}), two)
    assert found[f"{LOADTIME}.tensor_parallel_size"].startswith(
        "4 needs 4 GPUs but this worker has 2 device(s) (cuda:0,cuda:1, from SIE_DEVICES)"
    )


def test_without_sie_devices_any_width_above_1_is_refused() -> None:
    found = refusals(served(WIDE_GENERATION), Settings())
    assert "this worker has 1 device(s)" in found[f"{LOADTIME}.tensor_parallel_size"]


def test_width_equal_to_the_device_count_is_accepted() -> None:
    assert resolve(served({**WIDE_GENERATION, "tensor_parallel_size": 4})).width == 4


def test_declared_width_reads_the_profile_alone() -> None:
    assert declared_width(served({"tensor_parallel_size": 4}, adapter=TRANSFORMERS)) == 4
    assert declared_width(served()) == 1


# --- numbers ----------------------------------------------------------------------------------

BAD_SECONDS = [0, -1, math.inf, -math.inf, math.nan, True, "600", None, 10**400, [1]]


@pytest.mark.parametrize(
    "key", ["request_read_timeout_s", "startup_timeout_s", "watchdog_timeout_s"]
)
@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
def test_timeouts_must_be_finite_numbers_above_zero(key: str, value: object) -> None:
    found = refusals(served({key: value}))
    assert found[f"{LOADTIME}.{key}"].startswith("must be a finite number of seconds above zero")


@pytest.mark.parametrize(
    "key", ["request_read_timeout_s", "startup_timeout_s", "watchdog_timeout_s"]
)
@pytest.mark.parametrize("value", [0.5, 1, 600, 86400.0])
def test_positive_timeouts_are_accepted(key: str, value: float) -> None:
    options = resolve(served({key: value}))
    assert getattr(options, key) == value


@pytest.mark.parametrize("value", [1023, 65536, 0, True, 2.0, "30001", None])
def test_nccl_port_must_be_an_integer_from_1024_to_65535(value: object) -> None:
    found = refusals(served({**WIDE_GENERATION, "nccl_port": value}))
    assert found[f"{LOADTIME}.nccl_port"].startswith("must be an integer from 1024 to 65535")


@pytest.mark.parametrize("value", [1024, 31000, 65535])
def test_nccl_port_in_range_is_accepted_above_width_1(value: int) -> None:
    assert resolve(served({**WIDE_GENERATION, "nccl_port": value})).nccl_port == value


def test_nccl_port_is_refused_at_width_1() -> None:
    found = refusals(served({"nccl_port": 31000}))
    assert found[f"{LOADTIME}.nccl_port"].startswith("is only allowed above width 1")


@pytest.mark.parametrize("key", ["disable_piecewise_cuda_graph", "disable_cuda_graph"])
@pytest.mark.parametrize("value", [1, "true", None])
def test_graph_switches_must_be_booleans(key: str, value: object) -> None:
    assert refusals(served({key: value}))[f"{LOADTIME}.{key}"].startswith("must be true or false")


@pytest.mark.parametrize(
    ("adapter", "option", "value", "says"),
    [
        (CHAT, "chat_template", "", "built-in template name"),
        (CHAT, "chat_template", 3, "built-in template name"),
        (TRANSFORMERS, "device", "gpu", "must be one of auto, cpu, cuda"),
        (TRANSFORMERS, "threads", 0, "at least 1"),
        (TRANSFORMERS, "threads", 2.0, "at least 1"),
        (TRANSFORMERS, "max_batch_size", True, "at least 1"),
    ],
)
def test_adapter_specific_options_are_checked(
    adapter: str, option: str, value: object, says: str
) -> None:
    tasks = {"encode": {}} if adapter == TRANSFORMERS else None
    found = refusals(served({option: value}, adapter=adapter, tasks=tasks))
    assert says in found[f"{LOADTIME}.{option}"]


def test_adapter_specific_options_are_carried_as_extras() -> None:
    chat = resolve(served({"chat_template": "chatml"}, adapter=CHAT))
    assert dict(chat.extras) == {"chat_template": "chatml"}
    model = served(
        {"device": "cpu", "threads": 2, "max_batch_size": 16},
        adapter=TRANSFORMERS,
        tasks={"encode": {}},
    )
    assert dict(resolve(model).extras) == {"device": "cpu", "threads": 2, "max_batch_size": 16}


# --- generation above width 1 ----------------------------------------------------------------


def test_generation_above_width_1_must_declare_startup_timeout_even_with_a_budget() -> None:
    settings = Settings(devices=FOUR.devices, model_ready_timeout_s=600)
    found = refusals(served({"tensor_parallel_size": 2, "request_read_timeout_s": 60}), settings)
    assert found[f"{LOADTIME}.startup_timeout_s"].startswith(
        "is required for generation above width 1 (tensor_parallel_size 2), even when "
        "SIE_MODEL_READY_TIMEOUT_S is set"
    )


def test_generation_above_width_1_needs_a_read_cap() -> None:
    found = refusals(served({"tensor_parallel_size": 2, "startup_timeout_s": 600}))
    assert (
        "SIE_SGLANG_GENERATE_READ_TIMEOUT_S is unset" in found[f"{LOADTIME}.request_read_timeout_s"]
    )


def test_a_pipelined_width_is_named_by_both_factors_in_the_wide_generation_refusals() -> None:
    found = refusals(served({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}))
    spans = "(width 4: tensor_parallel_size 2 x pipeline_parallel_size 2)"
    assert spans in found[f"{LOADTIME}.startup_timeout_s"]
    assert spans in found[f"{LOADTIME}.request_read_timeout_s"]


def test_the_environment_read_cap_satisfies_generation_above_width_1() -> None:
    settings = Settings(devices=FOUR.devices, generate_read_timeout_s=300)
    options = resolve(served({"tensor_parallel_size": 2, "startup_timeout_s": 600}), settings)
    assert options.request_read_timeout_s == 300


def test_chat_adapter_is_generation_too() -> None:
    found = refusals(served({"tensor_parallel_size": 2}, adapter=CHAT))
    assert {f"{LOADTIME}.startup_timeout_s", f"{LOADTIME}.request_read_timeout_s"} <= set(found)


def test_embedding_above_width_1_needs_neither() -> None:
    options = resolve(served({"tensor_parallel_size": 2}, adapter=EMBEDDING, tasks={"encode": {}}))
    assert (options.startup_timeout_s, options.request_read_timeout_s) == (900, 60)


# --- liveness budget ----------------------------------------------------------------------------


def test_declared_startup_timeout_at_the_liveness_budget_is_refused() -> None:
    settings = Settings(devices=FOUR.devices, liveness_budget_s=600)
    found = refusals(served({"startup_timeout_s": 600}), settings)
    assert found[f"{LOADTIME}.startup_timeout_s"].startswith(
        "600 is at or above the worker's liveness budget of 600 s (SIE_WORKER_LIVENESS_BUDGET_S)"
    )


def test_default_startup_timeout_from_the_environment_is_checked_too() -> None:
    settings = Settings(devices=FOUR.devices, liveness_budget_s=600, model_ready_timeout_s=1200)
    message = refusals(served(), settings)[f"{LOADTIME}.startup_timeout_s"]
    assert "SIE_MODEL_READY_TIMEOUT_S=1200" in message
    assert (
        "set SIE_MODEL_READY_TIMEOUT_S (workers.common.modelReadyTimeoutSec) below 600" in message
    )


def test_built_in_default_startup_timeout_is_checked_too() -> None:
    settings = Settings(devices=FOUR.devices, liveness_budget_s=600)
    message = refusals(served(), settings)[f"{LOADTIME}.startup_timeout_s"]
    assert "the built-in 900 s (SIE_MODEL_READY_TIMEOUT_S is unset)" in message


def test_startup_timeout_below_the_liveness_budget_is_accepted() -> None:
    settings = Settings(devices=FOUR.devices, liveness_budget_s=600, model_ready_timeout_s=300)
    assert resolve(served({"startup_timeout_s": 599}), settings).startup_timeout_s == 599
    assert resolve(served(), settings).startup_timeout_s == 300


# --- model shape ----------------------------------------------------------------------------------


def _model_dir(tmp_path: Path, config: dict[str, Any]) -> str:
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize(
    ("heads", "kv", "width", "refused_because"),
    [
        (32, 8, 2, None),
        (32, 8, 8, None),
        (40, 8, 4, None),
        (28, 4, 8, "does not divide num_attention_heads 28"),
        (32, 6, 4, "neither a multiple nor a divisor of num_key_value_heads 6"),
        (14, 2, 4, "does not divide num_attention_heads 14"),
        (32, 2, 4, None),  # more ranks than KV heads: the engine replicates them
        (12, 12, 8, "does not divide num_attention_heads 12"),
    ],
)
def test_width_must_fit_the_heads(
    tmp_path: Path, heads: int, kv: int, width: int, refused_because: str | None
) -> None:
    path = _model_dir(tmp_path, {"num_attention_heads": heads, "num_key_value_heads": kv})
    model = served({**WIDE_GENERATION, "tensor_parallel_size": width}, model_path=path)
    settings = Settings(devices=tuple(f"cuda:{i}" for i in range(8)))
    if refused_because is None:
        assert resolve(model, settings).width == width
        return
    message = refusals(model, settings)[f"{LOADTIME}.tensor_parallel_size"]
    assert refused_because in message
    assert "widths that fit this model:" in message


def test_multimodal_models_use_text_config(tmp_path: Path) -> None:
    path = _model_dir(
        tmp_path,
        {
            "num_attention_heads": 16,
            "text_config": {"num_attention_heads": 28, "num_key_value_heads": 4},
        },
    )
    model = served({**WIDE_GENERATION, "tensor_parallel_size": 8}, model_path=path)
    settings = Settings(devices=tuple(f"cuda:{i}" for i in range(8)))
    assert "num_attention_heads 28" in refusals(model, settings)[f"{LOADTIME}.tensor_parallel_size"]


def test_head_check_is_skipped_when_config_json_is_nowhere(tmp_path: Path) -> None:
    folder = tmp_path / "weights"
    folder.mkdir()
    model = served({**WIDE_GENERATION, "tensor_parallel_size": 4}, model_path=str(folder))
    assert resolve(model).model_path == str(folder)


def test_model_path_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    found = refusals(served(model_path=str(tmp_path / "missing")))
    assert "is not a directory" in found["$.model_path"]


# --- paths and completeness ----------------------------------------------------------------------


def test_problems_of_an_inherited_loadtime_point_at_the_profile_that_declares_it() -> None:
    model = served({"tensor_paralel_size": 2}, profiles={"fast": {"extends": "default"}})
    found = refusals(served_model(model.config, "fast"))
    assert f"{LOADTIME}.tensor_paralel_size" in found


def test_every_load_time_problem_is_reported_at_once() -> None:
    settings = Settings(devices=("cuda:0", "cuda:1"), liveness_budget_s=100)
    found = refusals(
        served({"tensor_parallel_size": 4, "watchdog_timeout_s": 0, "nccl_port": 80, "tp": 2}),
        settings,
    )
    assert set(found) == {
        f"{LOADTIME}.tensor_parallel_size",
        f"{LOADTIME}.watchdog_timeout_s",
        f"{LOADTIME}.nccl_port",
        f"{LOADTIME}.tp",
        f"{LOADTIME}.startup_timeout_s",
        f"{LOADTIME}.request_read_timeout_s",
    }


# --- never a traceback ----------------------------------------------------------------------

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
)
_options = st.dictionaries(
    st.sampled_from(
        [
            "tensor_parallel_size",
            "request_read_timeout_s",
            "startup_timeout_s",
            "watchdog_timeout_s",
            "disable_piecewise_cuda_graph",
            "nccl_port",
            "disable_cuda_graph",
            "chat_template",
            "device",
            "threads",
            "max_batch_size",
            "tp",
        ]
    ),
    _values,
    max_size=6,
)


@settings(max_examples=300)
@given(
    loadtime=_options,
    adapter=st.sampled_from([GENERATION, EMBEDDING, CHAT, TRANSFORMERS, None]),
    encode=st.booleans(),
    devices=st.integers(min_value=1, max_value=8),
    budget=st.one_of(st.none(), st.floats(min_value=1, max_value=2000)),
)
def test_any_load_time_options_are_accepted_or_refused_with_paths(
    loadtime: dict[str, Any],
    adapter: str | None,
    encode: bool,
    devices: int,
    budget: float | None,
) -> None:
    tasks = {"encode": {}} if encode else {"generate": {}}
    try:
        model = served(loadtime, adapter=adapter, tasks=tasks)
    except InvalidConfig:
        return  # refused when read (a width that is not 1..8): test_config covers that
    settings_ = Settings(
        devices=tuple(f"cuda:{i}" for i in range(devices)),
        bundle="sglang",
        liveness_budget_s=budget,
    )
    try:
        options = resolve(model, settings_)
    except InvalidConfig as exc:
        problems = exc.problems
    else:
        assert 1 <= options.width <= devices
        assert options.startup_timeout_s > 0
        return
    assert problems
    assert all(p.path.startswith("$.") and p.file == "m.yaml" for p in problems)
