"""A stand-in for SGLang's CPU kernel module, for the tests only. Never in an image.

SGLang 0.5.23 on cpu devices (``--device cpu``, ``SGLANG_USE_CPU_ENGINE=1``) imports a few
ops from ``sgl_kernel``, whose CPU build (``sglang-kernel-cpu``) is compiled from SGLang's
repository and published on no registry these machines reach; the ``sgl-kernel`` wheels on
PyPI are CUDA builds. Plain serving (prefill and decode, no speculative decoding, no
hierarchical cache) calls exactly one of them, :func:`assign_req_to_token_pool_cpu`, here in
plain torch with the semantics of SGLang's Triton kernel beside it
(``sglang/srt/mem_cache/allocation.py``: ``assign_req_to_token_pool``). No model maths is
replaced: attention, matmuls and sampling are SGLang's own torch code.

Every other op SGLang's CPU path imports (speculative decoding's, the hierarchical cache's:
``from sgl_kernel import ...`` at module level, under ``is_cpu()``) is there, and raises
:class:`NotImplementedError` naming itself when called, so a test that reaches one fails
loudly instead of computing something else.
``scripts/setup-sglang`` puts this folder on ``.venv-sglang``'s path (a ``.pth`` file).
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

__all__ = ["assign_req_to_token_pool_cpu"]

__version__ = "0.0.0+tests-stand-in"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the token pool: request ``i``'s
    slots ``start_offset[i]:end_offset[i]`` of row ``req_pool_indices[i]`` take the next
    ``end - start`` entries of ``out_cache_loc`` (the requests' slots, back to back)."""
    del pool_len  # the Triton kernel's row stride; a torch row index needs none
    starts, ends = start_offset.tolist(), end_offset.tolist()
    rows = req_pool_indices.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        count = end - start
        if count > 0:
            req_to_token[row, start:end] = out_cache_loc[taken : taken + count].to(
                req_to_token.dtype
            )
        taken += count


def _missing(name: str) -> Any:
    def op(*args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name}: the tests' stand-in for SGLang's CPU kernels has no version "
            "of this op (only plain serving is supported: no speculative decoding, no "
            "hierarchical cache)"
        )

    op.__name__ = op.__qualname__ = name
    return op


def __getattr__(name: str) -> Any:
    """Any other op SGLang imports (``from sgl_kernel import ...``): one that raises when
    called. Private and dunder names stay missing, as on a real module."""
    if name.startswith("_"):
        raise AttributeError(f"module 'sgl_kernel' has no attribute {name!r}")
    return _missing(name)
