"""What a request reads about the served model that answers it, worked out once per config.

A warm request consults no rule per request for these: the record keeps them
(:attr:`~sie_worker.worker.records.ModelRecord.facts`), computed when its config is set,
so the route reads data. Pure.

- ``tasks``: what the config declares it serves;
- ``adapters``: the LoRA adapters it declares (a request's adapter must be one of them);
- ``grammar_id``: the served model a grammar-constrained request sent to it goes to
  (:func:`~sie_worker.worker.request.grammar_target`);
- ``runtime``: its profile's runtime options (body rewrite, timeouts).
"""

from __future__ import annotations

from dataclasses import dataclass

from sie_worker.config.lora import adapter_names
from sie_worker.config.model import ServedModel
from sie_worker.config.runtime import RequestRuntime, request_runtime
from sie_worker.worker.request import grammar_target

__all__ = ["ServingFacts", "serving_facts"]


@dataclass(frozen=True)
class ServingFacts:
    tasks: frozenset[str]
    adapters: tuple[str, ...]  # as declared (a few at most: a tuple is searched fastest)
    grammar_id: str
    runtime: RequestRuntime


def serving_facts(served: ServedModel) -> ServingFacts:
    return ServingFacts(
        tasks=frozenset(served.config.tasks),
        adapters=adapter_names(served.profile.loadtime),
        grammar_id=grammar_target(served.config, served.id),
        runtime=request_runtime(served),
    )
