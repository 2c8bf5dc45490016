"""The states a served model goes through on one worker, shared by every view of them.

``unloaded -> loading -> ready``, or ``failed`` (with the reason) when a load or the engine
fails; the next request may load a failed or unloaded model again. The worker's records and
metrics, the slot router's polls and merged views and the gateway all speak these words.
"""

from __future__ import annotations

from typing import Final, Literal, TypeGuard

__all__ = ["MODEL_STATES", "ModelState", "is_model_state", "parse_state", "progress"]

ModelState = Literal["unloaded", "loading", "ready", "failed"]
MODEL_STATES: Final[tuple[ModelState, ...]] = ("unloaded", "loading", "ready", "failed")
# How far along a model is: where several slots or pods report one model, the furthest wins.
_PROGRESS: Final[dict[ModelState, int]] = {"ready": 3, "loading": 2, "failed": 1, "unloaded": 0}


def is_model_state(value: object) -> TypeGuard[ModelState]:
    return isinstance(value, str) and value in _PROGRESS


def parse_state(value: object) -> ModelState:
    """A state as another process reported it; anything unknown counts as ``unloaded``."""
    return value if is_model_state(value) else "unloaded"


def progress(state: object) -> int:
    """``ready`` 3, ``loading`` 2, ``failed`` 1, anything else 0."""
    return _PROGRESS[state] if is_model_state(state) else 0
