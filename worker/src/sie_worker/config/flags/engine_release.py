"""Which release of an engine a worker plans for: the rule SGLang's and vLLM's releases share.

Found without importing the engine: the engine's override variable when set
(``SIE_SGLANG_VERSION``, ``SIE_VLLM_VERSION``), else the release the worker's bundle
(``SIE_BUNDLE``) pins, so ``sie-worker plan`` shows what that bundle's image would run; else
the installed distribution's metadata, else the release this project pins. In an image the
installed release agrees with its bundle's; :meth:`Releases.mismatch` says when it does not
(the worker logs it at start).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

__all__ = ["Releases", "distribution_version"]


def distribution_version(*names: str) -> str | None:
    """The version of the first installed distribution of ``names`` (metadata, no import)."""
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


@dataclass(frozen=True)
class Releases:
    label: str  # "SGLang", "vLLM"
    variable: str  # the override: SIE_SGLANG_VERSION, SIE_VLLM_VERSION
    bundles: Mapping[str, str]  # bundle -> the release its image installs
    pinned: str  # this project's release when nothing else says

    def version(
        self, bundle: str, env: Mapping[str, str] | None, installed: Callable[[], str | None]
    ) -> str:
        """The release the engine will run (see the module docstring for the order)."""
        environ = os.environ if env is None else env
        declared = environ.get(self.variable, "").strip()
        if declared:
            return declared
        if bundle in self.bundles:
            return self.bundles[bundle]
        return installed() or self.pinned

    def mismatch(
        self, bundle: str, env: Mapping[str, str] | None, installed: Callable[[], str | None]
    ) -> str | None:
        """Why the installed release differs from the one the worker plans for, or None."""
        found = installed()
        planned = self.version(bundle, env, installed)
        if found is None or found == planned:
            return None
        source = (
            self.variable
            if (os.environ if env is None else env).get(self.variable, "").strip()
            else f"SIE_BUNDLE={bundle}"
        )
        return (
            f"{self.label} {found} is installed but engine command lines are built for "
            f"{self.label} {planned} ({source}); flags that differ between the two may be "
            f"refused by the engine: set SIE_BUNDLE to the bundle of this image, or "
            f"{self.variable}"
        )
