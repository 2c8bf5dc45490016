"""Load-time checks of the llama.cpp adapter's options (``sie_server.adapters.llamacpp``):

- each option's rule (:mod:`.options`), and the split fitting the width and the devices
  (on cpu devices width 1; ``tensor_split`` one proportion per device);
- ``gguf_file``: in a local folder it must exist, and without it the folder must hold
  exactly one ``.gguf`` file; a model fetched from a hub repository must name it (the fetch
  takes only that file);
- ``extra_launch_args`` set no reserved flag (:mod:`.reserved`) and use no ``--flag=value``
  form (llama-server reads none and refuses it only when it starts).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sie_worker.config.flags.option_rules import Release
from sie_worker.config.flags.option_tables import OptionTable, unknown_option
from sie_worker.config.model import JsonPath, ServedModel
from sie_worker.engines.llamacpp.options import LLAMACPP_OPTIONS, option_problem, split_problem
from sie_worker.engines.llamacpp.reserved import RESERVED, reserved_spelling

__all__ = ["LlamaCppChecks", "extra_arg_problems"]

Where = str | JsonPath


def extra_arg_problems(args: list[str], table: OptionTable | None) -> list[tuple[int, str]]:
    """``(index, message)`` of each ``extra_launch_args`` token llama-server must not get:
    a reserved flag, a ``--flag=value`` form, a long option the release's table (``table``,
    read from its own ``--help``) does not know."""
    found = []
    for index, token in enumerate(args):
        option = reserved_spelling(token)
        if option is not None:
            why, fix = RESERVED[option]
            found.append((index, f"{token!r} sets the reserved flag {option}: {why}; {fix}"))
        elif table is not None and token.startswith("--") and "=" not in token and token != "--":
            spelled = "--" + token[2:].replace("_", "-")
            if not table.has(spelled):
                found.append((index, unknown_option(token, table, f"llama.cpp {table.version}")))
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
    def __init__(
        self,
        served: ServedModel,
        loadtime: Mapping[str, Any],
        release: Release,
        *,
        folder: str | None,
        on_cpu: bool,
        width: int,
    ) -> None:
        self.served = served
        self.loadtime = loadtime
        self.release = release
        self.folder = folder
        self.on_cpu = on_cpu
        self.width = width  # the devices of this node (a group's rank: its share)
        self.warnings: list[str] = []

    def problems(self) -> list[tuple[Where, str]]:
        found = self._options()
        if found:
            return found + self._extra_args()
        return self._split() + self._gguf() + self._extra_args()

    def _options(self) -> list[tuple[Where, str]]:
        found: list[tuple[Where, str]] = []
        for name, value in self.loadtime.items():
            if name in LLAMACPP_OPTIONS:
                message = option_problem(name, value, self.release)
                if message is not None:
                    found.append((name, message))
        return found

    def _split(self) -> list[tuple[Where, str]]:
        message = split_problem(self.loadtime, self.width, "cpu" if self.on_cpu else "cuda")
        return [] if message is None else [("tensor_split", message)]

    def _gguf(self) -> list[tuple[Where, str]]:
        name = self.loadtime.get("gguf_file")
        if self.folder is None:
            if name is None and self.served.config.hf_id:
                # A hub repository often holds many quantizations: the fetch takes one.
                return [
                    (
                        "gguf_file",
                        f"is required for a model fetched from {self.served.config.hf_id}: name "
                        "the .gguf file to serve (the fetch takes only it, and a split model's "
                        "parts), e.g. model-Q4_K_M.gguf",
                    )
                ]
            return []
        folder = Path(self.folder)
        files = sorted(p.name for p in folder.glob("*.gguf"))
        if isinstance(name, str):
            if (folder / name).is_file():
                return []
            listed = ", ".join(files) or "none"
            return [("gguf_file", f"{name} is not in {folder} (its .gguf files: {listed})")]
        if len(files) == 1:
            return []
        listed = ", ".join(files) if files else "no .gguf file"
        return [("gguf_file", f"is required: {folder} holds {listed}; name the one to serve")]

    def _extra_args(self) -> list[tuple[Where, str]]:
        profile = self.served.profile
        return [
            ((*profile.launch_args_path, index), message)
            for index, message in extra_arg_problems(
                list(profile.extra_launch_args), self.release.table
            )
        ]
