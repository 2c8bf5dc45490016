"""How one engine spans GPUs and nodes: tensor parallel inside a node, pipeline stages over
PCIe and across nodes, replicas over what is left (seed 004, Example 14). Pure.

- A model that fits one node takes the seed's split first: one tensor group over NVLink, one
  pipeline over PCIe (one transfer per stage instead of an all-reduce per layer), powers of
  two preferred as the seed rounds (a tensor width also suits the heads,
  :mod:`sie_worker.config.widths`); width 1 is no split.
- When no such split holds it (no valid tensor width from the GPUs it needs to the node's,
  or more stages than a pipeline may have), the smallest TP x PP inside the node that does:
  the model's width is TP x PP, one contiguous block of the node; the head check applies to
  the tensor width; on as many GPUs, tensor parallel first over NVLink, stages first over
  PCIe (DESIGN: "Pipeline parallelism and models beyond one node").
- A model that needs more GPUs than a node has (or that no layout inside a node holds) runs
  on a group of nodes. The tensor width is the widest the head counts allow that divides the
  node's GPUs, so a tensor group never crosses a node; each node runs GPUs / TP stages of
  it, and the fewest nodes whose stages hold the weights and KV cache give PP = nodes x
  stages per node (PP = nodes when TP fills a node: the seed's "TP=8 inside a node, PP=2
  across nodes"). Unlike the seed, the GPU count is not rounded to a power of two beyond a
  node: only the tensor width splits heads, and stages need not split the layers evenly.
- Replicas (data parallel): the nodes on hand (``--nodes``; default: the nodes one engine
  needs) over what one engine takes. With fewer nodes than it needs, the seed's "does not
  fit: N GPUs needed, M present".
- An MoE model split over several GPUs adds expert parallelism for its MoE layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from sie_worker.config.widths import MAX_WIDTH, model_width, rank_width, width_fits
from sie_worker.sizing.arithmetic import Hardware, is_power_of_two

__all__ = ["MAX_PIPELINE", "Layout", "choose_layout", "in_node_split", "layout_summary"]

# pipeline_parallel_size is an integer 1..8, as the tensor width (config.widths).
MAX_PIPELINE = MAX_WIDTH

Fits = Callable[[int, int], bool]  # (tensor width, pipeline stages) -> memory fits every GPU


@dataclass(frozen=True)
class Layout:
    """One engine's split and how many of it the nodes on hand hold.

    ``tensor_parallel_size`` is None when nothing fits; ``reason`` then says why and what to
    change. The model's width (the devices it claims) is TP x PP; a group rank claims
    ``width / nodes`` of its node's GPUs.
    """

    gpus_needed: int
    tensor_parallel_size: int | None
    pipeline_parallel_size: int | None
    nodes: int | None  # nodes one engine spans
    replicas: int | None  # engines on the nodes on hand
    nodes_on_hand: int | None  # --nodes; None: as many as one engine needs
    gpus_per_node: int
    nvlink: bool
    expert_parallel: bool
    reason: str
    nodes_short: int | None = None  # the nodes it needs when --nodes is fewer

    @property
    def width(self) -> int | None:
        if self.tensor_parallel_size is None or self.pipeline_parallel_size is None:
            return None
        return model_width(self.tensor_parallel_size, self.pipeline_parallel_size)

    @property
    def gpus_per_rank(self) -> int | None:
        """GPUs one node's rank claims (``gpu.count`` of the pool)."""
        width = self.width
        return None if width is None or self.nodes is None else rank_width(width, self.nodes)


def choose_layout(
    gpus_needed: int,
    width: int | None,
    hardware: Hardware,
    *,
    tensor_widths: tuple[int, ...],
    fits: Fits,
    width_reason: str,
    layers: int | None = None,
    moe: bool = False,
) -> Layout:
    """The layout for a model that needs ``gpus_needed`` GPUs.

    ``width`` and ``width_reason`` are the tensor width :mod:`sie_worker.sizing.width` chose
    (None: none holds it), kept when the layout is that width alone; ``tensor_widths`` the
    tensor widths the heads allow (1..8); ``fits(tp, pp)`` whether the weights and KV cache
    fit each GPU; ``layers`` caps the stages when known.
    """
    per_node = hardware.gpus_per_node
    base = Layout(gpus_needed, None, None, None, None, hardware.nodes, per_node,
                  hardware.nvlink, False, width_reason)  # fmt: skip
    most = min(MAX_PIPELINE, layers or MAX_PIPELINE)
    split = in_node_split(gpus_needed, per_node, tensor_widths, fits, most, nvlink=hardware.nvlink)
    if split is None:
        return _group(base, tensor_widths, fits, most, moe)
    tp, pp = split
    if (tp, pp) == (width, 1) or (tp, pp) == (1, 1):
        reason = width_reason
    elif pp == 1:
        reason = (
            f"needs {gpus_needed} GPUs; {tp} is the smallest valid tensor width that holds the "
            f"model and fits a node of {per_node} GPUs"
        )
    elif tp == 1 and not hardware.nvlink:
        reason = (
            f"needs {gpus_needed} GPUs; over PCIe, pipeline_parallel_size {pp}: a stage passes "
            "its activations on once, where a tensor split all-reduces every layer"
            + (f"; {pp} is a power of two" if pp != gpus_needed and is_power_of_two(pp) else "")
        )
    else:
        single = (
            "single valid tensor width"
            if hardware.nvlink
            else f"pipeline of up to {min(most, per_node)} stages"
        )
        first = "tensor parallel first" if hardware.nvlink else "stages first over PCIe"
        reason = (
            f"needs {gpus_needed} GPUs, and no {single} holds it on a node of {per_node}: "
            f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = "
            f"{model_width(tp, pp)} GPUs, the smallest layout inside the node that does "
            f"({first}; the head check applies to the tensor width)"
        )
    return _on_hand(base, tp, pp, 1, reason, moe)


def in_node_split(
    need: int,
    per_node: int,
    tensor_widths: tuple[int, ...],
    fits: Fits,
    most: int,
    *,
    nvlink: bool,
) -> tuple[int, int] | None:
    """(TP, PP) of one engine inside a node of ``per_node`` GPUs, or None when none holds it.

    The seed's split first: a tensor group (NVLink) or a pipeline (PCIe) of at least
    ``need`` GPUs, powers of two preferred; else the smallest TP x PP, TP from
    ``tensor_widths`` and PP up to ``most``, on as many GPUs the wider TP over NVLink and the
    more stages over PCIe. The width TP x PP is one block of at most ``per_node`` GPUs.
    """

    def holding(tensor: tuple[int, ...], stages: range) -> list[tuple[int, int]]:
        return [
            (tp, pp)
            for tp in tensor
            for pp in stages
            if model_width(tp, pp) >= need
            and width_fits(model_width(tp, pp), per_node)
            and fits(tp, pp)
        ]

    stages = range(1, most + 1)
    alone = holding(tensor_widths, range(1, 2)) if nvlink else holding((1,), stages)
    if alone:
        return min(alone, key=lambda s: (not is_power_of_two(model_width(*s)), model_width(*s)))
    mixed = holding(tensor_widths, stages)
    if not mixed:
        return None
    return min(mixed, key=lambda s: (model_width(*s), -s[0] if nvlink else s[0]))


def _group(
    base: Layout, tensor_widths: tuple[int, ...], fits: Fits, most: int, moe: bool
) -> Layout:
    need, per_node = base.gpus_needed, base.gpus_per_node
    tensor = [w for w in tensor_widths if width_fits(w, per_node) and per_node % w == 0]
    beyond = (
        f"more than one engine spans on a node of {per_node}"
        if need > per_node
        else f"and no layout inside a node of {per_node} holds it"
    )
    # The fewest nodes first (a layout inside one node was sought above); on as many, the
    # widest tensor width (a narrower one may fit where a wider one copies KV heads past
    # what a GPU holds).
    for nodes in range(2, most + 1):
        for tp in sorted(tensor, reverse=True):
            pp = nodes * (per_node // tp)
            if pp > most or model_width(tp, pp) < need or not fits(tp, pp):
                continue
            reason = (
                f"needs {need} GPUs, {beyond}: tensor_parallel_size {tp} inside a node (a "
                f"valid width that divides the node's GPUs) x pipeline_parallel_size {pp}, on "
                f"a group of {nodes} nodes of {per_node // tp * tp} GPUs each"
            )
            return _on_hand(base, tp, pp, nodes, reason, moe)
    return _none(
        base,
        f"needs {need} GPUs: no tensor width that divides a node of {per_node} "
        f"({', '.join(map(str, tensor))}) with up to {most} pipeline stages holds the weights "
        "and KV cache",
    )


_FIX = (
    "use fewer bits per weight (--bits), a shorter context, fewer sequences, or GPUs with more "
    "memory"
)


def _none(base: Layout, why: str, fix: str = _FIX) -> Layout:
    return replace(base, reason=f"{why}: {fix}")


def _on_hand(base: Layout, tp: int, pp: int, nodes: int, reason: str, moe: bool) -> Layout:
    """The layout of ``nodes`` node(s), refused when ``--nodes`` is fewer."""
    on_hand = base.nodes_on_hand
    chosen = Layout(base.gpus_needed, tp, pp, nodes, None, on_hand, base.gpus_per_node,
                    base.nvlink, moe and model_width(tp, pp) > 1, reason)  # fmt: skip
    if on_hand is not None and on_hand < nodes:
        present = on_hand * base.gpus_per_node
        return replace(
            _none(
                base,
                f"needs {nodes} nodes ({model_width(tp, pp)} GPUs), more than the {on_hand} "
                f"of --nodes ({present} GPUs)",
                f"--nodes {nodes} holds it ({_split(tp, pp, nodes, base.nvlink)}); else {_FIX}",
            ),
            nodes_short=nodes,
        )
    engines = (on_hand or nodes) // nodes
    if nodes == 1:
        engines *= base.gpus_per_node // model_width(tp, pp)
    return replace(chosen, replicas=engines)


def _split(tp: int, pp: int, nodes: int, nvlink: bool) -> str:
    if model_width(tp, pp) == 1:
        return "no split"
    if nodes > 1:
        stages = pp // nodes
        across = "across nodes" if stages == 1 else f"({stages} per node) across {nodes} nodes"
        return f"TP={tp} inside a node, PP={pp} {across}"
    if pp == 1:
        return f"TP={tp}"
    if tp > 1:
        return f"TP={tp}, PP={pp} inside a node"
    return f"PP={pp} (PCIe: communicate once per stage)" if not nvlink else f"PP={pp} inside a node"


def layout_summary(layout: Layout) -> str:
    """The seed's line: ``needs 9 GPU(s) -> TP=8 inside a node, PP=2 across nodes``, or
    ``does not fit: 9 GPUs needed, 8 present`` when the nodes on hand are too few."""
    tp, pp, nodes = layout.tensor_parallel_size, layout.pipeline_parallel_size, layout.nodes
    if tp is None or pp is None or nodes is None:
        if layout.nodes_short is None or layout.nodes_on_hand is None:
            return f"none: needs {layout.gpus_needed} GPU(s), see width"
        present = layout.nodes_on_hand * layout.gpus_per_node
        if layout.gpus_needed > present:
            return f"does not fit: {layout.gpus_needed} GPUs needed, {present} present"
        return f"does not fit: {layout.nodes_short} nodes needed, {layout.nodes_on_hand} present"
    text = f"needs {layout.gpus_needed} GPU(s) -> {_split(tp, pp, nodes, layout.nvlink)}"
    if layout.replicas is not None and layout.replicas > 1:
        text += f", {layout.replicas} replicas (DP)"
    if layout.expert_parallel:
        text += ", expert parallel for the MoE layers"
    return text
