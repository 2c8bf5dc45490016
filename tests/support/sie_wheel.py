"""SIE's released server wheel, read as data: its model catalogue and adapter code.

``sie_server_wheel()`` downloads ``sie-server==0.10.1`` with pip (``pip download --no-deps
--python-version 3.12 --only-binary=:all:``, the wheel is pure Python) into the user's cache
(``$XDG_CACHE_HOME/sie-workers/wheels``, else ``~/.cache/...``; never the repository) once,
and reuses it afterwards. When the registry cannot be reached the caller's test is skipped
with a message saying so; any other failure fails it. ``catalogue_dir()`` unpacks the
wheel's ``sie_server/models/*.yaml`` beside it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

__all__ = ["SIE_SERVER_VERSION", "cache_dir", "catalogue_dir", "sie_server_wheel"]

SIE_SERVER_VERSION = "0.10.1"
_WHEEL = f"sie_server-{SIE_SERVER_VERSION}-py3-none-any.whl"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sie-workers" / "wheels"


def _registry_reachable() -> tuple[bool, str]:
    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    parts = urlsplit(index)
    host = parts.hostname or "pypi.org"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=10):
            return True, index
    except OSError as exc:
        return False, f"{index} ({host}:{port}: {exc})"


def sie_server_wheel() -> Path:
    """The cached wheel, downloaded first when missing (skips the test when PyPI is down)."""
    target = cache_dir() / _WHEEL
    if target.is_file():
        return target
    reachable, where = _registry_reachable()
    if not reachable:
        pytest.skip(
            f"the package registry is unreachable, so sie-server=={SIE_SERVER_VERSION} "
            f"cannot be downloaded: {where}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        done = subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                "--python-version", "3.12", "--only-binary=:all:",
                f"sie-server=={SIE_SERVER_VERSION}", "-d", tmp,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )  # fmt: skip
        downloaded = Path(tmp) / _WHEEL
        if done.returncode != 0 or not downloaded.is_file():
            reachable, where = _registry_reachable()
            if not reachable:
                pytest.skip(f"the package registry became unreachable: {where}")
            pytest.fail(
                f"pip download sie-server=={SIE_SERVER_VERSION} failed:\n{done.stderr[-2000:]}",
                pytrace=False,
            )
        os.replace(downloaded, target)  # atomic: a concurrent run sees a whole file or none
    return target


def catalogue_dir() -> Path:
    """SIE's model configs (``sie_server/models/*.yaml``), unpacked next to the wheel."""
    wheel = sie_server_wheel()
    target = wheel.parent / f"sie-server-{SIE_SERVER_VERSION}-models"
    if target.is_dir():
        return target
    with tempfile.TemporaryDirectory(dir=wheel.parent) as tmp, zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("sie_server/models/") and name.endswith(".yaml"):
                (Path(tmp) / Path(name).name).write_bytes(archive.read(name))
        staged = Path(tmp) / "models"
        staged.mkdir()
        for file in Path(tmp).glob("*.yaml"):
            shutil.move(file, staged / file.name)
        try:
            os.replace(staged, target)
        except OSError:
            if not target.is_dir():  # another run won the race; anything else is a failure
                raise
    return target
