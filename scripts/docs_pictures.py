#!/usr/bin/env python3
"""Draw the pictures of the docs site (docs/img/*.svg) from data, so they stay true.

SVG written directly (no dependency). Each picture is a function of data:

- parts.svg            a request's path: client -> gateway -> slot router -> worker -> engine,
                       for a pool of one-GPU slots and a pool with a device group
- placement.svg        a row of four devices before and after a load that evicts: the layout
                       after is what sie_worker.worker.placement.allocator.place() chooses
- device-group.svg     one pod of four GPUs without and with gpu.deviceGroup (slots, workers)
- group-of-nodes.svg   a model wider than a node: a group of nodes (LeaderWorkerSet), ranks
                       and who serves requests

The benchmark plot (docs/img/bench-stream.png) is drawn by tests/bench/report.py from a
benchmark run (make bench), not here.

Usage: .venv/bin/python scripts/docs_pictures.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from sie_worker.worker.placement.allocator import Claim, place

__all__ = ["COMMAND", "main", "pictures"]

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
COMMAND = ".venv/bin/python scripts/docs_pictures.py"
GIB = 1024**3
_COLOURS = {
    "gateway": "#e8f0fe",
    "router": "#fef7e0",
    "worker": "#e6f4ea",
    "engine": "#fce8e6",
    "device": "#f1f3f4",
    "pod": "#ffffff",
    "pinned": "#d2e3fc",
    "new": "#ceead6",
    "evicted": "#fad2cf",
    "group": "#fde293",
    "free": "#ffffff",
}


@dataclass
class _Svg:
    width: int
    height: int
    items: list[str] = field(default_factory=list)

    def box(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        label: str = "",
        fill: str = "#fff",
        dashed: bool = False,
        size: int = 13,
        anchor_top: bool = False,
    ) -> None:
        dash = ' stroke-dasharray="5,4"' if dashed else ""
        self.items.append(
            f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="6" fill="{fill}" '
            f'stroke="#5f6368"{dash}/>'
        )
        if label:
            lines = label.split("\n")
            top = y + 16 if anchor_top else y + h / 2 - (len(lines) - 1) * (size + 2) / 2 + size / 3
            for i, line in enumerate(lines):
                self.text(x + w / 2, top + i * (size + 2), line, size)

    def text(self, x: float, y: float, text: str, size: int = 13, anchor: str = "middle") -> None:
        self.items.append(
            f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}">'
            f"{escape(text)}</text>"
        )

    def arrow(self, x1: float, y1: float, x2: float, y2: float, label: str = "") -> None:
        self.items.append(
            f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="#3c4043" '
            'stroke-width="1.5" marker-end="url(#arrow)"/>'
        )
        if label:
            self.text((x1 + x2) / 2, (y1 + y2) / 2 - 5, label, 11)

    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
            f'viewBox="0 0 {self.width} {self.height}" font-family="sans-serif">\n'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
            'fill="#3c4043"/></marker></defs>\n'
            f'<rect width="{self.width}" height="{self.height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.items) + "\n</svg>\n"


# --- a request's path ------------------------------------------------------------------------


def _parts() -> str:
    svg = _Svg(900, 400)
    svg.box(10, 170, 90, 50, "client", _COLOURS["device"])
    svg.box(130, 160, 140, 70, "gateway\nsie-worker gateway", _COLOURS["gateway"], size=12)
    svg.arrow(100, 195, 130, 195)
    pools = (
        ("pool l4 (gpu.count 2)", ["cuda:0", "cuda:1"], False, 20),
        ("pool h100-4x (deviceGroup)", ["cuda:0..3"], True, 215),
    )
    for title, devices, group, top in pools:
        svg.box(300, top, 590, 165, "", _COLOURS["pod"], dashed=True)
        svg.text(310, top + 16, f"pod of {title}", 12, "start")
        svg.box(320, top + 55, 110, 60, "slot router\n:8080", _COLOURS["router"], size=12)
        svg.arrow(270, 195, 320, top + 85)
        rows = len(devices)
        for i, device in enumerate(devices):
            y = top + 30 + i * (120 / rows) if rows > 1 else top + 55
            h = 50 if rows > 1 else 60
            name = "worker" if group else f"worker-{i}"
            svg.box(460, y, 160, h, f"{name}\nSIE_DEVICES={device}", _COLOURS["worker"], size=11)
            svg.arrow(430, top + 85, 460, y + h / 2)
            label = "engine (TP=4)" if group else "engine"
            svg.box(650, y, 120, h, f"{label}\n127.0.0.1:300xx", _COLOURS["engine"], size=11)
            svg.arrow(620, y + h / 2, 650, y + h / 2)
            svg.box(800, y, 80, h, device, _COLOURS["device"], size=11)
            svg.arrow(770, y + h / 2, 800, y + h / 2)
    return svg.render()


# --- placement and eviction ------------------------------------------------------------------

# Four 80 GiB devices (budget 95%): a width-2 group on 0-1, two single-device models on 2 (b
# used longest ago), a pinned one on 3. A new 30 GiB model arrives.
_BUDGET = int(80 * GIB * 0.95)
_BEFORE = (
    Claim("group-70b", 0, 2, last_used=4.0, memory=68 * GIB),
    Claim("embed-b", 2, 1, last_used=1.0, memory=20 * GIB),
    Claim("chat-c", 2, 1, last_used=3.0, memory=40 * GIB),
    Claim("pinned-d", 3, 1, pinned=True, last_used=2.0, memory=60 * GIB),
)
_NEW = ("new-e", 30 * GIB)


def _device_row(
    svg: _Svg, top: int, title: str, claims: Sequence[Claim], colour: dict[str, str]
) -> None:
    svg.text(20, top - 8, title, 13, "start")
    scale = 150 / _BUDGET
    for index in range(4):
        x = 20 + index * 200
        svg.box(x, top, 180, 170, "", _COLOURS["device"])
        svg.text(x + 90, top + 165, f"cuda:{index}  budget {_BUDGET / GIB:.0f} GiB", 11)
    used = [0.0] * 4
    for claim in sorted(claims, key=lambda c: (c.start, c.model)):
        need = claim.memory or 0
        h = need * scale
        x = 25 + claim.start * 200
        w = 170 + (claim.width - 1) * 200
        y = top + 150 - used[claim.start] - h
        for i in range(claim.start, claim.stop):
            used[i] += h
        what = "pinned" if claim.pinned else f"last used t={claim.last_used:g}"
        svg.box(
            x,
            y + 2,
            w,
            h - 4,
            f"{claim.model} ({need // GIB} GiB)\n{what}",
            colour.get(claim.model, _COLOURS["free"]),
            size=11,
        )


def _placement() -> str:
    name, need = _NEW
    chosen = place([_BUDGET] * 4, _BEFORE, 1, need=need)
    after = [c for c in _BEFORE if c.model not in chosen.evict]
    after.append(Claim(name, chosen.start, 1, last_used=5.0, memory=need))
    svg = _Svg(820, 470)
    colours = {c.model: _COLOURS["group"] for c in _BEFORE if c.width > 1}
    colours |= {c.model: _COLOURS["pinned"] for c in _BEFORE if c.pinned}
    before_colours = colours | dict.fromkeys(chosen.evict, _COLOURS["evicted"])
    _device_row(
        svg,
        30,
        f"before: {name} ({need // GIB} GiB, width 1) is requested; nothing fits "
        f"beside what is there",
        _BEFORE,
        before_colours,
    )
    evicted = ", ".join(chosen.evict) or "nothing"
    _device_row(
        svg,
        270,
        f"after: place() evicts {evicted} (least recently used on the device "
        f"needing fewest evictions) and puts {name} on cuda:{chosen.start}",
        after,
        colours | {name: _COLOURS["new"]},
    )
    return svg.render()


# --- device groups and groups of nodes -------------------------------------------------------


def _device_group() -> str:
    svg = _Svg(860, 330)
    for col, group in enumerate((False, True)):
        x0 = 20 + col * 430
        svg.box(x0, 20, 400, 290, "", _COLOURS["pod"], dashed=True)
        title = "gpu: {count: 4, deviceGroup: true}" if group else "gpu: {count: 4}"
        svg.text(x0 + 10, 38, title, 13, "start")
        slots = 1 if group else 4
        svg.box(
            x0 + 20,
            55,
            360,
            40,
            f"slot router: SIE_GPU_COUNT={slots}, {slots} slot(s)",
            _COLOURS["router"],
            size=12,
        )
        if group:
            svg.box(
                x0 + 20,
                120,
                360,
                70,
                "one worker\nSIE_DEVICES=cuda:0,cuda:1,cuda:2,cuda:3",
                _COLOURS["worker"],
                size=12,
            )
            svg.box(
                x0 + 20,
                200,
                360,
                40,
                "a model of width 4 (tensor_parallel_size: 4)",
                _COLOURS["group"],
                size=12,
            )
        else:
            for i in range(4):
                svg.box(
                    x0 + 20 + i * 90,
                    120,
                    80,
                    70,
                    f"worker-{i}\ncuda:{i}",
                    _COLOURS["worker"],
                    size=12,
                )
                svg.box(x0 + 20 + i * 90, 200, 80, 40, "width 1", _COLOURS["new"], size=12)
        for i in range(4):
            svg.box(x0 + 20 + i * 90, 255, 80, 40, f"GPU {i}", _COLOURS["device"], size=12)
    return svg.render()


def _group_of_nodes() -> str:
    svg = _Svg(860, 300)
    nodes, per_node = 2, 8
    svg.text(
        20,
        22,
        f"gpu: {{count: {per_node}, deviceGroup: true, nodes: {nodes}}}: one "
        f"LeaderWorkerSet group, a model of width {nodes * per_node} "
        f"(tensor_parallel_size {per_node} x pipeline_parallel_size {nodes})",
        12,
        "start",
    )
    for rank in range(nodes):
        x0 = 20 + rank * 420
        role = "leader: serves requests" if rank == 0 else "answers 409 not_leader"
        svg.box(x0, 40, 400, 240, "", _COLOURS["pod"], dashed=True)
        svg.text(x0 + 10, 58, f"pod (node {rank}): SIE_NODE_RANK={rank}, {role}", 12, "start")
        svg.box(
            x0 + 20,
            75,
            360,
            50,
            f"worker rank {rank}: pinned model, stage {rank} of the pipeline",
            _COLOURS["worker"],
            size=12,
        )
        svg.box(
            x0 + 20,
            140,
            360,
            50,
            f"engine rank {rank}: --nnodes {nodes} --node-rank {rank}",
            _COLOURS["engine"],
            size=12,
        )
        for i in range(per_node):
            svg.box(x0 + 20 + i * 45, 210, 40, 50, f"{i}", _COLOURS["group"], size=11)
    svg.arrow(380, 165, 460, 165, "NCCL")
    return svg.render()


def pictures() -> dict[Path, str]:
    return {
        IMG / "parts.svg": _parts(),
        IMG / "placement.svg": _placement(),
        IMG / "device-group.svg": _device_group(),
        IMG / "group-of-nodes.svg": _group_of_nodes(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a picture is stale")
    args = parser.parse_args(argv)
    stale = [
        p
        for p, text in pictures().items()
        if not p.is_file() or p.read_text(encoding="utf-8") != text
    ]
    if args.check:
        if stale:
            names = ", ".join(str(p.relative_to(ROOT)) for p in stale)
            print(f"stale: {names}: run {COMMAND}", file=sys.stderr)
            return 1
        print("docs/img is up to date")
        return 0
    IMG.mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(pictures()[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
