"""SIE's plain encoders and cross-encoders on the default transformers engine: what each one
passes to the engine (the plan), and what is refused because the engine cannot do it."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import served_model
from sie_worker.errors import InvalidConfig
from sie_worker.settings import Settings
from sie_worker.worker.launcher.plan import plan_launch

ST = "sie_server.adapters.sentence_transformer:SentenceTransformerDenseAdapter"
BERT = "sie_server.adapters.bert_flash:BertFlashAdapter"
XLMR = "sie_server.adapters.xlm_roberta_flash:XLMRobertaFlashAdapter"
MODERNBERT = "sie_server.adapters.modernbert_flash:ModernBERTFlashAdapter"
BERT_CE = "sie_server.adapters.bert_flash_cross_encoder:BertFlashCrossEncoderAdapter"
CE = "sie_server.adapters.cross_encoder:CrossEncoderAdapter"
SETTINGS = Settings(devices=("cpu",))


def _served(adapter: str, *, loadtime: Any = None, runtime: Any = None, **top: Any) -> Any:
    score = adapter in (BERT_CE, CE)
    doc: dict[str, Any] = {
        "sie_id": "org/model",
        "hf_id": "org/model",
        "max_sequence_length": 512,
        "tasks": {"score": {}} if score else {"encode": {"dense": {"dim": 384}, "sparse": None}},
        "profiles": {"default": {"adapter_path": adapter, "adapter_options": {}}},
        **top,
    }
    options = doc["profiles"]["default"]["adapter_options"]
    if loadtime:
        options["loadtime"] = loadtime
    if runtime:
        options["runtime"] = runtime
    return served_model(parse_config(doc, source="m.yaml"), "default")


def _argv(served: Any) -> list[str]:
    options = resolve_load_options(served, SETTINGS, env={})
    plan = plan_launch(served, options, ("cpu",), port=30001, nccl_port=None, settings=SETTINGS)
    assert plan.argv[:3] == (sys.executable, "-m", "sie_worker.engines.transformers")
    return list(plan.argv[3:])


def test_a_flash_bert_embedder_runs_with_sie_s_pooling_and_templates() -> None:
    served = _served(
        BERT,
        runtime={
            "pooling": "cls",
            "normalize": True,
            "query_template": "query: {text}",
            "doc_template": "passage: {text}",
        },
    )
    assert _argv(served) == [
        "--model-path",
        "org/model",
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
        "--task",
        "encode",
        "--served-model-name",
        "org/model",
        "--pooling",
        "cls",
        "--query-template",
        "query: {text}",
        "--doc-template",
        "passage: {text}",
        "--context-length",
        "512",
    ]


def test_sie_s_default_pooling_is_passed_when_the_config_sets_none() -> None:
    assert _argv(_served(BERT))[_argv(_served(BERT)).index("--pooling") + 1] == "mean"
    modern = _argv(_served(MODERNBERT))
    assert modern[modern.index("--pooling") + 1] == "cls"


def test_sentence_transformers_models_pool_as_their_own_modules_say() -> None:
    argv = _argv(
        _served(
            ST,
            runtime={"pooling": "last", "normalize": False},
            loadtime={"trust_remote_code": False},
        )
    )
    assert "--pooling" not in argv
    assert "--no-normalize" in argv


def test_runtime_options_win_over_loadtime_ones() -> None:
    argv = _argv(
        _served(
            XLMR, loadtime={"pooling": "mean"}, runtime={"pooling": "cls", "instruction": "Find"}
        )
    )
    assert argv[argv.index("--pooling") + 1] == "cls"
    assert argv[argv.index("--default-instruction") + 1] == "Find"


def test_cross_encoders_serve_the_score_task() -> None:
    argv = _argv(_served(BERT_CE))
    assert argv[argv.index("--task") + 1] == "score"
    ce = _argv(_served(CE, loadtime={"max_length": 256, "attn_implementation": "sdpa"}))
    assert ce[ce.index("--context-length") + 1] == "256"


@pytest.mark.parametrize(
    ("adapter", "options", "path", "says"),
    [
        (
            ST,
            {"loadtime": {"trust_remote_code": True}},
            "loadtime.trust_remote_code",
            "repository's own code",
        ),
        (BERT, {"runtime": {"pooling": "last"}}, "runtime.pooling", "must be one of cls, mean"),
        (BERT, {"runtime": {"normalize": "yes"}}, "runtime.normalize", "true or false"),
        (XLMR, {"runtime": {"lora_id": "org/lora"}}, "runtime.lora_id", "lora_paths"),
        (BERT, {"loadtime": {"query_template": 3}}, "loadtime.query_template", "must be a string"),
        (
            BERT,
            {"loadtime": {"tensor_parallel_size": 2}},
            "loadtime.tensor_parallel_size",
            "runs on one device",
        ),
        (
            BERT,
            {"loadtime": {"cuda_graph": "off"}},
            "loadtime.cuda_graph",
            "is not a load-time option of BertFlashAdapter",
        ),
    ],
)
def test_what_the_default_engine_cannot_do_is_refused_at_load(
    adapter: str, options: dict[str, Any], path: str, says: str
) -> None:
    served = _served(adapter, **options)
    with pytest.raises(InvalidConfig) as refused:
        resolve_load_options(served, SETTINGS, env={})
    found = {p.path: p.message for p in refused.value.problems}
    key = f"$.profiles.default.adapter_options.{path}"
    assert key in found, found
    assert says in found[key]


def test_sparse_or_multivector_outputs_are_refused_on_the_default_engine() -> None:
    doc = {
        "sie_id": "org/model",
        "hf_id": "org/model",
        "tasks": {"encode": {"dense": {"dim": 8}, "sparse": {"dim": 30522}}},
        "profiles": {"default": {"adapter_path": BERT}},
    }
    served = served_model(parse_config(doc, source="m.yaml"), "default")
    with pytest.raises(
        InvalidConfig, match=r"\$\.tasks\.encode\.sparse: BertFlashAdapter makes dense"
    ):
        resolve_load_options(served, SETTINGS, env={})


def test_kernel_switches_of_sie_are_accepted_without_effect() -> None:
    argv = _argv(_served(MODERNBERT, loadtime={"cuda_graphs": "bucketed", "fused_rope": True}))
    assert not any("graph" in a or "rope" in a for a in argv)
