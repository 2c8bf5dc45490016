"""The Hugging Face cache the worker and ``sie-worker fetch`` share: where a snapshot lives,
when it is trusted complete, and how completion is recorded. No network.

- A snapshot is trusted when its completion record (written by this package after every
  file was checked) names files that are all there, or, for a cache prepared with ``hf
  download``, when huggingface_hub's own cached listing of the commit shows every selected
  file present.
- Each selection of weight files has its own record (``SnapshotKey.weights``, an engine's
  own choice such as llama.cpp's GGUF file): one commit fetched for one GGUF file is not
  complete for another.
- The record is written before ``refs/<revision>``, each atomically: a ref never names a
  commit whose record is missing, and a half-written file is never read.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat as statmod
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sie_worker.config.load.model_shape import hf_hub_cache
from sie_worker.worker.weights.files import (
    DEFAULT_REVISION,
    MARKER_FOLDER,
    FilePlan,
    NoWeights,
    index_shards,
    is_commit,
    is_offline,
    marker_name,
    marker_text,
    missing_files,
    parse_marker,
    plan_files,
    repo_folder,
    weight_files,
)

__all__ = [
    "DEFAULT_ENDPOINT",
    "HubSettings",
    "Snapshot",
    "SnapshotKey",
    "cached_snapshot",
    "commit_of",
    "mark_complete",
    "present_files",
    "read_index",
    "repo_path",
]

DEFAULT_ENDPOINT = "https://huggingface.co"


@dataclass(frozen=True)
class HubSettings:
    """Where snapshots live and how the hub is reached, from the environment."""

    cache_dir: Path
    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    offline: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HubSettings:
        endpoint = (env.get("HF_ENDPOINT") or "").strip().rstrip("/") or DEFAULT_ENDPOINT
        token = (env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or "").strip()
        return cls(hf_hub_cache(env), endpoint, token or None, is_offline(env))


@dataclass(frozen=True)
class SnapshotKey:
    """One snapshot: a model repo at a revision (branch, tag or commit), with the weight
    files its engine selects (fnmatch patterns over repo paths; (): the usual choice of one
    weight format, :func:`~sie_worker.worker.weights.files.plan_files`)."""

    repo_id: str
    revision: str = DEFAULT_REVISION
    weights: tuple[str, ...] = ()

    @classmethod
    def of(cls, repo_id: str, revision: str | None, weights: tuple[str, ...] = ()) -> SnapshotKey:
        return cls(repo_id, revision or DEFAULT_REVISION, weights)

    def __str__(self) -> str:
        chosen = f" [{', '.join(self.weights)}]" if self.weights else ""
        return f"{self.repo_id}@{self.revision}{chosen}"


@dataclass(frozen=True)
class Snapshot:
    path: Path  # snapshots/<commit>, what the engine gets as --model-path
    commit: str
    files: Mapping[str, int | None]
    cached: bool  # found complete, nothing downloaded
    downloaded_bytes: int = 0


def repo_path(key: SnapshotKey, hub: HubSettings) -> Path:
    return hub.cache_dir / repo_folder(key.repo_id)


def _read_ref(repo_dir: Path, revision: str) -> str | None:
    if revision.startswith("/") or ".." in revision.split("/"):
        return None
    try:
        commit = (repo_dir / "refs" / revision).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return commit if is_commit(commit) else None


def commit_of(key: SnapshotKey, repo_dir: Path) -> str | None:
    return key.revision if is_commit(key.revision) else _read_ref(repo_dir, key.revision)


def present_files(snapshot_dir: Path, paths: Iterable[str]) -> dict[str, int | None]:
    """Sizes of the files that exist in a snapshot folder (symlinks followed)."""
    found: dict[str, int | None] = {}
    for path in paths:
        try:
            stat = (snapshot_dir / path).stat()
        except OSError:
            continue
        if statmod.S_ISREG(stat.st_mode):
            found[path] = stat.st_size
    return found


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def mark_complete(
    key: SnapshotKey, repo_dir: Path, commit: str, files: Mapping[str, int | None]
) -> None:
    """Record the snapshot as complete, then point ``refs/<revision>`` at it (in that
    order: a ref never names a commit whose record is missing)."""
    _write_atomic(
        repo_dir / MARKER_FOLDER / marker_name(commit, key.weights),
        marker_text(key.repo_id, commit, files, key.weights),
    )
    if not is_commit(key.revision) and _read_ref(repo_dir, key.revision) != commit:
        _write_atomic(repo_dir / "refs" / key.revision, commit)


def cached_snapshot(key: SnapshotKey, hub: HubSettings) -> Snapshot | None:
    """The snapshot of ``key`` when it is complete in the cache, else None. No network."""
    repo_dir = repo_path(key, hub)
    commit = commit_of(key, repo_dir)
    if commit is None:
        return None
    snapshot_dir = repo_dir / "snapshots" / commit
    try:
        marker_file = repo_dir / MARKER_FOLDER / marker_name(commit, key.weights)
        marker = marker_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        files = _files_from_hub_listing(key, hub, commit, snapshot_dir)
        if files is None:
            return None
        with contextlib.suppress(OSError):  # a read-only cache stays usable
            mark_complete(key, repo_dir, commit, files)
        return Snapshot(snapshot_dir, commit, files, cached=True)
    files = parse_marker(marker, key.repo_id, commit, key.weights)
    if files is None or missing_files(files, present_files(snapshot_dir, files)):
        return None
    return Snapshot(snapshot_dir, commit, files, cached=True)


def _files_from_hub_listing(
    key: SnapshotKey, hub: HubSettings, commit: str, snapshot_dir: Path
) -> dict[str, int | None] | None:
    """The selected files of a snapshot huggingface_hub itself fetched completely (``hf
    download`` caches the commit's listing), or None when that cannot be shown."""
    from huggingface_hub import get_cached_repo_tree

    try:
        tree = get_cached_repo_tree(key.repo_id, revision=commit, cache_dir=hub.cache_dir)
    except Exception:  # no listing cached, or an older cache layout: not provable
        return None
    sizes: dict[str, int | None] = {f.path: f.size for f in tree}
    try:
        plan = plan_files(sizes, key.weights)
        shards = read_index(snapshot_dir, plan) if plan.index else frozenset[str]()
        wanted = (*plan.support, *weight_files(plan, sizes, shards))
    except (NoWeights, OSError, ValueError):
        return None
    files = {f: sizes[f] for f in wanted}
    return None if missing_files(files, present_files(snapshot_dir, files)) else files


def read_index(snapshot_dir: Path, plan: FilePlan) -> frozenset[str]:
    assert plan.index is not None
    return index_shards(json.loads((snapshot_dir / plan.index).read_text(encoding="utf-8")))
