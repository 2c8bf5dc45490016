"""A served model from a small config document, read by the worker's own reader:
``served(tasks, profile=..., **profiles)`` (sie_id ``org/m``)."""

from __future__ import annotations

from typing import Any

from sie_worker.config.files.reader import parse_config
from sie_worker.config.model import ServedModel, served_model

__all__ = ["served"]


def served(
    tasks: dict[str, Any], *, profile: str = "default", **profiles: dict[str, Any]
) -> ServedModel:
    doc = {
        "sie_id": "org/m",
        "hf_id": "org/m",
        "tasks": tasks,
        "profiles": {"default": {}, **profiles},
    }
    return served_model(parse_config(doc, source=None), profile)
