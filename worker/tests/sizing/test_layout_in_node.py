"""Layouts inside one node: the seed's split (a tensor group over NVLink, a pipeline over
PCIe), else the smallest TP x PP the heads and the node allow."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from tests.support.sizing_figures import SEED_004_LAYOUT_USABLE, in_node_layouts

from sie_worker.config.widths import width_fits_heads
from sie_worker.sizing.arithmetic import GB, Hardware, ModelSize, Shape, Workload, is_power_of_two
from sie_worker.sizing.layout import layout_summary
from sie_worker.sizing.plan import plan, plan_weights_only

ONE_SEQUENCE = Workload(1024, 1)


def _summary(shape: Shape, weights_gb: float, hw: Hardware, work: Workload = ONE_SEQUENCE) -> str:
    return layout_summary(plan(ModelSize(shape, weights_gb * GB), work, hw).layout)


@pytest.mark.parametrize(
    ("weights_gb", "need", "tp", "pp", "line"),
    [
        # Widths 1, 2, 7 suit 14 heads; 7 is wider than the node, so none holds it alone.
        (150, 3, 1, 3, "needs 3 GPU(s) -> PP=3 inside a node"),
        (250, 4, 2, 2, "needs 4 GPU(s) -> TP=2, PP=2 inside a node"),
    ],
)
def test_fourteen_heads_on_a_four_gpu_node_get_the_smallest_split_of_it(
    weights_gb: float, need: int, tp: int, pp: int, line: str
) -> None:
    shape = Shape(layers=40, attention_heads=14, kv_heads=2, head_dim=128)
    result = plan(ModelSize(shape, weights_gb * GB), ONE_SEQUENCE, Hardware(80 * GB, 0.9, 4))
    layout = result.layout
    assert result.min_gpus == need
    assert (layout.tensor_parallel_size, layout.pipeline_parallel_size, layout.nodes) == (tp, pp, 1)
    assert layout_summary(layout) == line
    assert result.width.width == tp * pp
    assert f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {need} GPUs" in (
        result.width.reason
    )
    assert result.pool is not None
    assert (result.pool.gpu_count, result.pool.nodes, result.pool.device_group) == (need, 1, True)
    assert result.replicas_per_node == 4 // need


def test_ten_heads_needing_six_gpus_get_the_smallest_split_not_none() -> None:
    # 10 heads: widths 1, 2, 5; six GPUs as TP=2 x PP=3 (tensor parallel first over NVLink).
    shape = Shape(layers=48, attention_heads=10, kv_heads=10, head_dim=128)
    assert _summary(shape, 400, Hardware(80 * GB, 0.9, 8)) == (
        "needs 6 GPU(s) -> TP=2, PP=3 inside a node"
    )
    # Over PCIe, stages first: PP=8 is a pipeline alone, a power of two as the seed rounds.
    assert _summary(shape, 400, Hardware(80 * GB, 0.9, 8, nvlink=False)) == (
        "needs 6 GPU(s) -> PP=8 (PCIe: communicate once per stage)"
    )


def test_one_kv_head_too_big_to_copy_on_every_gpu_gets_stages() -> None:
    # A tensor split copies the one KV head to every GPU, so no tensor width holds 100 GB of
    # cache; two stages hold half each.
    shape = Shape(layers=32, attention_heads=8, kv_heads=1, head_dim=128)
    work = Workload(context_tokens=400_000, sequences=15)  # 15 x 400k x 16 KiB = 98 GB
    result = plan(ModelSize(shape, 10 * GB), work, Hardware(80 * GB, 0.9, 8))
    assert result.min_gpus == 2
    assert layout_summary(result.layout) == "needs 2 GPU(s) -> PP=2 inside a node, 4 replicas (DP)"


def test_pcie_splits_a_32b_model_over_two_24_gb_cards_by_stages() -> None:
    # Seed 004, Examples 13 and 14: "32B 4.5-bit, 2 x 24 GB PCIe -> PP=2 (PCIe: communicate
    # once per stage)"; NVLink would split it by tensor parallel.
    shape = Shape(layers=64, attention_heads=40, kv_heads=8, head_dim=128)
    weights = 32.8e9 * 4.5 / 8 / GB
    pcie = Hardware(24 * GB, 0.9, 2, nvlink=False)
    result = plan(ModelSize(shape, weights * GB), Workload(8192, 4), pcie)
    assert layout_summary(result.layout) == (
        "needs 2 GPU(s) -> PP=2 (PCIe: communicate once per stage)"
    )
    assert "over PCIe, pipeline_parallel_size 2" in result.width.reason
    nvlink = Hardware(24 * GB, 0.9, 2)
    assert _summary(shape, weights, nvlink, Workload(8192, 4)) == "needs 2 GPU(s) -> TP=2"


def test_pcie_nodes_still_split_by_tensor_inside_and_stages_across() -> None:
    # Seed 004's ChooseLayout puts TP=8 inside each node and PP across nodes whatever the
    # interconnect: a node's GPUs are as joined as they are.
    hw = Hardware(80 * GB, SEED_004_LAYOUT_USABLE, 8, nodes=2, nvlink=False)
    layout = plan_weights_only(405 * GB, hw).layout
    assert layout_summary(layout) == "needs 9 GPU(s) -> TP=8 inside a node, PP=2 across nodes"


def test_more_gpus_than_eight_stages_inside_a_node_of_sixteen() -> None:
    shape = Shape(layers=80, attention_heads=32, kv_heads=8, head_dim=128)
    nvlink, pcie = Hardware(80 * GB, 0.9, 16), Hardware(80 * GB, 0.9, 16, nvlink=False)
    # 12 GPUs: TP=4 x PP=3 over NVLink, TP=2 x PP=6 over PCIe; neither fills the node.
    assert _summary(shape, 800, nvlink) == "needs 12 GPU(s) -> TP=4, PP=3 inside a node"
    assert _summary(shape, 800, pcie) == "needs 12 GPU(s) -> TP=2, PP=6 inside a node"


def test_a_valid_tensor_width_alone_is_kept_over_a_split() -> None:
    # 24 heads needing 3 GPUs: TP=4 as the seed rounds, not TP=1 x PP=3.
    shape = Shape(layers=40, attention_heads=24, kv_heads=8, head_dim=128)
    assert _summary(shape, 150, Hardware(80 * GB, 0.9, 8)) == (
        "needs 3 GPU(s) -> TP=4, 2 replicas (DP)"
    )


_HEADS = [1, 2, 3, 5, 6, 7, 10, 12, 14, 20, 24, 28, 40, 64]


@st.composite
def _models(draw: st.DrawFn) -> tuple[ModelSize, Workload, Hardware]:
    heads = draw(st.sampled_from(_HEADS))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    latent = draw(st.sampled_from([None, None, None, 576]))
    shape = Shape(draw(st.integers(1, 96)), heads, kv, draw(st.sampled_from([64, 128])), latent)
    hw = Hardware(
        draw(st.sampled_from([16 * GB, 24 * GB, 80 * GB])),
        draw(st.sampled_from([0.6, 0.9])),
        draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16])),
        nodes=draw(st.one_of(st.none(), st.integers(1, 4))),
        nvlink=draw(st.booleans()),
    )
    # Weights and cache about 0.05 to 17 GPUs' worth, so most models fit a node.
    usable = hw.gpu_memory_bytes * hw.usable
    weights = usable * draw(st.floats(0.05, 16))
    work = Workload(draw(st.sampled_from([1024, 8192, 32768])), draw(st.integers(1, 32)))
    return ModelSize(shape, weights), work, hw


@given(_models())
def test_a_model_that_fits_a_node_gets_the_smallest_layout_inside_it(
    case: tuple[ModelSize, Workload, Hardware],
) -> None:
    model, work, hw = case
    result = plan(model, work, hw)
    layout, need = result.layout, result.min_gpus
    holding = in_node_layouts(model, work, hw, need)
    if not holding:
        # Nothing inside a node holds it: a group of nodes, or none.
        assert layout.nodes != 1
        return
    tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
    assert tp is not None
    assert pp is not None
    assert layout.nodes == 1
    # TP suits the heads, TP x PP is one block of the node, memory fits (holding says all).
    assert (tp, pp) in holding
    assert width_fits_heads(tp, model.shape.attention_heads, model.shape.kv_heads)
    assert need <= tp * pp <= hw.gpus_per_node
    assert result.width.width == tp * pp
    alone = [(t, p) for t, p in holding if (p == 1 if hw.nvlink else t == 1)]
    if alone:
        # The seed's split: TP alone over NVLink, PP alone over PCIe; the smallest power of
        # two when one holds it (seed 004 rounds up), else the smallest.
        assert (tp, pp) in alone
        widths = {t * p for t, p in alone}
        powers = {w for w in widths if is_power_of_two(w)}
        assert tp * pp == min(powers or widths)
    else:
        # No smaller layout exists; on as many GPUs, TP first over NVLink, PP first over PCIe.
        assert tp * pp == min(t * p for t, p in holding)
        same = [t for t, p in holding if t * p == tp * pp]
        assert tp == (max(same) if hw.nvlink else min(same))
    on_hand = hw.nodes or 1
    assert layout.replicas == on_hand * (hw.gpus_per_node // (tp * pp))
    assert result.pool is not None
    assert (result.pool.gpu_count, result.pool.nodes) == (tp * pp, 1)


def _seed_choose(weights_gb: float, gpu_gb: float, per_node: int, nodes: int, nvlink: bool,
                 moe: bool) -> str:  # fmt: skip
    """Seed 004's ChooseLayout.choose, line for line."""
    total = per_node * nodes
    need = math.ceil(weights_gb / (0.6 * gpu_gb))
    k = 1 if need == 1 else 1 << (need - 1).bit_length()
    if k > total:
        return f"does not fit: {need} GPUs needed, {total} present"
    if k == 1:
        layout = "no split"
    elif k <= per_node:
        layout = f"TP={k}" if nvlink else f"PP={k} (PCIe: communicate once per stage)"
    else:
        layout = f"TP={per_node} inside a node, PP={k // per_node} across nodes"
    if total // k > 1:
        layout += f", {total // k} replicas (DP)"
    if moe and k > 1:
        layout += ", expert parallel for the MoE layers"
    return f"needs {need} GPU(s) -> {layout}"


@given(
    weights_gb=st.floats(1, 640),
    gpu_gb=st.sampled_from([16, 24, 40, 48, 80, 141]),
    per_node=st.sampled_from([1, 2, 4, 8]),
    nodes=st.integers(1, 4),
    nvlink=st.booleans(),
    moe=st.booleans(),
)
def test_inside_a_node_size_prints_seed_004_choose_layout_line(
    weights_gb: float, gpu_gb: int, per_node: int, nodes: int, nvlink: bool, moe: bool
) -> None:
    ratio = weights_gb / (0.6 * gpu_gb)
    assume(abs(ratio - round(ratio)) > 1e-6)  # float ties at a whole GPU
    assume(math.ceil(ratio) <= per_node)  # beyond a node, the GPU count is not rounded
    hw = Hardware(gpu_gb * GB, SEED_004_LAYOUT_USABLE, per_node, nodes=nodes, nvlink=nvlink)
    layout = plan_weights_only(weights_gb * GB, hw, moe=moe).layout
    assert layout_summary(layout) == _seed_choose(weights_gb, gpu_gb, per_node, nodes, nvlink, moe)


@pytest.mark.parametrize("nvlink", [True, False])
def test_a_node_of_one_gpu_never_splits_inside_it(nvlink: bool) -> None:
    shape = Shape(layers=32, attention_heads=32, kv_heads=8, head_dim=128)
    hw = Hardware(80 * GB, 0.9, 1, nvlink=nvlink)
    layout = plan(ModelSize(shape, 100 * GB), ONE_SEQUENCE, hw).layout
    assert layout.nodes == 2
    assert layout_summary(layout) == "needs 2 GPU(s) -> TP=1 inside a node, PP=2 across nodes"
