"""``sie-worker fetch [FILE|DIR ...] [--models ID,...]``: put models' weights in the cache.

Fetches the snapshot of every model config named (a folder stands for the configs under
it; none named: $SIE_CONFIG_DIR) into the Hugging Face cache (HF_HUB_CACHE, else
$HF_HOME/hub) exactly as a worker does before it starts an engine: the same files (configs,
tokenizer, one copy of the weights, or the file the engine selects: llama.cpp's
``gguf_file``), the same revision (``revision``/``hf_revision``), from
HF_ENDPOINT with HF_TOKEN. Models with a local model_path are skipped, and profiles of one
config that select the same weights share one snapshot. A profile without adapter_path runs
the default adapter of SIE_BUNDLE's engine, as on the worker.

Idempotent: a snapshot already complete in the cache is not fetched again and needs no
network (--refresh asks the hub whether the revision moved). Resumable: a dropped
connection resumes from where it stopped, and a run that was interrupted or failed leaves
its complete files, so the next run fetches only the rest; a snapshot counts as complete
only once every file arrived, so a worker never starts from half of one.

Progress: a bar per snapshot on a terminal, else a line every 10 seconds. Exit 0 when every
snapshot is complete; exit 1 naming each model that failed and why (401: gated or private,
404: no such repo or revision, network errors); exit 2 for bad arguments; 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sie_worker.config.files.reader import config_files, load_config_file
from sie_worker.config.lora import lora_adapters
from sie_worker.config.model import ModelConfig, served_models
from sie_worker.errors import InvalidConfig, Problem
from sie_worker.settings import Settings
from sie_worker.worker.weights.cache import HubSettings, Snapshot, SnapshotKey
from sie_worker.worker.weights.download import fetch_snapshot
from sie_worker.worker.weights.hub_errors import DownloadFailed
from sie_worker.worker.weights.model_key import model_key
from sie_worker.worker.weights.progress import Progress

__all__ = ["register", "run"]

_STATUS_EVERY_S = 10.0
_POLL_S = 0.2


class _ArgumentError(Exception):
    """Bad arguments: printed as ``sie-worker fetch: <message>``, exit 2."""


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "fetch",
        help="download models' weights into the Hugging Face cache (prefetch)",
        description=__doc__.split("\n\n", 1)[1].replace("``", "") if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Environment: HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE "
        "(then only checks the cache), SIE_CONFIG_DIR, SIE_BUNDLE.",
    )
    parser.add_argument(
        "paths", nargs="*", metavar="FILE|DIR", type=Path, help="model config files or folders"
    )
    parser.add_argument(
        "--models",
        metavar="ID,...",
        help="only these served models (sie_id, or sie_id:profile)",
    )
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="resolve each revision on the hub even when it is complete in the cache",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar or status lines"
    )
    parser.set_defaults(func=run)


@dataclass
class _Target:
    key: SnapshotKey
    models: list[str] = field(default_factory=list)


def run(args: argparse.Namespace) -> int:
    try:
        configs = _configs(args.paths)
        targets, skipped = _targets(configs, args.models)
    except _ArgumentError as exc:
        print(f"sie-worker fetch: {exc}", file=sys.stderr)
        return 2
    except InvalidConfig as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    for model in skipped:
        print(f"{model}: local model_path, nothing to fetch", file=sys.stderr)
    hub = HubSettings.from_env(os.environ)
    failures: list[tuple[_Target, str]] = []
    for target in targets:
        try:
            snapshot, seconds = _fetch(target, hub, args.refresh, not args.no_progress)
        except DownloadFailed as exc:
            failures.append((target, exc.message))
            print(f"sie-worker fetch: {exc.message}", file=sys.stderr)
            continue
        except KeyboardInterrupt:
            print(
                f"sie-worker fetch: interrupted during {target.key}; run it again to resume",
                file=sys.stderr,
            )
            return 130
        print(_summary(target, snapshot, seconds))
    if failures:
        names = ", ".join(", ".join(t.models) for t, _ in failures)
        print(
            f"sie-worker fetch: {len(failures)} of {len(targets)} snapshot(s) failed: {names}",
            file=sys.stderr,
        )
        return 1
    return 0


def _configs(paths: Sequence[Path]) -> list[ModelConfig]:
    if not paths:
        folder = os.environ.get("SIE_CONFIG_DIR", "").strip()
        if not folder:
            raise _ArgumentError("name model config files or folders, or set SIE_CONFIG_DIR")
        paths = [Path(folder)]
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += config_files(path)
        elif path.exists():
            files.append(path)
        else:
            raise _ArgumentError(f"{path}: no such file or folder")
    problems: list[Problem] = []
    configs: list[ModelConfig] = []
    for file in files:
        try:
            configs.append(load_config_file(file))
        except InvalidConfig as exc:
            problems += exc.problems
    if problems:
        raise InvalidConfig(problems)
    return configs


def _targets(configs: Sequence[ModelConfig], wanted: str | None) -> tuple[list[_Target], list[str]]:
    """Snapshots to fetch (one per repo and revision, with the models using it), and the
    models skipped for their local model_path."""
    served = {s.id: s for c in configs for s in served_models(c)}
    chosen = list(served)
    if wanted is not None:
        chosen = list(dict.fromkeys(m.strip() for m in wanted.split(",") if m.strip()))
        unknown = [m for m in chosen if m not in served]
        if unknown:
            known = ", ".join(sorted(served)) or "none"
            raise _ArgumentError(
                f"--models names {', '.join(unknown)}, which no config here serves; known: {known}"
            )
    targets: dict[SnapshotKey, _Target] = {}
    skipped: list[str] = []
    # Only the bundle matters here (the engine of a profile without adapter_path); the
    # worker's devices are not read, so a prefetch container needs none of them.
    settings = Settings(bundle=os.environ.get("SIE_BUNDLE", "").strip() or "default")
    for model in chosen:
        config = served[model].config
        # A profile's LoRA adapters from the hub are fetched with it.
        for lora in lora_adapters(served[model].profile.loadtime):
            if not lora.local:
                key = SnapshotKey.of(lora.source, lora.revision)
                targets.setdefault(key, _Target(key)).models.append(f"{model}:{lora.name}")
        if config.model_path is not None:
            skipped.append(model)
            continue
        key = model_key(served[model], settings)
        targets.setdefault(key, _Target(key)).models.append(model)
    order = sorted(targets.values(), key=lambda t: (t.key.repo_id, t.key.revision, t.key.weights))
    return order, skipped


def _fetch(target: _Target, hub: HubSettings, refresh: bool, show: bool) -> tuple[Snapshot, float]:
    """Fetch in a thread while this one reports progress; Ctrl-C stops the download."""
    progress, cancel = Progress(), threading.Event()
    started = time.monotonic()
    with ThreadPoolExecutor(1, "sie-fetch-main") as pool:
        future = pool.submit(fetch_snapshot, target.key, hub, progress, cancel, refresh=refresh)
        try:
            _report(target, future, progress, sys.stderr if show else None)
            snapshot = future.result()
        except BaseException:
            cancel.set()
            while not future.done():  # the download's threads stop at their next chunk
                time.sleep(_POLL_S)
            raise
    return snapshot, time.monotonic() - started


def _report(
    target: _Target, future: Future[Snapshot], progress: Progress, out: TextIO | None
) -> None:
    if out is None:
        future.exception()
        return
    if out.isatty():
        from tqdm import tqdm

        with tqdm(
            desc=str(target.key),
            total=None,
            unit="B",
            unit_scale=True,
            file=out,
            leave=True,
            dynamic_ncols=True,
        ) as bar:
            while not _wait(future):
                _update(bar, progress)
            _update(bar, progress)
        return
    last = time.monotonic()
    while not _wait(future):
        if time.monotonic() - last >= _STATUS_EVERY_S:
            last = time.monotonic()
            print(f"{target.key}: {_amount(progress)}", file=out, flush=True)


def _wait(future: Future[Snapshot]) -> bool:
    try:
        future.exception(timeout=_POLL_S)
    except TimeoutError:
        return False
    return True


def _update(bar: Any, progress: Progress) -> None:
    total = progress.total
    if total is not None and bar.total != total:
        bar.total = total
    bar.update(progress.done - bar.n)


def _amount(progress: Progress) -> str:
    done, total = progress.done, progress.total
    if total:
        return f"{done / 1e9:.2f} of {total / 1e9:.2f} GB ({100 * done / total:.0f}%)"
    return f"{done / 1e9:.2f} GB"


def _summary(target: _Target, snapshot: Snapshot, seconds: float) -> str:
    size = sum(s or 0 for s in snapshot.files.values())
    models = ", ".join(target.models)
    if snapshot.cached:
        how = "already complete in the cache"
    else:
        rate = snapshot.downloaded_bytes / seconds / 1e6 if seconds > 0 else 0.0
        got = snapshot.downloaded_bytes / 1e9
        how = f"downloaded {got:.2f} GB in {seconds:.1f} s ({rate:.0f} MB/s)"
    return (
        f"{target.key} ({models}): {len(snapshot.files)} files, {size / 1e9:.2f} GB, {how}: "
        f"{snapshot.path}"
    )
