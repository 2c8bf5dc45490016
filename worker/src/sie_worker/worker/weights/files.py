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

**Trust.** A snapshot is trusted only when its completion record, written by the worker
after every selected file arrived, lists files that are all present with their sizes. A
download that stopped halfway leaves no record, so no later load (offline or not) starts
an engine on half a snapshot.

**Progress.** Bytes done are capped per file at the file's size, so a retried range never
counts twice; the total is unknown until every selected file's size is.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "DEFAULT_REVISION",
    "EXCLUDED_FOLDERS",
    "MARKER_FOLDER",
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
    "marker_text",
    "missing_files",
    "parse_marker",
    "plan_files",
    "repo_folder",
    "weight_files",
]

DEFAULT_REVISION: Final = "main"
MARKER_FOLDER: Final = "sie-complete"  # under models--org--name/, one <commit>.json each
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


def plan_files(repo_files: Iterable[str]) -> FilePlan:
    """The files to fetch from a repo listing. Raises :class:`NoWeights`."""
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


def marker_text(repo_id: str, commit: str, files: Mapping[str, int | None]) -> str:
    return json.dumps(
        {"repo_id": repo_id, "commit": commit, "files": dict(sorted(files.items()))},
        indent=1,
    )


def parse_marker(text: str, repo_id: str, commit: str) -> dict[str, int | None] | None:
    """The files a completion record lists, or None when it is not one for this commit."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("repo_id") != repo_id or data.get("commit") != commit:
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
