from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.sizing_figures import (
    H100,
    SEED_004_LAYOUT_USABLE,
    SEED_004_LAYOUTS,
    SEED_004_USERS,
    in_node_layouts,
    llama_size,
)

from sie_worker.config.widths import valid_widths, width_fits, width_fits_heads
from sie_worker.sizing.arithmetic import (
    GB,
    Hardware,
    ModelSize,
    Shape,
    Workload,
    fits_width,
    usable_bytes,
)
from sie_worker.sizing.layout import MAX_PIPELINE, Layout, layout_summary
from sie_worker.sizing.plan import Plan, plan, plan_weights_only


@pytest.mark.parametrize("row", SEED_004_LAYOUTS, ids=[row[0] for row in SEED_004_LAYOUTS])
def test_layout_reproduces_seed_004_example_14_choosing_a_layout(row: tuple[Any, ...]) -> None:
    """Seed 004, Example 14 ("choosing a layout"): each of ChooseLayout's six setups, sized by
    its weights at the 60% rule, prints the seed's line and the figures in it."""
    _, weights, gpu, per_node, nodes, nvlink, moe, line, need, tp, pp, span, dp, ep = row
    hardware = Hardware(gpu * GB, SEED_004_LAYOUT_USABLE, per_node, nodes=nodes, nvlink=nvlink)
    layout = plan_weights_only(weights * GB, hardware, moe=moe).layout
    assert layout_summary(layout) == line
    assert layout.gpus_needed == need
    assert (layout.tensor_parallel_size, layout.pipeline_parallel_size) == (tp, pp)
    assert (layout.nodes, layout.replicas, layout.expert_parallel) == (span, dp, ep)


def test_405b_fp8_on_one_node_without_nodes_gets_the_group_it_needs() -> None:
    # The seed's last setup, with the nodes left to size: the 2-node layout, not "none".
    result = plan_weights_only(405 * GB, Hardware(80 * GB, SEED_004_LAYOUT_USABLE, 8))
    layout = result.layout
    assert layout_summary(layout) == "needs 9 GPU(s) -> TP=8 inside a node, PP=2 across nodes"
    assert (layout.width, layout.gpus_per_rank, layout.nodes) == (16, 8, 2)
    assert result.width.width == 16
    assert result.pool is not None
    assert (result.pool.gpu_count, result.pool.nodes, result.pool.device_group) == (8, 2, True)
    assert result.replicas_per_node is None


def test_nodes_fewer_than_the_group_name_the_nodes_that_hold_it() -> None:
    result = plan_weights_only(405 * GB, Hardware(80 * GB, 0.6, 8, nodes=1))
    assert result.width.width is None
    assert result.pool is None
    assert "--nodes 2 holds it (TP=8 inside a node, PP=2 across nodes)" in result.width.reason


def test_spare_nodes_hold_replicas_of_the_group() -> None:
    layout = plan_weights_only(405 * GB, Hardware(80 * GB, 0.6, 8, nodes=5)).layout
    assert layout_summary(layout) == (
        "needs 9 GPU(s) -> TP=8 inside a node, PP=2 across nodes, 2 replicas (DP)"
    )


def test_405b_bf16_with_its_kv_cache_is_tp_8_by_pp_2() -> None:
    # Seed 004's "why split" row: 945.3 GB need 14 GPUs at 90%, more than a node of 8.
    result = plan(llama_size("405B", 16), SEED_004_USERS, H100)
    assert result.min_gpus == 14
    assert (result.layout.tensor_parallel_size, result.layout.pipeline_parallel_size) == (8, 2)
    assert result.width.width == 16
    assert "pipeline_parallel_size 2" in result.width.reason
    assert result.concurrency_per_replica is not None
    assert result.concurrency_per_replica >= SEED_004_USERS.sequences
    assert result.pool is not None
    assert (result.pool.gpu_count, result.pool.nodes) == (8, 2)


def test_four_gpu_nodes_split_a_model_of_eight_into_two_stages() -> None:
    # Seed 004, Example 13: "-tp 4 -pp 2 ... the layout for two servers of 4 GPUs".
    result = plan(llama_size("405B", 8), SEED_004_USERS, Hardware(80 * GB, 0.9, 4))
    assert layout_summary(result.layout) == (
        "needs 8 GPU(s) -> TP=4 inside a node, PP=2 across nodes"
    )


def test_a_narrower_tensor_width_fills_the_node_with_stages() -> None:
    # 14 heads: widths 1, 2, 7; only 1 and 2 divide an 8-GPU node, so 4 stages per node.
    shape = Shape(layers=48, attention_heads=14, kv_heads=2, head_dim=128)
    model = ModelSize(shape, 700 * GB)
    layout = plan(model, Workload(1024, 1), H100).layout
    assert (layout.tensor_parallel_size, layout.pipeline_parallel_size, layout.nodes) == (2, 8, 2)
    assert layout_summary(layout) == (
        "needs 10 GPU(s) -> TP=2 inside a node, PP=8 (4 per node) across 2 nodes"
    )


def test_too_big_for_eight_stages_says_so_and_proposes_no_pool() -> None:
    result = plan_weights_only(5000 * GB, H100)
    assert result.width.width is None
    assert result.pool is None
    assert "up to 8 pipeline stages" in result.width.reason
    assert layout_summary(result.layout) == "none: needs 70 GPU(s), see width"


_SHAPES = st.builds(
    lambda layers, heads, kv_div, head_dim, latent: Shape(
        layers, heads, heads // kv_div if heads % kv_div == 0 else heads, head_dim, latent
    ),
    layers=st.integers(1, 128),
    heads=st.sampled_from([1, 2, 3, 4, 6, 7, 8, 12, 14, 16, 24, 28, 32, 40, 64, 96, 128]),
    kv_div=st.sampled_from([1, 2, 4, 8, 16]),
    head_dim=st.sampled_from([64, 128]),
    latent=st.sampled_from([None, None, 576]),
)
_HARDWARE = st.builds(
    Hardware,
    gpu_memory_bytes=st.sampled_from([16 * GB, 24 * GB, 80 * GB, 141 * GB]),
    usable=st.sampled_from([0.6, 0.9]),
    gpus_per_node=st.sampled_from([1, 2, 3, 4, 6, 8, 16]),
    nodes=st.one_of(st.none(), st.integers(1, 8)),
    nvlink=st.booleans(),
)


def _fits(model: ModelSize, work: Workload, hw: Hardware, tp: int, pp: int) -> bool:
    tokens = work.context_tokens * work.sequences
    return fits_width(model, tp, tokens, usable_bytes(hw.gpu_memory_bytes, hw.usable), pipeline=pp)


def _fitting(
    model: ModelSize, work: Workload, hw: Hardware, needed: int, most_nodes: int
) -> list[tuple[int, int]]:
    """Every (TP, PP) on at most ``most_nodes`` nodes, TP dividing a node and suiting the heads,
    PP a whole number of stages per node up to 8 (and the layers), that holds the model."""
    per_node, shape = hw.gpus_per_node, model.shape
    found = []
    for tp in valid_widths(shape.attention_heads, shape.kv_heads):
        if per_node % tp or not width_fits(tp, per_node):
            continue
        for n in range(1, most_nodes + 1):
            pp = n * (per_node // tp)
            if pp <= min(MAX_PIPELINE, shape.layers) and tp * pp >= needed:
                found += [(tp, pp)] if _fits(model, work, hw, tp, pp) else []
    return found


def _check_layout(layout: Layout, result: Plan, hw: Hardware, layers: int | None) -> None:
    tp, pp, nodes = layout.tensor_parallel_size, layout.pipeline_parallel_size, layout.nodes
    assert tp is not None
    assert pp is not None
    assert nodes is not None
    width = tp * pp
    assert result.width.width == width
    assert width >= result.min_gpus
    assert 1 <= pp <= MAX_PIPELINE
    assert layers is None or pp <= layers
    # A contiguous block on each node: width / nodes GPUs from cuda:0.
    assert width % nodes == 0
    assert width_fits(width // nodes, hw.gpus_per_node)
    assert layout.gpus_per_rank == width // nodes
    if nodes > 1:
        # A group: TP inside a node, dividing it; the node's GPUs all run stages.
        assert hw.gpus_per_node % tp == 0
        assert pp == nodes * (hw.gpus_per_node // tp)
        if tp == hw.gpus_per_node:
            assert pp == nodes
    if hw.nodes is not None:
        assert nodes <= hw.nodes
        assert layout.replicas == (
            hw.nodes // nodes if nodes > 1 else hw.nodes * (hw.gpus_per_node // width)
        )
    assert result.pool is not None
    assert (result.pool.gpu_count, result.pool.nodes) == (width // nodes, nodes)
    assert result.pool.device_group == (width > 1)


@given(
    shape=_SHAPES,
    weights_gb=st.floats(0.5, 3000),
    context=st.sampled_from([1024, 8192, 32768]),
    sequences=st.integers(1, 64),
    hw=_HARDWARE,
)
def test_layout_choice_keeps_every_rule(
    shape: Shape, weights_gb: float, context: int, sequences: int, hw: Hardware
) -> None:
    model, work = ModelSize(shape, weights_gb * GB), Workload(context, sequences)
    result = plan(model, work, hw)
    layout = result.layout
    assert result.width.width == layout.width
    if layout.width is None:
        assert result.pool is None
        if layout.nodes_short is not None:
            assert hw.nodes is not None
            assert hw.nodes < layout.nodes_short
        else:
            # No layout inside a node holds it, nor a tensor width dividing a node with up to
            # 8 stages on a group of nodes.
            assert in_node_layouts(model, work, hw, result.min_gpus) == []
            assert _fitting(model, work, hw, result.min_gpus, MAX_PIPELINE) == []
        return
    tp, pp, nodes = layout.tensor_parallel_size, layout.pipeline_parallel_size, layout.nodes
    assert tp is not None
    assert pp is not None
    assert nodes is not None
    _check_layout(layout, result, hw, shape.layers)
    # The head rule applies to the tensor width; memory fits every GPU.
    assert width_fits_heads(tp, shape.attention_heads, shape.kv_heads)
    assert _fits(model, work, hw, tp, pp)
    if nodes > 1:
        # The fewest nodes: nothing inside one node, nor on fewer nodes, holds it.
        assert in_node_layouts(model, work, hw, result.min_gpus) == []
        assert _fitting(model, work, hw, result.min_gpus, nodes - 1) == []


@given(weights_gb=st.floats(0.5, 5000), hw=_HARDWARE, moe=st.booleans())
def test_weights_only_layout_keeps_every_rule(weights_gb: float, hw: Hardware, moe: bool) -> None:
    result = plan_weights_only(weights_gb * GB, hw, moe=moe)
    layout = result.layout
    if layout.width is None:
        assert result.pool is None
        return
    _check_layout(layout, result, hw, None)
    tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
    assert tp is not None
    assert pp is not None
    assert tp & (tp - 1) == 0  # heads unknown: powers of two, as seed 004 rounds
    per_gpu = usable_bytes(hw.gpu_memory_bytes, hw.usable)
    assert weights_gb * GB / (tp * pp) <= per_gpu * (1 + 1e-9)
    assert layout.expert_parallel == (moe and tp * pp > 1)
    assert math.ceil(weights_gb * GB / per_gpu - 1e-9) == layout.gpus_needed
