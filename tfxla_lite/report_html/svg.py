"""SVG pictures for report.html: DAGs (TF graphs, HLO entry computations) and the
buffer timeline of a cluster's temp arena.

Pure string building over plain data and `tfxla_lite.hlo` objects; no TensorFlow.
Every element a user may hover carries `data-tip` (the page's script shows it in a
floating box) and an SVG `<title>` (the browser's own tooltip, also without script).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tfxla_lite.report_html.layout import layered_layout

NODE_WIDTH = 148
NODE_HEIGHT = 34
COLUMN = 164  # horizontal distance between node centers in a layer
ROW = 64  # vertical distance between layers
MARGIN = 16

# Cluster colors (fill, stroke), distinct at a glance; reused cyclically.
CLUSTER_COLORS = (
    ("#bfdbfe", "#1d4ed8"), ("#fde68a", "#b45309"), ("#bbf7d0", "#15803d"),
    ("#fbcfe8", "#be185d"), ("#ddd6fe", "#6d28d9"), ("#fed7aa", "#c2410c"),
    ("#a5f3fc", "#0e7490"), ("#fecaca", "#b91c1c"), ("#d9f99d", "#4d7c0f"),
    ("#e9d5ff", "#7e22ce"), ("#99f6e4", "#0f766e"), ("#fef08a", "#a16207"),
)
TF_COLORS = ("#f3f4f6", "#6b7280")  # nodes left in TensorFlow


def escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def cluster_color(index: int) -> tuple[str, str]:
    return CLUSTER_COLORS[index % len(CLUSTER_COLORS)]


@dataclass
class DrawNode:
    """One box of a DAG picture."""

    id: str
    label: str
    sublabel: str = ""
    fill: str = TF_COLORS[0]
    stroke: str = TF_COLORS[1]
    dashed: bool = False
    tip: str = ""
    css_class: str = "node"
    data: dict[str, str] = field(default_factory=dict)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def dag_svg(nodes: Sequence[DrawNode], edges: Sequence[tuple[str, str, bool]],
            svg_id: str) -> str:
    """A top-to-bottom layered drawing; `edges` are (source id, target id, is_control)."""
    if not nodes:
        return '<p class="empty">(empty graph)</p>'
    placements = layered_layout([n.id for n in nodes], [(s, t) for s, t, _ in edges])
    widths: dict[int, int] = {}
    for placement in placements.values():
        widths[placement.layer] = widths.get(placement.layer, 0) + 1
    widest = max(widths.values())
    width = widest * COLUMN + 2 * MARGIN
    height = (max(widths) + 1) * ROW - (ROW - NODE_HEIGHT) + 2 * MARGIN

    def center(node_id: str) -> tuple[float, float]:
        placement = placements[node_id]
        row_width = widths[placement.layer] * COLUMN
        x = (width - row_width) / 2 + placement.position * COLUMN + COLUMN / 2
        y = MARGIN + placement.layer * ROW + NODE_HEIGHT / 2
        return x, y

    parts = [f'<svg id="{escape(svg_id)}" class="dag" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             f'<defs><marker id="{escape(svg_id)}-arrow" viewBox="0 0 8 8" refX="8" refY="4" '
             'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
             '<path d="M0,0 L8,4 L0,8 z" fill="#94a3b8"/></marker></defs>',
             '<g class="edges">']
    for source, target, control in edges:
        if source not in placements or target not in placements or source == target:
            continue
        x1, y1 = center(source)
        x2, y2 = center(target)
        y1 += NODE_HEIGHT / 2
        y2 -= NODE_HEIGHT / 2
        bend = max(18.0, abs(y2 - y1) / 2)
        style = ' stroke-dasharray="4 3"' if control else ""
        parts.append(f'<path class="edge" data-from="{escape(source)}" '
                     f'data-to="{escape(target)}" d="M{x1:.1f},{y1:.1f} C{x1:.1f},'
                     f'{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}"'
                     f'{style} marker-end="url(#{escape(svg_id)}-arrow)"/>')
    parts.append('</g><g class="nodes">')
    for node in nodes:
        x, y = center(node.id)
        left, top = x - NODE_WIDTH / 2, y - NODE_HEIGHT / 2
        data = "".join(f' data-{key}="{escape(value)}"' for key, value in node.data.items())
        dash = ' stroke-dasharray="5 3"' if node.dashed else ""
        parts.append(f'<g class="{escape(node.css_class)}" data-id="{escape(node.id)}" '
                     f'data-tip="{escape(node.tip)}"{data}>'
                     f'<title>{escape(node.tip)}</title>'
                     f'<rect x="{left:.1f}" y="{top:.1f}" width="{NODE_WIDTH}" '
                     f'height="{NODE_HEIGHT}" rx="6" fill="{node.fill}" stroke="{node.stroke}" '
                     f'stroke-width="1.6"{dash}/>')
        if node.sublabel:
            parts.append(f'<text x="{x:.1f}" y="{y - 3:.1f}" class="label">'
                         f'{escape(_shorten(node.label, 22))}</text>'
                         f'<text x="{x:.1f}" y="{y + 11:.1f}" class="sublabel">'
                         f'{escape(_shorten(node.sublabel, 26))}</text>')
        else:
            parts.append(f'<text x="{x:.1f}" y="{y + 4:.1f}" class="label">'
                         f'{escape(_shorten(node.label, 22))}</text>')
        parts.append("</g>")
    parts.append("</g></svg>")
    return "".join(parts)


# -- HLO entry computation -------------------------------------------------------------
_HLO_COLORS = {
    "parameter": ("#dbeafe", "#2563eb"),
    "constant": ("#f1f5f9", "#94a3b8"),
    "fusion": ("#fed7aa", "#c2410c"),
    "tuple": ("#f8fafc", "#64748b"),
    "get-tuple-element": ("#f8fafc", "#64748b"),
}
_OTHER_HLO = ("#dcfce7", "#16a34a")


def fusion_graph_svg(module: Any, svg_id: str) -> str:
    """The entry computation of an optimized `HloModule`: fusions as orange boxes that
    list the ops they hold, every other instruction (one kernel each) in green."""
    entry = module.entry
    if entry is None:
        return '<p class="empty">(no entry computation)</p>'
    nodes = []
    for inst in entry.instructions:
        fill, stroke = _HLO_COLORS.get(inst.opcode, _OTHER_HLO)
        tip = [f"%{inst.name} = {inst.shape} {inst.opcode}"]
        sublabel = inst.opcode
        if inst.opcode == "fusion":
            fused = [i.opcode for i in inst.fused_computation.instructions
                     if i.opcode not in ("parameter", "constant")]
            kind = str(inst.attributes.get("kind", "")).replace("k", "", 1).lower()
            sublabel = f"{kind}: {' '.join(fused)}" if kind else " ".join(fused)
            tip.append(f"fused ({len(fused)}): {', '.join(fused)}")
        else:
            sublabel = f"{inst.opcode} {inst.shape}"
        where = inst.metadata.get("op_name")
        if where:
            source = inst.metadata.get("source_file")
            line = inst.metadata.get("source_line")
            tip.append(f"TF: {where}" + (f" at {source}:{line}" if source else ""))
        if inst is entry.root:
            tip.append("(root)")
        nodes.append(DrawNode(inst.name, inst.name, sublabel, fill, stroke, tip="\n".join(tip),
                              css_class="node hlo"))
    edges = [(operand.name, inst.name, False) for inst in entry.instructions
             for operand in inst.operands]
    return dag_svg(nodes, edges, svg_id)


# -- buffer timeline -------------------------------------------------------------------
TIMELINE_WIDTH = 880
TIMELINE_HEIGHT = 220


def buffer_timeline_svg(assignment: Any, instruction_count: int, svg_id: str) -> str:
    """Each temp buffer a bar over its live range (x: entry instruction index) at its
    offset in the arena (y), so that reuse shows as bars stacked in time."""
    temps = [(name, s) for name, s in assignment.slices.items() if s.kind == "temp"]
    if not temps or assignment.temp_bytes == 0:
        return ('<p class="empty">No temp buffers: every value lives in a parameter, an '
                'output or a constant.</p>')
    left, bottom = 64, 26
    width, height = TIMELINE_WIDTH + left + 12, TIMELINE_HEIGHT + bottom + 12
    columns = max(1, instruction_count)
    x_scale = TIMELINE_WIDTH / columns
    y_scale = TIMELINE_HEIGHT / assignment.temp_bytes
    parts = [f'<svg id="{escape(svg_id)}" class="timeline" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             f'<rect x="{left}" y="6" width="{TIMELINE_WIDTH}" height="{TIMELINE_HEIGHT}" '
             'class="arena"/>']
    for tick in range(5):
        value = assignment.temp_bytes * tick // 4
        y = 6 + value * y_scale
        parts.append(f'<line x1="{left - 4}" x2="{left + TIMELINE_WIDTH}" y1="{y:.1f}" '
                     f'y2="{y:.1f}" class="grid"/><text x="{left - 6}" y="{y + 4:.1f}" '
                     f'class="axis" text-anchor="end">{_bytes(value)}</text>')
    step = max(1, columns // 10)
    for index in range(0, columns, step):
        x = left + (index + 0.5) * x_scale
        parts.append(f'<text x="{x:.1f}" y="{6 + TIMELINE_HEIGHT + 16}" class="axis" '
                     f'text-anchor="middle">{index}</text>')
    for number, (name, buffer) in enumerate(sorted(temps, key=lambda t: t[1].offset)):
        start, end = assignment.live_ranges.get(name, (0, columns - 1))
        fill, stroke = cluster_color(number)
        x = left + start * x_scale
        bar_width = max(2.0, (end - start + 1) * x_scale - 1)
        y = 6 + buffer.offset * y_scale
        bar_height = max(2.0, buffer.size * y_scale - 1)
        shape = assignment.shapes.get(name, "")
        tip = (f"%{name} {shape}\n{buffer.size} bytes at offset {buffer.offset}\n"
               f"live [{start}, {end}]")
        parts.append(f'<g class="buffer" data-tip="{escape(tip)}"><title>{escape(tip)}</title>'
                     f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_width:.1f}" '
                     f'height="{bar_height:.1f}" rx="3" fill="{fill}" stroke="{stroke}"/>')
        if bar_width > 60 and bar_height > 12:
            parts.append(f'<text x="{x + 4:.1f}" y="{y + min(bar_height, 24) / 2 + 4:.1f}" '
                         f'class="bar-label">{escape(_shorten(name, int(bar_width / 7)))}</text>')
        parts.append("</g>")
    parts.append(f'<text x="{left + TIMELINE_WIDTH / 2}" y="{height - 1}" class="axis" '
                 'text-anchor="middle">entry instruction index</text></svg>')
    return "".join(parts)


def _bytes(count: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


format_bytes = _bytes
