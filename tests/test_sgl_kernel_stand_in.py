"""The tests' stand-in for SGLang's CPU kernel module: its one op does what SGLang's Triton
kernel ``assign_req_to_token_pool`` does, and every other op fails loudly."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.support.repo import ROOT

# Torch is imported by the tests, not at collection: make check collects this module and
# leaves its tests out.
pytestmark = pytest.mark.torch
STAND_IN = ROOT / "tests" / "support" / "sgl_kernel_cpu" / "sgl_kernel" / "__init__.py"


@pytest.fixture(scope="module")
def torch():  # type: ignore[no-untyped-def]
    return pytest.importorskip("torch", reason="the default engine's extra (torch) is needed")


@pytest.fixture(scope="module")
def sgl_kernel():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("sgl_kernel_stand_in", STAND_IN)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sgl_kernel_stand_in", module)
    spec.loader.exec_module(module)
    return module


def test_each_request_writes_its_slots_into_its_row_back_to_back(sgl_kernel, torch) -> None:  # type: ignore[no-untyped-def]
    pool = torch.zeros((4, 8), dtype=torch.int32)
    # Request 0 (row 2) extends tokens 1..3, request 1 (row 0) tokens 0..1, request 2 (row 3)
    # nothing: their new slots come in that order in out_cache_loc.
    sgl_kernel.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0, 3]),
        pool,
        torch.tensor([1, 0, 5]),
        torch.tensor([4, 2, 5]),
        torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64),
        pool.shape[1],
    )
    expected = torch.zeros((4, 8), dtype=torch.int32)
    expected[2, 1:4] = torch.tensor([11, 12, 13], dtype=torch.int32)
    expected[0, 0:2] = torch.tensor([21, 22], dtype=torch.int32)
    assert torch.equal(pool, expected)


def test_every_other_op_raises_naming_itself(sgl_kernel, torch) -> None:  # type: ignore[no-untyped-def]
    op = sgl_kernel.verify_tree_greedy_cpu  # imported by SGLang's CPU path, never called
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.verify_tree_greedy_cpu"):
        op(torch.zeros(1))
    with pytest.raises(AttributeError):
        sgl_kernel.__wrapped__  # noqa: B018 - dunder names stay missing, as on a module
