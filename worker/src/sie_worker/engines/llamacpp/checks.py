"""Load-time checks of the llama.cpp adapter's options (``sie_server.adapters.llamacpp``):

- ``gguf_file``: a file name ending in ``.gguf``, inside the model's folder (no ``..``, not
  absolute); in a local folder it must exist, and without it the folder must hold exactly one
  ``.gguf`` file;
- ``split_mode``: ``layer`` or ``row``; ``tensor_split``: one positive number per device of the
  tensor width; ``parallel``: the server's slots, an integer of at least 1;
- ``extra_launch_args`` set no reserved flag (:mod:`.reserved`) and use no ``--flag=value``
  form (llama-server reads none and refuses it only when it starts).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from sie_worker.config.files.values import described
from sie_worker.config.model import JsonPath, ServedModel
from sie_worker.engines.llamacpp.reserved import RESERVED, reserved_spelling

__all__ = ["LlamaCppChecks", "extra_arg_problems"]

Where = str | JsonPath
SPLIT_MODES = ("layer", "row")


def extra_arg_problems(args: list[str]) -> list[tuple[int, str]]:
    """``(index, message)`` of each ``extra_launch_args`` token llama-server must not get."""
    found = []
    for index, token in enumerate(args):
        option = reserved_spelling(token)
        if option is not None:
            why, fix = RESERVED[option]
            found.append((index, f"{token!r} sets the reserved flag {option}: {why}; {fix}"))
        elif token.startswith("-") and "=" in token:
            flag, _, value = token.partition("=")
            found.append(
                (
                    index,
                    f"{token!r}: llama-server reads no --flag=value form and would refuse it "
                    f"when it starts; pass {flag!r} and {value!r} as two arguments",
                )
            )
    return found


class LlamaCppChecks:
    def __init__(self, served: ServedModel, loadtime: Mapping[str, Any], folder: str | None):
        self.served = served
        self.loadtime = loadtime
        self.folder = folder
        self.warnings: list[str] = []

    def problems(self) -> list[tuple[Where, str]]:
        return self._gguf() + self._split() + self._parallel() + self._extra_args()

    def _gguf(self) -> list[tuple[Where, str]]:
        name = self.loadtime.get("gguf_file")
        if name is not None:
            path = PurePosixPath(name) if isinstance(name, str) else None
            if path is None or not name.endswith(".gguf") or path.is_absolute() or ".." in path.parts:
                return [
                    (
                        "gguf_file",
                        "must name a .gguf file inside the model's folder or repository, "
                        f"e.g. model-q4_k_m.gguf, got {described(name)}",
                    )
                ]
        if self.folder is None:
            return []
        folder = Path(self.folder)
        if isinstance(name, str):
            if not (folder / name).is_file():
                found = ", ".join(sorted(p.name for p in folder.glob("*.gguf"))) or "none"
                return [("gguf_file", f"{name} is not in {folder} (its .gguf files: {found})")]
            return []
        files = sorted(p.name for p in folder.glob("*.gguf"))
        if len(files) != 1:
            listed = ", ".join(files) if files else "no .gguf file"
            return [
                (
                    "gguf_file",
                    f"is required: {folder} holds {listed}; name the one to serve",
                )
            ]
        return []

    def _split(self) -> list[tuple[Where, str]]:
        found: list[tuple[Where, str]] = []
        mode = self.loadtime.get("split_mode")
        if mode is not None and mode not in SPLIT_MODES:
            found.append(
                ("split_mode", f"must be one of {', '.join(SPLIT_MODES)}, got {described(mode)}")
            )
        split = self.loadtime.get("tensor_split")
        if split is None:
            return found
        width = self.loadtime.get("tensor_parallel_size", 1)
        numbers = isinstance(split, list) and all(
            isinstance(p, int | float) and not isinstance(p, bool) and p > 0 for p in split
        )
        if not numbers or len(split) != width:
            found.append(
                (
                    "tensor_split",
                    f"must be {width} positive number(s), one proportion per device of "
                    f"tensor_parallel_size {width}, e.g. {[1] * width}, got {described(split)}",
                )
            )
        return found

    def _parallel(self) -> list[tuple[Where, str]]:
        value = self.loadtime.get("parallel")
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return []
        return [("parallel", f"must be an integer of at least 1, got {described(value)}")]

    def _extra_args(self) -> list[tuple[Where, str]]:
        profile = self.served.profile
        return [
            ((*profile.launch_args_path, index), message)
            for index, message in extra_arg_problems(list(profile.extra_launch_args))
        ]
