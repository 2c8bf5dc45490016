"""A served model's request facts are the rules' answers, worked out once per config and
worked out again when the config changes."""

from __future__ import annotations

from typing import Any

from sie_worker.config.files.reader import parse_config
from sie_worker.config.model import served_models
from sie_worker.config.runtime import request_runtime
from sie_worker.worker.records import ModelRecord
from sie_worker.worker.request import grammar_target
from sie_worker.worker.serving import serving_facts


def _served(grammar_profile: str | None = "structured") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "sie_id": "org/m",
        "hf_id": "org/m",
        "tasks": {"generate": {}},
        "profiles": {
            "default": {
                "adapter_options": {
                    "loadtime": {"lora_paths": {"sql": "org/sql-lora", "chat": "org/chat"}},
                    "runtime": {"first_chunk_timeout_s": 3},
                }
            },
            "structured": {"extends": "default"},
        },
    }
    if grammar_profile is not None:
        doc["grammar_profile"] = grammar_profile
    return {s.id: s for s in served_models(parse_config(doc, source=None))}


def test_the_facts_are_what_the_rules_say_for_the_served_model() -> None:
    served = _served()["org/m"]
    facts = serving_facts(served)
    assert facts.grammar_id == grammar_target(served.config, "org/m") == "org/m:structured"
    assert facts.tasks == {"generate"}
    assert facts.adapters == ("sql", "chat")
    assert facts.runtime == request_runtime(served)
    assert facts.runtime.timeouts.first_chunk_s == 3.0


def test_a_record_works_its_facts_out_again_when_its_config_changes() -> None:
    record = ModelRecord(_served()["org/m"])
    assert record.facts.grammar_id == "org/m:structured"
    record.serve(_served(None)["org/m"])
    assert record.facts.grammar_id == "org/m"
