"""Which SGLang release the engine runs, and how that release spells the flags that moved.

Found without importing SGLang: ``SIE_SGLANG_VERSION`` when set, else the release the
worker's bundle (``SIE_BUNDLE``) pins (``sglang-cu130`` -> 0.5.23, ``sglang`` ->
0.5.10.post1), so ``sie-worker plan`` shows what that bundle's image would run; else (the
``default`` bundle) the installed distribution's metadata, else the release this project
pins (0.5.23). In an image the installed release agrees with its bundle's;
:func:`release_mismatch` says when it does not (the worker logs it at start).

The ``sglang`` bundle runs 0.5.10.post1, the newest release before the 0.5.20 flag rename
that PyPI serves with CUDA 12 dependencies (0.5.11 and later pull CUDA 13 torch; 0.5.18 and
0.5.19 also pin a stub package whose wheel lives outside PyPI).

Spellings were checked against the real parsers of SGLang 0.5.10.post1 and 0.5.23 (and the
option table of 0.5.19, which an earlier ``sglang`` bundle ran):

- the prefill CUDA graph switch is ``--disable-piecewise-cuda-graph`` before 0.5.20 and
  ``--disable-prefill-cuda-graph`` from 0.5.20 (0.5.23 has no piecewise flag at all;
  0.5.10.post1 has only the piecewise one, and captures piecewise graphs by default);
- ``--disable-cuda-graph`` is deprecated in 0.5.19 and 0.5.23 in favour of
  ``--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled``; releases
  before 0.5.19 get the older flag (0.5.10.post1 has no ``--cuda-graph-backend-*`` flags).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache

from sie_worker.config.flags.engine_release import Releases, distribution_version

__all__ = [
    "BUNDLE_VERSIONS",
    "PINNED_VERSION",
    "disable_cuda_graph_args",
    "engine_version",
    "installed_version",
    "prefill_graph_flag",
    "release_mismatch",
    "version_key",
]

PINNED_VERSION = "0.5.23"
BUNDLE_VERSIONS: Mapping[str, str] = {"sglang-cu130": "0.5.23", "sglang": "0.5.10.post1"}
_PREFILL_RENAMED = (0, 5, 20)
_GRAPH_BACKENDS = (0, 5, 19)


_RELEASES = Releases("SGLang", "SIE_SGLANG_VERSION", BUNDLE_VERSIONS, PINNED_VERSION)


@cache
def installed_version() -> str | None:
    """The installed SGLang distribution's version, read from metadata (no import)."""
    return distribution_version("sglang")


def engine_version(bundle: str, env: Mapping[str, str] | None = None) -> str:
    """The SGLang release the engine will run (see the module docstring for the order)."""
    return _RELEASES.version(bundle, env, installed_version)


def release_mismatch(bundle: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why the installed SGLang differs from the release the worker plans for, or None."""
    return _RELEASES.mismatch(bundle, env, installed_version)


def version_key(text: str) -> tuple[int, int, int]:
    """``0.5.20.post1`` -> (0, 5, 20); missing parts count as 0."""
    numbers = [int(n) for n in re.findall(r"\d+", text.split("+", 1)[0])[:3]]
    numbers += [0] * (3 - len(numbers))
    return numbers[0], numbers[1], numbers[2]


def prefill_graph_flag(sglang: str) -> str:
    """The flag that turns off only the prefill (formerly piecewise) CUDA graph capture."""
    if version_key(sglang) >= _PREFILL_RENAMED:
        return "--disable-prefill-cuda-graph"
    return "--disable-piecewise-cuda-graph"


def disable_cuda_graph_args(sglang: str) -> tuple[str, ...]:
    """The arguments that turn CUDA graphs off entirely, as this release prefers them."""
    if version_key(sglang) >= _GRAPH_BACKENDS:
        return (
            "--cuda-graph-backend-decode",
            "disabled",
            "--cuda-graph-backend-prefill",
            "disabled",
        )
    return ("--disable-cuda-graph",)
