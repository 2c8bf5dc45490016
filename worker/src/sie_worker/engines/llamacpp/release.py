"""The llama.cpp release this image builds: the tree ``llama-cpp-python`` 0.3.36 vendors
(``tools/llamacpp.txt``; llama.cpp at commit 0c1e57098, the one seed 004 quotes). The
``llamacpp`` bundle builds the same tree with CUDA. A release is named by its commit:
llama.cpp's own build numbers are not carried by that source."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BUNDLE_VERSIONS", "PINNED_VERSION"]

PINNED_VERSION = "0c1e570"
BUNDLE_VERSIONS: Mapping[str, str] = {"llamacpp": PINNED_VERSION}
