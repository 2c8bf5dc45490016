"""Which pools can serve which model: the shipped model configs, read like the worker does.

A pool x bundle can serve a served model (``<sie_id>`` or ``<sie_id>:<profile>``) when its
bundle runs the model's adapter (the profile's ``adapter_path``, else the bundle's default)
and its slot width is at least the model's ``tensor_parallel_size``. An adapter runs on:
the bundles it names in a ``bundles`` class attribute when it has one; else, for the
transformers engine, the ``default`` bundle; for SGLang, every other bundle.

Without a config dir the catalogue is empty and not ``complete``: pools that list a model
in their pods' ``/v1/models`` serve it, and a pool not seen yet is assumed to (its pod
answers ``unknown_model`` if not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sie_worker.config.adapters import UnknownAdapter, default_adapter_path, resolve_adapter
from sie_worker.config.files.reader import load_config_dir
from sie_worker.config.load.load_options import declared_width
from sie_worker.config.model import ServedModel, served_models
from sie_worker.config.widths import width_fits
from sie_worker.engines.registry import bundle_engine, family_of
from sie_worker.errors import Problem
from sie_worker.gateway.pools import PoolSpec

__all__ = ["Catalogue", "ModelInfo", "bundle_runs"]


@dataclass(frozen=True)
class ModelInfo:
    id: str
    served: ServedModel
    width: int


def bundle_runs(adapter_path: str, bundle: str) -> str | None:
    """None when ``bundle`` runs the adapter, else why not."""
    try:
        adapter = resolve_adapter(adapter_path)
    except UnknownAdapter as exc:
        return str(exc)
    declared = getattr(adapter, "bundles", None)
    if isinstance(declared, tuple | list | frozenset | set):
        if bundle in declared:
            return None
        return f"adapter {adapter_path} runs on bundle(s) {', '.join(sorted(declared))}"
    engine = bundle_engine(bundle)
    if engine == adapter.engine:
        return None
    family = family_of(adapter.engine)
    if len(family.bundles) == 1:
        return f"adapter {adapter_path} runs on the {family.bundles[0]} bundle only"
    # "an SGLang", "a vLLM": the article of the name as it is spoken.
    article = "an" if family.label[0] in "AEFHILMNORSX" else "a"
    return (
        f"adapter {adapter_path} needs {article} {family.label} bundle "
        f"({', '.join(family.bundles)}), not {bundle}"
    )


class Catalogue:
    """The served models of a config dir and the rule that fits them to pools."""

    def __init__(self, models: Mapping[str, ModelInfo], *, complete: bool) -> None:
        self.models = dict(models)
        self.complete = complete

    @classmethod
    def empty(cls) -> Catalogue:
        return cls({}, complete=False)

    @classmethod
    def from_config_dir(cls, path: Path) -> tuple[Catalogue, list[Problem]]:
        """Every served model under ``path``; configs with problems are left out (listed)."""
        configs, problems = load_config_dir(path)
        models: dict[str, ModelInfo] = {}
        for config in configs.values():
            for served in served_models(config):
                models[served.id] = ModelInfo(served.id, served, declared_width(served))
        return cls(models, complete=True), problems

    def fit(self, model: str, spec: PoolSpec, width: int | None = None) -> str | None:
        """None when the pool x bundle can serve ``model``, else why not (for ``no_pool``):
        its bundle must run the model's adapter (shipped models) and its slots be as wide as
        the model (its config's width, else ``width``: the widest its pods list). The one
        check of both: a slot narrower than the model refuses it at load."""
        where = f"pool {spec.pool}, bundle {spec.bundle}"
        info = self.models.get(model)
        source = ""
        if info is not None:
            served = info.served
            adapter = served.profile.adapter_path or default_adapter_path(
                bundle_engine(spec.bundle), served.config.tasks
            )
            why = bundle_runs(adapter, spec.bundle)
            if why is not None:
                return f"{where}: {why}"
            width, source = info.width, " (tensor_parallel_size)"
        if width is not None and not width_fits(width, spec.slot_width):
            return (
                f"{where}: the model needs {width} GPUs per slot{source} and the pool's "
                f"slots have {spec.slot_width}"
            )
        return None  # not shipped, wide enough: the pods say (unknown_model) if not theirs
