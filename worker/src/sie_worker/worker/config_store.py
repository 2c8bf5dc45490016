"""Config API storage: model configs as files in the config dir, written atomically.

A config with ``sie_id: org/name`` lives in the file it was read from, or, when new, in
``<config-dir>/org/name.yaml``. Writes go to a hidden temp file in the same folder, are
fsynced and renamed over the target, so a reader (or a worker restarted after SIGKILL)
sees the old file or the new one, never a part. Hidden files are never read as configs;
leftover temp files are removed at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import yaml

from sie_worker.config.files.reader import MAX_CONFIG_BYTES, parse_config, parse_config_text
from sie_worker.config.files.yamldoc import MAX_DEPTH
from sie_worker.config.model import ModelConfig
from sie_worker.errors import Forbidden, InvalidConfig, InvalidRequest, Problem, UnknownModel
from sie_worker.settings import ConfigApiMode

__all__ = ["ConfigStore", "parse_body", "plain"]

_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_TEMP_SUFFIX = ".sie-tmp"
_SOURCE = "<request>"


class ConfigStore:
    def __init__(self, directory: Path | None, mode: ConfigApiMode) -> None:
        self.directory = directory
        self.mode = mode
        self.paths: dict[str, Path] = {}
        self._lock = asyncio.Lock()

    def remember(self, configs: dict[str, ModelConfig]) -> None:
        """Record which file each config was read from."""
        for sie_id, config in configs.items():
            if config.source:
                self.paths[sie_id] = Path(config.source)

    def remove_stale_temp_files(self) -> list[Path]:
        if self.directory is None or not self.directory.is_dir():
            return []
        removed = []
        for path in self.directory.rglob(f".*{_TEMP_SUFFIX}"):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
        return removed

    def check_readable(self) -> None:
        if self.mode == "disabled":
            raise Forbidden("the Config API is disabled on this worker (SIE_CONFIG_API=disabled)")

    def check_writable(self) -> None:
        self.check_readable()
        if self.mode == "read-only":
            raise Forbidden(
                "the Config API is read-only on this worker (SIE_CONFIG_API=read-only); "
                "change the model configs where they come from (e.g. the chart's `models`)"
            )
        if self.directory is None:
            raise Forbidden("this worker has no config dir; start it with --config-dir DIR")

    async def write(self, sie_id: str, config: ModelConfig, body: bytes, media: str) -> bool:
        """Write the config for ``sie_id``; True when it is new."""
        self.check_writable()
        assert self.directory is not None
        if config.sie_id != sie_id:
            raise InvalidConfig(
                [
                    Problem(
                        "$.sie_id",
                        f"is {config.sie_id!r} but the URL names {sie_id!r}; they must match",
                        _SOURCE,
                    )
                ]
            )
        async with self._lock:
            target = self.paths.get(sie_id) or self.path_for(sie_id)
            text = body if media == "yaml" else _as_yaml(config.raw)
            await anyio.to_thread.run_sync(_atomic_write, target, text)
            created = sie_id not in self.paths
            self.paths[sie_id] = target
        return created

    async def delete(self, sie_id: str) -> None:
        self.check_writable()
        async with self._lock:
            path = self.paths.get(sie_id)
            if path is None:
                raise UnknownModel(f"no config with id {sie_id!r}")
            await anyio.to_thread.run_sync(_unlink, path)
            del self.paths[sie_id]

    def path_for(self, sie_id: str) -> Path:
        """The file a new config with this id goes to; refuses ids that would escape the dir."""
        assert self.directory is not None
        segments = sie_id.split("/")
        if (
            not sie_id
            or len(sie_id) > 200
            or "\x00" in sie_id
            or any(not _SEGMENT.match(s) for s in segments)
        ):
            raise InvalidRequest(
                f"config id {sie_id!r} cannot name a file: use letters, digits, '.', '_' and "
                "'-' in '/'-separated parts that do not start with '.' (no '..', ':' or "
                "absolute paths)"
            )
        root = self.directory.resolve()
        target = (root / (sie_id + ".yaml")).resolve()
        if not target.is_relative_to(root):
            raise InvalidRequest(f"config id {sie_id!r} would escape the config dir")
        return target


def parse_body(
    body: bytes, content_type: str, *, base_dir: Path | None = None
) -> tuple[ModelConfig, str]:
    """Parse a Config API body (YAML or JSON) with the same checks as a file; return the
    config and which it was. ``base_dir`` is where a relative ``model_path`` resolves."""
    # The size limit of config files: a config the API accepts must also load at start.
    if len(body) > MAX_CONFIG_BYTES:
        message = f"is larger than {MAX_CONFIG_BYTES} bytes; a model config is a few lines"
        raise InvalidConfig([Problem("$", message, _SOURCE)])
    if "json" not in content_type.lower():
        return parse_config_text(body, source=_SOURCE, base_dir=base_dir), "yaml"
    try:
        data: Any = json.loads(body)
    except RecursionError:  # not a ValueError: it would be an internal error (500)
        message = f"is nested too deeply; a model config needs < {MAX_DEPTH} levels"
        raise InvalidConfig([Problem("$", message, _SOURCE)]) from None
    except (ValueError, UnicodeDecodeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidConfig(
            [Problem("$", f"the body is not valid JSON ({detail})", _SOURCE)]
        ) from None
    return parse_config(data, source=_SOURCE, base_dir=base_dir), "json"


def plain(document: Any) -> Any:
    """The config document as plain dicts and lists (configs are kept frozen in memory)."""
    if isinstance(document, Mapping):
        return {str(k): plain(v) for k, v in document.items()}
    if isinstance(document, list | tuple):
        return [plain(v) for v in document]
    return document


def _as_yaml(document: Any) -> bytes:
    return yaml.safe_dump(plain(document), sort_keys=False, allow_unicode=True).encode()


def _atomic_write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=_TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_dir(target.parent)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
