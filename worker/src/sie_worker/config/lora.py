"""LoRA adapters of a profile: ``adapter_options.loadtime.lora_paths`` and
``max_loras_per_batch``, read, checked and turned into what engines and requests use. Pure.

``lora_paths`` takes SIE's and SGLang's spellings:

- SIE's mapping, served name -> source: ``{sql: org/sql-lora}``, or a pinned
  ``{sql: {id: org/sql-lora, revision: <40-hex commit>}}``;
- a list of SGLang's ``--lora-paths`` entries: ``"sql=/adapters/sql"``, a bare source (its
  name is the source itself, as in SGLang), or ``{lora_name, lora_path, pinned}`` (a mapping,
  or that JSON written as a string).

A source is a local folder when it starts with ``/``, ``./``, ``../`` or ``~`` (a relative
one is relative to the config file's folder, as ``model_path``), else a Hugging Face repo id.

Rules (each refusal names its JSON path and the fix): names match :data:`NAME_PATTERN`
(letters, digits, ``.``, ``_``, ``-`` and ``/``, starting with a letter or digit, at most 128
characters: no ``:``, which separates ``model:adapter``, no ``=``, ``,`` or whitespace,
which SGLang's ``--lora-paths`` splits on), are unique, and are not a profile name of the
model (``sie_id:name`` would mean both); a repo id is one huggingface_hub accepts; a
revision is a 40-character commit; ``max_loras_per_batch`` is an integer of at least 1
(SGLang's own rule) and above the pinned adapters (SGLang never pins every slot: one stays
for the base and the others). A local folder must hold ``adapter_config.json`` when the
model loads (:func:`local_problems`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # not re-exported

from sie_worker.config.files.values import described

__all__ = [
    "ADAPTER_CONFIG",
    "BASE_ADAPTER",
    "DEFAULT_MAX_LORAS",
    "LOCAL_PREFIXES",
    "NAME_PATTERN",
    "LoraAdapter",
    "adapter_names",
    "is_local",
    "load_adapters",
    "local_problems",
    "lora_adapters",
    "lora_problems",
    "max_loras",
    "resolve_local",
    "resolved_adapters",
    "sglang_lora_args",
]

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
LOCAL_PREFIXES = ("/", "./", "../", "~")
ADAPTER_CONFIG = "adapter_config.json"
BASE_ADAPTER = "none"  # the metrics label of requests without an adapter
# SIE's defaults of max_loras_per_batch: its generation adapters 4, its embedding adapter 8.
DEFAULT_MAX_LORAS: Mapping[str, int] = {"generate": 4, "encode": 8, "score": 8}
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NAMES = "letters, digits, '.', '_', '-' and '/', starting with a letter or digit"

Where = tuple[str | int, ...]  # below lora_paths


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter: its served name, its source as written (a folder or a repo id), the
    revision to fetch (repo ids only), and whether SGLang keeps it pinned on the GPU."""

    name: str
    source: str
    revision: str | None = None
    pinned: bool = False

    @property
    def local(self) -> bool:
        return is_local(self.source)


def is_local(source: str) -> bool:
    return source.startswith(LOCAL_PREFIXES)


def _entry(value: Any) -> tuple[str, str, str | None, bool] | str:
    """``(name, source, revision, pinned)`` of one list entry, or why it is malformed."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            return "looks like JSON but does not parse; write a mapping {lora_name, lora_path}"
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in ("lora_name", "lora_path", "pinned"))
        if unknown:
            return (
                f"has unknown key(s) {', '.join(unknown)}; an entry is "
                "{lora_name, lora_path, pinned?} (or SIE's mapping form name: {id, revision})"
            )
        name, path, pinned = value.get("lora_name"), value.get("lora_path"), value.get("pinned")
        if not isinstance(name, str) or not isinstance(path, str) or not path:
            return "needs lora_name and lora_path, both strings"
        if pinned is not None and not isinstance(pinned, bool):
            return f"pinned must be true or false, got {described(pinned)}"
        return name, path, None, bool(pinned)
    if not isinstance(value, str) or not value.strip():
        return f"must be 'name=path', a path, or {{lora_name, lora_path}}, got {described(value)}"
    text = value.strip()
    if "=" in text:
        name, _, path = text.partition("=")
        return name, path, None, False
    return text, text, None, False


def _parsed(value: Any) -> list[tuple[Where, tuple[str, str, str | None, bool] | str]]:
    found: list[tuple[Where, tuple[str, str, str | None, bool] | str]] = []
    if isinstance(value, Mapping):
        for name, ref in value.items():
            where: Where = (str(name),)
            if isinstance(ref, str) and ref:
                found.append((where, (str(name), ref, None, False)))
            elif isinstance(ref, Mapping):
                unknown = sorted(str(k) for k in ref if k not in ("id", "revision"))
                rid, revision = ref.get("id"), ref.get("revision")
                if unknown:
                    why = (
                        f"has unknown key(s) {', '.join(unknown)}; a pinned reference is "
                        "exactly {id: <repo>, revision: <40-character commit>}"
                    )
                    found.append((where, why))
                elif not isinstance(rid, str) or not rid:
                    found.append((where, f"id must be a nonempty repo id, got {described(rid)}"))
                elif revision is not None and not (
                    isinstance(revision, str) and _COMMIT.match(revision)
                ):
                    found.append(
                        (
                            (*where, "revision"),
                            f"must be a 40-character commit hash (a branch or tag moves), got "
                            f"{described(revision)}; pin the commit, or omit revision",
                        )
                    )
                else:
                    found.append((where, (str(name), rid, revision, False)))
            else:
                why = f"must be a repo id, a folder or {{id, revision}}, got {described(ref)}"
                found.append((where, why))
    elif isinstance(value, list):
        found = [((index,), _entry(entry)) for index, entry in enumerate(value)]
    return found


def lora_adapters(loadtime: Mapping[str, Any]) -> tuple[LoraAdapter, ...]:
    """The adapters ``loadtime.lora_paths`` declares, in order (malformed entries skipped)."""
    adapters = []
    for _, entry in _parsed(loadtime.get("lora_paths")):
        if not isinstance(entry, str):
            adapters.append(LoraAdapter(*entry))
    return tuple(adapters)


def adapter_names(loadtime: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(a.name for a in lora_adapters(loadtime))


def max_loras(loadtime: Mapping[str, Any], task: str | None) -> int:
    """``max_loras_per_batch`` as declared, else SIE's default for the task."""
    value = loadtime.get("max_loras_per_batch")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return DEFAULT_MAX_LORAS.get(task or "generate", 4)


def lora_problems(
    loadtime: Mapping[str, Any], profiles: tuple[str, ...] = ()
) -> list[tuple[tuple[str | int, ...], str]]:
    """Problems of ``lora_paths`` and ``max_loras_per_batch``; each path starts at the option
    name (``("lora_paths", "sql")``). ``profiles``: the model's profile names."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    limit = loadtime.get("max_loras_per_batch")
    if "max_loras_per_batch" in loadtime and (
        isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
    ):
        found.append(
            (
                ("max_loras_per_batch",),
                f"must be an integer of at least 1 (adapters in one batch), got {described(limit)}",
            )
        )
    if "lora_paths" not in loadtime:
        return found
    value = loadtime["lora_paths"]
    if not isinstance(value, Mapping | list) or not value:
        found.append(
            (
                ("lora_paths",),
                "must be a nonempty mapping of served name -> repo id or folder (e.g. "
                f"{{sql: my-org/sql-lora}}) or a list of 'name=path' entries, got "
                f"{described(value)}",
            )
        )
        return found
    seen: dict[str, Where] = {}
    pinned = 0
    for where, entry in _parsed(value):
        path = ("lora_paths", *where)
        if isinstance(entry, str):
            found.append((path, entry))
            continue
        name, source, _, pin = entry
        pinned += pin
        problem = _name_problem(name, profiles)
        if problem is not None:
            found.append((path, problem))
        elif name in seen:
            first = "lora_paths." + ".".join(str(p) for p in seen[name])
            why = f"adapter names must be unique: {name!r} is named at {first} too; rename one"
            found.append((path, why))
        else:
            seen[name] = where
        problem = _source_problem(source)
        if problem is not None:
            found.append((path, problem))
    batch = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1 else 8
    if pinned and pinned >= batch:
        found.append(
            (
                ("lora_paths",),
                f"pins {pinned} adapter(s) and max_loras_per_batch is {batch}: SGLang keeps one "
                "slot unpinned for the base and the other adapters; pin fewer, or raise "
                f"max_loras_per_batch to {pinned + 1}",
            )
        )
    return found


def _name_problem(name: str, profiles: tuple[str, ...]) -> str | None:
    if not NAME_PATTERN.match(name):
        hint = ""
        if name.startswith(LOCAL_PREFIXES):
            hint = " (a bare folder is its own name in SGLang: write it as 'name=/folder')"
        return f"adapter name {name!r} is not allowed: use {_NAMES}, at most 128 characters{hint}"
    if name in profiles:
        return (
            f"adapter name {name!r} is also a profile of this model, so 'model:{name}' would "
            "name both; rename the adapter"
        )
    return None


def _source_problem(source: str) -> str | None:
    if not source.strip() or source != source.strip():
        return f"source {source!r} must be a folder or a repo id without surrounding spaces"
    if is_local(source):
        return None
    try:
        validate_repo_id(source)
    except HFValidationError as exc:
        return (
            f"source {source!r} is neither a folder (start it with /, ./ or ../) nor a Hugging "
            f"Face repo id: {exc}"
        )
    return None


def local_problems(
    loadtime: Mapping[str, Any], base_dir: Path | None
) -> list[tuple[tuple[str | int, ...], str]]:
    """Local adapter folders that are missing or hold no ``adapter_config.json``."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    for where, entry in _parsed(loadtime.get("lora_paths")):
        if isinstance(entry, str) or not is_local(entry[1]):
            continue
        folder = resolve_local(entry[1], base_dir)
        if folder is None:
            found.append(
                (
                    ("lora_paths", *where),
                    f"{entry[1]} is relative but the config has no file to be relative to; "
                    "use an absolute path",
                )
            )
        elif not (folder / ADAPTER_CONFIG).is_file():
            what = "is not a folder" if not folder.is_dir() else f"has no {ADAPTER_CONFIG}"
            found.append(
                (
                    ("lora_paths", *where),
                    f"{entry[1]}: {folder} {what}; point it at a PEFT adapter folder "
                    f"(adapter_config.json and adapter_model.safetensors)",
                )
            )
    return found


def resolve_local(source: str, base_dir: Path | None) -> Path | None:
    """The folder a local source names (None: relative without a config folder)."""
    path = Path(source).expanduser()
    if path.is_absolute():
        return path
    return base_dir / path if base_dir is not None else None


def resolved_adapters(
    loadtime: Mapping[str, Any], base_dir: Path | None
) -> tuple[LoraAdapter, ...]:
    """The declared adapters with each local source resolved to its absolute folder (hub
    ones stay repo ids until the worker fetches them)."""
    resolved = []
    for lora in lora_adapters(loadtime):
        folder = resolve_local(lora.source, base_dir) if lora.local else None
        resolved.append(replace(lora, source=str(folder.resolve())) if folder else lora)
    return tuple(resolved)


Found = list[tuple[tuple[str | int, ...], str]]


def load_adapters(
    loadtime: Mapping[str, Any], base_dir: Path | None, fetched_by_worker: bool
) -> tuple[tuple[LoraAdapter, ...], Found, Found]:
    """At load: the adapters (local folders resolved), the local folders that are missing or
    not adapters, and warnings for pins the engine would not honour (it fetches hub adapters
    itself when the worker does not)."""
    if "lora_paths" not in loadtime:
        return (), [], []
    loras = resolved_adapters(loadtime, base_dir)
    warnings: Found = [
        (
            ("lora_paths", lora.name),
            f"revision {lora.revision} is applied when the worker fetches the adapter "
            "(SIE_WEIGHTS_DOWNLOAD=worker); the engine fetches the default branch",
        )
        for lora in loras
        if lora.revision and not lora.local and not fetched_by_worker
    ]
    return loras, local_problems(loadtime, base_dir), warnings


def sglang_lora_args(adapters: tuple[LoraAdapter, ...], max_per_batch: int) -> tuple[str, ...]:
    """SGLang's flags for these adapters (their sources already resolved): ``--enable-lora
    --max-loras-per-batch N --lora-paths`` and one token each, ``name=path``, or SGLang's JSON
    form for a pinned one. Separate tokens (SIE's embedding adapter joins them with commas,
    which SGLang reads as one adapter)."""
    if not adapters:
        return ()
    tokens = [
        json.dumps({"lora_name": a.name, "lora_path": a.source, "pinned": True})
        if a.pinned
        else f"{a.name}={a.source}"
        for a in adapters
    ]
    return ("--enable-lora", "--max-loras-per-batch", str(max_per_batch), "--lora-paths", *tokens)
