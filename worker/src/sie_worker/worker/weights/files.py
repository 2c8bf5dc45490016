"""Which files of a model repo the engines need, when a cached snapshot can be trusted, and
how far a download has come: pure functions over file listings (no network, no disk).

**Selection.** An engine needs the model's configs, its tokenizer, any remote code and one
copy of its weights. Support files are every file matching :data:`SUPPORT_PATTERNS`;
weights come in the first format of :data:`WEIGHT_FORMATS` the repo has (safetensors
before PyTorch pickles), never both. When the format's index (``model.safetensors.index.json``)
exists, the weights are exactly the shards it names (so a repo that also carries
``consolidated.safetensors``, Mistral's own format, is fetched once); without one, every
file of the format, ``consolidated*`` left out when other files of the format exist.
Folders of other runtimes or of the original checkpoint (:data:`EXCLUDED_FOLDERS`:
``original/``, ``onnx/``, ``openvino/``, ...) are never fetched.

An engine may instead select its weight files (``EngineFamily.weight_selection``: llama.cpp
takes the model's ``gguf_file``, else ``*.gguf``): the support files as above plus exactly
the files the patterns match (``fnmatch`` over repo paths; a path without wildcards is
taken wherever it is, a wildcard skips excluded folders), a split GGUF's first part
(``<name>-00001-of-0000N.gguf``) bringing every part, and no other weight format.

**Trust.** A snapshot is trusted only when its completion record, written by the worker
after every selected file arrived, lists files that are all present with their sizes. Each
selection has its own record (:func:`marker_name`), so a snapshot fetched for one GGUF file
is not taken as complete for another of the same commit. A
download that stopped halfway leaves no record, so no later load (offline or not) starts
an engine on half a snapshot.

**Progress.** Bytes done are capped per file at the file's size, so a retried range never
counts twice; the total is unknown until every selected file's size is.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "DEFAULT_REVISION",
    "EXCLUDED_FOLDERS",
    "MARKER_FOLDER",
    "SELECTED",
    "SUPPORT_PATTERNS",
    "WEIGHT_FORMATS",
    "FilePlan",
    "NoWeights",
    "WeightFormat",
    "bytes_done",
    "bytes_total",
    "index_shards",
    "is_commit",
    "is_offline",
    "marker_name",
    "marker_text",
    "missing_files",
    "parse_marker",
    "plan_files",
    "repo_folder",
    "weight_files",
]

DEFAULT_REVISION: Final = "main"
# Under models--org--name/: one <commit>.json each, <commit>-<selection digest>.json for an
# engine's own selection of weight files (marker_name).
MARKER_FOLDER: Final = "sie-complete"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = frozenset({"1", "ON", "YES", "TRUE"})  # what huggingface_hub reads as true


@dataclass(frozen=True)
class WeightFormat:
    name: str
    pattern: str  # fnmatch pattern of the file name (its last path part)
    index: str  # the index file that names the shards


WEIGHT_FORMATS: Final[tuple[WeightFormat, ...]] = (
    WeightFormat("safetensors", "*.safetensors", "model.safetensors.index.json"),
    WeightFormat("PyTorch", "pytorch_model*.bin", "pytorch_model.bin.index.json"),
    # A PEFT (LoRA) adapter saved without safetensors.
    WeightFormat("PEFT PyTorch", "adapter_model.bin", "adapter_model.bin.index.json"),
)
# Configs (config.json, generation_config.json, sentence-transformers modules), tokenizers
# (tokenizer.json, tokenizer.model, vocab.txt, merges.txt, *.tiktoken), chat templates and
# the code of trust_remote_code models. All small.
SUPPORT_PATTERNS: Final[tuple[str, ...]] = (
    "*.json",
    "*.jinja",
    "*.txt",
    "*.model",
    "*.tiktoken",
    "*.py",
    "*.vocab",
    "*.spm",
)
EXCLUDED_FOLDERS: Final[tuple[str, ...]] = (
    "original",
    "onnx",
    "openvino",
    "coreml",
    "tflite",
    "gguf",
    "mlx",
    "flax",
    "tf",
    "rknn",
)


class NoWeights(ValueError):
    """The repo holds no weights in a format the engines load; the message lists what it has."""


@dataclass(frozen=True)
class FilePlan:
    """What to fetch: ``support`` files first (they include the weights' ``index`` when
    there is one), then ``weights``, which is None until the index has been read."""

    format: WeightFormat
    support: tuple[str, ...]
    index: str | None
    weights: tuple[str, ...] | None


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _excluded(path: str) -> bool:
    parts = path.split("/")
    return any(part in EXCLUDED_FOLDERS or part.startswith(".") for part in parts[:-1]) or (
        parts[-1].startswith(".")
    )


def _matches(path: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(_name(path), pattern)


def plan_files(repo_files: Iterable[str], selection: Sequence[str] = ()) -> FilePlan:
    """The files to fetch from a repo listing: the support files and the weights
    ``selection`` names (fnmatch patterns over repo paths), or, when it is empty, the usual
    one weight format. Raises :class:`NoWeights`."""
    if selection:
        return _plan_selected(sorted(set(repo_files)), tuple(selection))
    files = sorted({f for f in repo_files if not _excluded(f)})
    for fmt in WEIGHT_FORMATS:
        candidates = [f for f in files if _matches(f, fmt.pattern)]
        if not candidates:
            continue
        support = tuple(
            f
            for f in files
            if f not in candidates and any(_matches(f, p) for p in SUPPORT_PATTERNS)
        )
        index = fmt.index if fmt.index in files else None
        weights = None if index else tuple(_without_consolidated(candidates))
        return FilePlan(fmt, support, index, weights)
    raise NoWeights(_no_weights_message(files))


# The format of a plan whose weights an engine selected: no index, any file name.
SELECTED: Final = WeightFormat("selected", "*", "")
# A split GGUF (llama.cpp's gguf-split): <name>-00001-of-00003.gguf; the engine is given the
# first part and reads the others beside it.
_SPLIT_GGUF = re.compile(
    r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<parts>\d{5})(?P<ext>\.gguf)$", re.IGNORECASE
)


def _plan_selected(files: list[str], selection: tuple[str, ...]) -> FilePlan:
    chosen: set[str] = set()
    for pattern in selection:
        if _has_wildcard(pattern):
            chosen.update(f for f in files if not _excluded(f) and fnmatch.fnmatchcase(f, pattern))
        elif pattern in files:
            chosen.add(pattern)
    if not chosen:
        raise NoWeights(_nothing_selected(files, selection))
    weights = _with_split_parts(chosen, set(files))
    support = tuple(
        f
        for f in files
        if f not in weights and not _excluded(f) and any(_matches(f, p) for p in SUPPORT_PATTERNS)
    )
    return FilePlan(SELECTED, support, None, weights)


def _has_wildcard(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _with_split_parts(chosen: set[str], present: set[str]) -> tuple[str, ...]:
    """``chosen`` with every part of each split GGUF whose first part it holds. Raises
    :class:`NoWeights` when the repo lacks a part."""
    out = set(chosen)
    for path in chosen:
        split = _SPLIT_GGUF.match(path)
        if split is None or int(split.group("part")) != 1:
            continue
        stem, parts, ext = split.group("stem", "parts", "ext")
        names = [f"{stem}-{k:05d}-of-{parts}{ext}" for k in range(1, int(parts) + 1)]
        absent = [n for n in names if n not in present]
        if absent:
            raise NoWeights(
                f"{path} is part 1 of {int(parts)}, but the repo lacks {', '.join(absent[:3])}"
            )
        out.update(names)
    return tuple(sorted(out))


def _nothing_selected(files: list[str], selection: tuple[str, ...]) -> str:
    """What a repo holds instead of the selection: its files of the selection's kinds (its
    .gguf files), else the kinds of files it holds."""
    suffixes = {p.rsplit(".", 1)[-1].lower() for p in selection if "." in _name(p)}
    alike = [f for f in files if "." in _name(f) and f.rsplit(".", 1)[-1].lower() in suffixes]
    wanted = ", ".join(selection)
    if alike:
        kinds = ", ".join(sorted({f".{f.rsplit('.', 1)[-1]}" for f in alike}))
        shown = ", ".join(alike[:10]) + (f" and {len(alike) - 10} more" if len(alike) > 10 else "")
        return f"has no {wanted} (the weights its engine takes); its {kinds} files: {shown}"
    held = sorted({_name(f).rsplit(".", 1)[-1] for f in files if "." in _name(f)})
    found = ", ".join(f"*.{k}" for k in held) or "no files"
    return f"has no {wanted} (the weights its engine takes); it holds {found}"


def _without_consolidated(candidates: list[str]) -> list[str]:
    others = [f for f in candidates if not _name(f).startswith("consolidated")]
    return others or candidates


def _no_weights_message(files: list[str]) -> str:
    kinds = sorted({_name(f).rsplit(".", 1)[-1] for f in files if "." in _name(f)})
    wanted = ", ".join(f.pattern for f in WEIGHT_FORMATS)
    found = ", ".join(f"*.{k}" for k in kinds) or "no files"
    return f"has no weights the engines load ({wanted}); it holds {found}"


def index_shards(index: Any) -> frozenset[str]:
    """The shard files an index's ``weight_map`` names (empty when it is malformed)."""
    if not isinstance(index, Mapping):
        return frozenset()
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, Mapping):
        return frozenset()
    return frozenset(v for v in weight_map.values() if isinstance(v, str) and v)


def weight_files(
    plan: FilePlan, repo_files: Collection[str], shards: Collection[str]
) -> tuple[str, ...]:
    """The weights of a plan whose index names ``shards``: the named shards (beside the
    index), plus the format's files in other folders (sentence-transformers modules such as
    ``2_Dense/``). Raises :class:`NoWeights` when the index names none the repo has."""
    if plan.weights is not None:
        return plan.weights
    assert plan.index is not None
    folder = plan.index.rpartition("/")[0]
    prefix = f"{folder}/" if folder else ""
    present = set(repo_files)
    named = sorted(
        f for f in {prefix + s for s in shards} & present if _matches(f, plan.format.pattern)
    )
    if not named:
        raise NoWeights(f"its {plan.index} names no shard that the repo holds")
    extra = [
        f
        for f in sorted(present)
        if not _excluded(f) and _matches(f, plan.format.pattern) and f.rpartition("/")[0] != folder
    ]
    return tuple(named + extra)


# --- trust ------------------------------------------------------------------------------


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.match(revision))


def is_offline(env: Mapping[str, str]) -> bool:
    """True when huggingface_hub would refuse the network (``HF_HUB_OFFLINE``, else the
    older ``TRANSFORMERS_OFFLINE``)."""
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in _TRUE


def repo_folder(repo_id: str) -> str:
    """The cache folder of a model repo: ``models--org--name``."""
    return "models--" + repo_id.replace("/", "--")


def missing_files(
    expected: Mapping[str, int | None], present: Mapping[str, int | None]
) -> list[str]:
    """Expected files that are absent, or whose size differs from the expected one."""
    return sorted(
        path
        for path, size in expected.items()
        if path not in present or (size is not None and present[path] != size)
    )


def marker_name(commit: str, weights: Sequence[str] = ()) -> str:
    """The completion record's file name: ``<commit>.json`` for the usual choice of weights,
    ``<commit>-<digest of the selection>.json`` for an engine's own selection."""
    if not weights:
        return f"{commit}.json"
    digest = hashlib.sha256(json.dumps(list(weights)).encode()).hexdigest()[:16]
    return f"{commit}-{digest}.json"


def marker_text(
    repo_id: str, commit: str, files: Mapping[str, int | None], weights: Sequence[str] = ()
) -> str:
    data: dict[str, Any] = {"repo_id": repo_id, "commit": commit}
    if weights:
        data["weights"] = list(weights)
    data["files"] = dict(sorted(files.items()))
    return json.dumps(data, indent=1)


def parse_marker(
    text: str, repo_id: str, commit: str, weights: Sequence[str] = ()
) -> dict[str, int | None] | None:
    """The files a completion record lists, or None when it is not one for this commit and
    selection of weights."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("repo_id") != repo_id or data.get("commit") != commit:
        return None
    if data.get("weights", []) != list(weights):
        return None
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        return None
    out: dict[str, int | None] = {}
    for path, size in files.items():
        if not isinstance(path, str) or _unsafe(path):
            return None
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            return None
        out[path] = size
    return out


def _unsafe(path: str) -> bool:
    return not path or path.startswith("/") or any(p in ("", ".", "..") for p in path.split("/"))


# --- progress ---------------------------------------------------------------------------


def bytes_done(sizes: Mapping[str, int | None], done: Mapping[str, int]) -> int:
    """Bytes of ``sizes``' files that have arrived, each capped at its file's size."""
    total = 0
    for path, size in sizes.items():
        got = max(0, done.get(path, 0))
        total += min(got, size) if size is not None else got
    return total


def bytes_total(sizes: Mapping[str, int | None]) -> int | None:
    """The snapshot's size, or None while some file's size is unknown."""
    if any(size is None for size in sizes.values()):
        return None
    return sum(size for size in sizes.values() if size is not None)
