"""report.html: one self-contained page (inline CSS, JS and SVG, nothing fetched) that
shows what tfxla-lite did to every function traced in this process.

`tfxla_lite.dump` records plain data here as functions trace and clusters compile
(`TraceRecord`, `ClusterRecord`) and calls `render_page` to write the page again.
Each record renders its HTML once (`fragment`); the page only joins fragments, so
regenerating it as clusters compile stays cheap. No TensorFlow here.

Layout: a sidebar lists traces and their clusters; each trace shows its TF graph
(nodes colored by cluster, TF nodes dashed and grey, reasons on hover and in the
legend), then a card per compiled cluster: compile time, cost analysis, the fusion
graph of the optimized entry computation, the temp-arena timeline, and the HLO
before and after optimization side by side; for a GPU cluster also its kernel plan
and its CUDA C (folded).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from tfxla_lite.report_html.svg import (
    TF_COLORS,
    DrawNode,
    buffer_timeline_svg,
    cluster_color,
    dag_svg,
    escape,
    format_bytes,
    fusion_graph_svg,
)

# A graph larger than this is listed in the table but not drawn: the layout and the
# browser would both take too long for a picture nobody can read.
MAX_DRAWN_NODES = 1500


@dataclass
class GraphNodeRecord:
    """One TF node of a traced function and what clustering decided for it."""

    name: str
    op_type: str
    cluster: str | None  # the compiled cluster it runs in, or None: stays in TF
    reason: str | None  # why it stays in TF
    source: str | None  # the user's file:line
    inputs: list[str] = field(default_factory=list)  # producer op names (data edges)
    control_inputs: list[str] = field(default_factory=list)


@dataclass
class TraceRecord:
    function_name: str
    mode: str  # must-compile, auto-clustering
    nodes: list[GraphNodeRecord]
    note: str | None = None
    files: list[str] = field(default_factory=list)
    _fragment: str | None = field(default=None, repr=False)

    def cluster_names(self) -> list[str]:
        names: list[str] = []
        for node in self.nodes:
            if node.cluster and node.cluster not in names:
                names.append(node.cluster)
        return names


@dataclass
class ClusterRecord:
    """One compiled cluster (or one shape of a dynamic cluster)."""

    module_id: int
    function_name: str
    cluster_name: str
    title: str
    hlo_before: str
    hlo_after: str
    module: Any  # the optimized HloModule
    assignment: Any  # its BufferAssignment
    compile_seconds: float
    kernel_count: int
    flops: int
    transcendentals: int
    bytes_accessed: int
    files: list[str] = field(default_factory=list)
    device: str = "CPU"  # or "GPU:i"
    cuda_source: str = ""  # a GPU cluster's CUDA C
    kernel_plan: str = ""  # ... and its kernel plan (codegen/gpu/inspection.py)
    _fragment: str | None = field(default=None, repr=False)

    @property
    def anchor(self) -> str:
        return f"module-{self.module_id:04d}"


# -- fragments -------------------------------------------------------------------------
def _anchor(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


def _stat(label: str, value: str, hint: str = "") -> str:
    title = f' title="{escape(hint)}"' if hint else ""
    return (f'<div class="stat"{title}><div class="value">{escape(value)}</div>'
            f'<div class="label">{escape(label)}</div></div>')


def _count(value: int) -> str:
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return str(value)


def _hlo_html(text: str) -> str:
    """HLO text, escaped, with computation headers and fusion calls picked out."""
    lines = []
    for line in escape(text).splitlines():
        if re.match(r"^(ENTRY |HloModule |%?[\w.-]+ \()", line):
            line = f'<span class="hlo-head">{line}</span>'
        else:
            line = re.sub(r"\b(fusion)\(", r'<span class="hlo-fusion">\1</span>(', line)
        lines.append(line)
    return "\n".join(lines)


# Border colors of nodes left in TF, one per reason: plumbing in grey, anything that
# kept a computation out of a cluster in a warm color.
REASON_COLORS = ("#dc2626", "#d97706", "#9333ea", "#db2777", "#0891b2", "#65a30d")


def reason_color(reason: str, index: int) -> str:
    if "plumbing" in reason:
        return TF_COLORS[1]
    return REASON_COLORS[index % len(REASON_COLORS)]


def _short_name(node: GraphNodeRecord) -> str:
    """The node's last name component, unless it only repeats the op type."""
    short = node.name.split("/")[-1]
    return "" if short == node.op_type else short


def trace_graph_fragment(trace: TraceRecord) -> str:
    """The TF graph, its legend and the table of every node (cached on the record)."""
    if trace._fragment is not None:
        return trace._fragment
    clusters = trace.cluster_names()
    colors = {name: cluster_color(i) for i, name in enumerate(clusters)}
    reasons: dict[str, int] = {}
    for node in trace.nodes:
        if node.cluster is None:
            reasons.setdefault(node.reason or "left in TensorFlow", len(reasons))
    anchor = _anchor(trace.function_name)

    draw_nodes = []
    for node in trace.nodes:
        where = f"\n{node.source}" if node.source else ""
        if node.cluster is not None:
            fill, stroke = colors[node.cluster]
            tip = f"{node.op_type} {node.name}\ncompiled in {node.cluster}{where}"
            data = {"cluster": node.cluster, "target": f"{anchor}--{_anchor(node.cluster)}"}
            draw_nodes.append(DrawNode(node.name, node.op_type, _short_name(node), fill,
                                       stroke, tip=tip, css_class="node tf clustered",
                                       data=data))
        else:
            reason = node.reason or "left in TensorFlow"
            tip = f"{node.op_type} {node.name}\nstays in TensorFlow: {reason}{where}"
            draw_nodes.append(DrawNode(node.name, node.op_type, _short_name(node),
                                       TF_COLORS[0], reason_color(reason, reasons[reason]),
                                       dashed=True, tip=tip,
                                       css_class="node tf fallback",
                                       data={"reason": str(reasons[reason])}))
    edges = [(source, node.name, False) for node in trace.nodes for source in node.inputs]
    edges += [(source, node.name, True) for node in trace.nodes for source in node.control_inputs]
    if len(draw_nodes) <= MAX_DRAWN_NODES:
        picture = dag_svg(draw_nodes, edges, f"graph-{anchor}")
    else:
        picture = (f'<p class="empty">{len(draw_nodes)} nodes: too many to draw; see the '
                   'table below.</p>')

    legend = ['<div class="legend">']
    for name in clusters:
        fill, stroke = colors[name]
        size = sum(node.cluster == name for node in trace.nodes)
        legend.append(f'<a class="chip" href="#{anchor}--{_anchor(name)}" '
                      f'data-cluster="{escape(name)}"><span class="swatch" style="background:'
                      f'{fill};border-color:{stroke}"></span>{escape(name)} '
                      f'<small>{size} ops</small></a>')
    for reason, index in reasons.items():
        count = sum(node.cluster is None and (node.reason or "left in TensorFlow") == reason
                    for node in trace.nodes)
        legend.append(f'<span class="chip reason" data-reason="{index}" '
                      f'title="{escape(reason)}"><span class="swatch tf" style="border-color:'
                      f'{reason_color(reason, index)}"></span>TF: '
                      f'{escape(reason[:60])} <small>{count}</small></span>')
    legend.append("</div>")

    rows = []
    for node in trace.nodes:
        if node.cluster is not None:
            fill, stroke = colors[node.cluster]
            decision = (f'<span class="swatch" style="background:{fill};border-color:{stroke}">'
                        f'</span>{escape(node.cluster)}')
        else:
            reason = node.reason or "left in TensorFlow"
            color = reason_color(reason, reasons[reason])
            decision = (f'<span class="swatch tf" style="border-color:{color}"></span>TF: '
                        f'{escape(reason)}')
        rows.append(f"<tr><td>{escape(node.name)}</td><td>{escape(node.op_type)}</td>"
                    f"<td>{decision}</td><td>{escape(node.source or '')}</td></tr>")
    table = (f'<details class="nodes-table"><summary>Every node ({len(trace.nodes)}): its '
             'cluster, or why it stays in TensorFlow</summary><table><thead><tr><th>node</th>'
             '<th>op</th><th>cluster / reason</th><th>source</th></tr></thead><tbody>'
             + "".join(rows) + "</tbody></table></details>")
    trace._fragment = ("".join(legend) + f'<div class="scroll graph-box">{picture}</div>'
                       + table)
    return trace._fragment


def cluster_fragment(cluster: ClusterRecord, color: tuple[str, str], anchor: str) -> str:
    """A cluster's card (cached on the record; `anchor` is fixed per cluster)."""
    if cluster._fragment is not None:
        return cluster._fragment
    assignment = cluster.assignment
    saved = assignment.temp_bytes_without_reuse - assignment.temp_bytes
    share = (f" ({100 * saved / assignment.temp_bytes_without_reuse:.0f}%)"
             if assignment.temp_bytes_without_reuse else "")
    stats = "".join([
        _stat("compile", f"{cluster.compile_seconds * 1e3:.1f} ms",
              "lowering, passes, buffer assignment and "
              + ("LLVM" if not cluster.cuda_source else "CUDA emission and NVRTC")),
        _stat("run", "not measured", "run time is not measured: it would take a timed call"),
        _stat("kernels", str(cluster.kernel_count)),
        _stat("flops", _count(cluster.flops), f"{cluster.flops} (cost analysis)"),
        _stat("transcendentals", _count(cluster.transcendentals), str(cluster.transcendentals)),
        _stat("bytes accessed", format_bytes(cluster.bytes_accessed),
              f"{cluster.bytes_accessed} bytes"),
        _stat("temp arena", format_bytes(assignment.temp_bytes),
              f"{assignment.temp_bytes} bytes"),
        _stat("saved by reuse", format_bytes(saved) + share,
              f"{assignment.temp_bytes_without_reuse} bytes without reuse"),
    ])
    entry = cluster.module.entry
    count = len(entry.instructions) if entry is not None else 0
    fusion = fusion_graph_svg(cluster.module, f"fusion-{cluster.anchor}")
    timeline = buffer_timeline_svg(assignment, count, f"timeline-{cluster.anchor}")
    files = " ".join(f'<a href="{escape(name)}">{escape(_file_label(name))}</a>'
                     for name in cluster.files if name.count(".") >= 2)
    fill, stroke = color
    cluster._fragment = (
        f'<section class="cluster" id="{cluster.anchor}" data-anchor="{escape(anchor)}" '
        f'style="border-left-color:{stroke}">'
        f'<h3><span class="swatch" style="background:{fill};border-color:{stroke}"></span>'
        f'{escape(cluster.title)} <small>module_{cluster.module_id:04d}</small></h3>'
        f'<div class="stats">{stats}</div>'
        f'<div class="files">{files}</div>'
        '<h4>Fusion graph <small>(optimized entry computation; fusions in orange)</small></h4>'
        f'<div class="scroll">{fusion}</div>'
        '<h4>Temp buffers <small>(bar: live range × arena bytes)</small></h4>'
        f'<div class="scroll">{timeline}</div>'
        '<h4>HLO before and after optimization</h4><div class="side-by-side">'
        '<div class="pane-title">before optimizations</div>'
        '<div class="pane-title">after optimizations (fusions in orange)</div>'
        f'<pre class="hlo">{_hlo_html(cluster.hlo_before)}</pre>'
        f'<pre class="hlo">{_hlo_html(cluster.hlo_after)}</pre></div>'
        f'{_gpu_fragment(cluster)}</section>')
    return cluster._fragment


def _file_label(name: str) -> str:
    """A dump file's link text: its kind (`after_optimizations`, `ir-no-opt`), or the
    extension of a file of one kind only (`cu`)."""
    stem, extension = name.rsplit(".", 1)
    return stem.rsplit(".", 1)[-1] if extension in ("txt", "ll") else extension


def _gpu_fragment(cluster: ClusterRecord) -> str:
    """A GPU cluster's kernel plan and CUDA C (nothing for a CPU cluster)."""
    if not cluster.cuda_source:
        return ""
    lines = cluster.cuda_source.count("\n") + 1
    return (f'<h4>GPU kernels <small>({escape(cluster.device)}: each kernel with its template, '
            'launch shape and why)</small></h4>'
            f'<pre class="hlo kernel-plan">{escape(cluster.kernel_plan)}</pre>'
            f'<details class="cuda"><summary>CUDA C ({lines} lines)</summary>'
            f'<pre class="hlo cuda-source">{escape(cluster.cuda_source)}</pre></details>')


# -- the page --------------------------------------------------------------------------
def render_page(traces: list[TraceRecord], clusters: dict[str, list[ClusterRecord]]) -> str:
    """The whole page for the traces (in order) and the clusters compiled per function."""
    nav, body = [], []
    compiled_ops = seen_ops = 0
    compile_seconds = 0.0
    cluster_count = 0
    known = {trace.function_name for trace in traces}
    orphans = [TraceRecord(name, "compiled", []) for name in clusters if name not in known]
    for trace in traces + orphans:
        anchor = _anchor(trace.function_name)
        compiled_ops += sum(node.cluster is not None for node in trace.nodes)
        seen_ops += len(trace.nodes)
        names = trace.cluster_names()
        own = clusters.get(trace.function_name, [])
        for record in own:
            if record.cluster_name not in names:
                names.append(record.cluster_name)
        nav.append(f'<li><a href="#{anchor}">{escape(trace.function_name)}</a><ul>')
        cards = []
        for record in own:
            color = cluster_color(names.index(record.cluster_name))
            cluster_anchor = f"{anchor}--{_anchor(record.cluster_name)}"
            nav.append(f'<li><a href="#{record.anchor}"><span class="swatch" style="background:'
                       f'{color[0]};border-color:{color[1]}"></span>{escape(record.title)}'
                       '</a></li>')
            cards.append(cluster_fragment(record, color, cluster_anchor))
            compile_seconds += record.compile_seconds
            cluster_count += 1
        nav.append("</ul></li>")
        # The first card of each cluster name also answers the legend's #links.
        seen: set[str] = set()
        for i, record in enumerate(own):
            if record.cluster_name not in seen:
                seen.add(record.cluster_name)
                cards[i] = (f'<a id="{anchor}--{_anchor(record.cluster_name)}"></a>'
                            + cards[i])
        note = f'<p class="note">{escape(trace.note)}</p>' if trace.note else ""
        clustered = sum(node.cluster is not None for node in trace.nodes)
        body.append(
            f'<section class="trace" id="{anchor}"><h2>{escape(trace.function_name)} '
            f'<span class="badge">{escape(trace.mode)}</span></h2>{note}'
            f'<p class="summary">{len(trace.nodes)} nodes, {clustered} compiled in '
            f'{len(trace.cluster_names())} cluster(s), {len(trace.nodes) - clustered} left in '
            'TensorFlow. Hover a node for its reason and source line; click a clustered '
            'node to jump to its cluster.</p>'
            + (trace_graph_fragment(trace) if trace.nodes else "")
            + "".join(cards) + "</section>")
    header = "".join([
        _stat("traces", str(len(traces))),
        _stat("clusters compiled", str(cluster_count)),
        _stat("nodes compiled", f"{compiled_ops} / {seen_ops}"),
        _stat("compile time", f"{compile_seconds * 1e3:.0f} ms"),
    ])
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    return (_PAGE.replace("/*CSS*/", _CSS).replace("/*JS*/", _JS)
            .replace("<!--HEADER-->", header).replace("<!--NAV-->", "".join(nav))
            .replace("<!--BODY-->", "".join(body) or '<p class="empty">Nothing traced yet.</p>')
            .replace("<!--GENERATED-->", escape(generated)))


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tfxla-lite report</title><style>/*CSS*/</style></head>
<body><script>
window.addEventListener('error', function (event) {
  document.documentElement.setAttribute('data-report-error', String(event.message));
});
</script>
<header><h1>tfxla-lite report</h1><div class="stats"><!--HEADER--></div>
<p class="generated">generated <!--GENERATED--> &middot; regenerated as clusters compile</p>
</header>
<div class="layout"><nav><ul><!--NAV--></ul></nav><main><!--BODY--></main></div>
<div id="tip" hidden></div>
<script>/*JS*/</script></body></html>
"""

_CSS = """
:root { --ink:#0f172a; --muted:#64748b; --line:#e2e8f0; --panel:#ffffff; --bg:#f8fafc; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, 'Segoe UI', sans-serif;
  color:var(--ink); background:var(--bg); }
header { padding:14px 24px; background:#0f172a; color:#f8fafc; display:flex;
  align-items:center; gap:24px; flex-wrap:wrap; }
header h1 { font-size:20px; margin:0; }
header .stat { background:#1e293b; border-color:#334155; }
header .stat .label, .generated { color:#94a3b8; }
.generated { margin:0; font-size:12px; }
.layout { display:flex; align-items:flex-start; }
nav { position:sticky; top:0; width:250px; flex:none; max-height:100vh; overflow:auto;
  padding:12px; border-right:1px solid var(--line); background:var(--panel); }
nav ul { list-style:none; margin:0; padding-left:10px; }
nav > ul { padding:0; } nav a { color:var(--ink); text-decoration:none; font-size:13px;
  word-break:break-all; } nav a:hover { text-decoration:underline; }
main { flex:1; min-width:0; padding:12px 20px 40px; }
section.trace { background:var(--panel); border:1px solid var(--line); border-radius:10px;
  padding:12px 16px; margin-bottom:20px; }
section.trace h2 { font-size:17px; margin:4px 0 6px; word-break:break-all; }
.badge { font-size:11px; background:#e0e7ff; color:#3730a3; padding:2px 8px;
  border-radius:9px; vertical-align:middle; }
.summary, .note { color:var(--muted); margin:4px 0 8px; }
.note { color:#b45309; }
.legend { display:flex; flex-wrap:wrap; gap:6px; margin:6px 0; }
.chip { display:inline-flex; align-items:center; gap:5px; border:1px solid var(--line);
  border-radius:14px; padding:2px 9px; font-size:12px; color:var(--ink);
  text-decoration:none; background:#fff; cursor:default; }
a.chip { cursor:pointer; } .chip small { color:var(--muted); }
.swatch { display:inline-block; width:12px; height:12px; border-radius:3px;
  border:1.5px solid; vertical-align:middle; margin-right:4px; }
.swatch.tf { background:#f3f4f6; border:1.5px dashed #6b7280; }
.scroll { overflow:auto; border:1px solid var(--line); border-radius:8px; background:#fcfcfd; }
.graph-box { max-height:70vh; }
svg text { font:11px system-ui, sans-serif; fill:#0f172a; }
svg .label { text-anchor:middle; font-weight:600; }
svg .sublabel { text-anchor:middle; fill:#475569; font-size:10px; }
svg .edge { fill:none; stroke:#94a3b8; stroke-width:1.3; }
svg .node { cursor:pointer; transition:opacity .15s; }
svg.dim .node { opacity:.18; } svg.dim .edge { opacity:.12; }
svg.dim .node.hot { opacity:1; } svg.dim .edge.hot { opacity:1; stroke:#334155; }
svg .arena { fill:#f1f5f9; stroke:#cbd5e1; } svg .grid { stroke:#e2e8f0; }
svg .axis { fill:#64748b; font-size:10px; } svg .bar-label { font-size:10px; }
svg .buffer:hover rect { stroke-width:2.5; }
section.cluster { border-left:5px solid; padding:6px 0 6px 12px; margin:18px 0 8px; }
section.cluster h3 { margin:0 0 8px; font-size:15px; }
section.cluster h3 small, h4 small { color:var(--muted); font-weight:normal; }
h4 { margin:12px 0 4px; font-size:13px; }
.stats { display:flex; flex-wrap:wrap; gap:8px; }
.stat { border:1px solid var(--line); border-radius:8px; padding:4px 10px; min-width:92px;
  background:#fff; } .stat .value { font-weight:700; font-size:15px; }
.stat .label { color:var(--muted); font-size:11px; }
.files { margin:6px 0; font-size:12px; } .files a { margin-right:8px; color:#2563eb; }
.side-by-side { display:grid; grid-template-columns:1fr 1fr; gap:4px 8px; }
.pane-title { font-size:11px; color:var(--muted); text-transform:uppercase; }
pre.hlo { margin:0; max-height:380px; overflow:auto; font:11px/1.35 ui-monospace, monospace;
  background:#0f172a; color:#e2e8f0; padding:8px; border-radius:8px; }
.hlo-head { color:#fbbf24; } .hlo-fusion { color:#fb923c; font-weight:700; }
pre.kernel-plan { white-space:pre-wrap; } details.cuda { margin:6px 0; }
details.nodes-table { margin:8px 0; } details summary { cursor:pointer; color:#334155; }
table { border-collapse:collapse; font-size:12px; margin-top:6px; width:100%; }
th, td { text-align:left; padding:3px 8px; border-bottom:1px solid var(--line);
  vertical-align:top; word-break:break-all; } th { background:#f1f5f9; }
.empty { color:var(--muted); padding:8px; margin:0; }
#tip { position:fixed; z-index:10; pointer-events:none; max-width:460px; white-space:pre-wrap;
  background:#0f172a; color:#f8fafc; font:12px/1.4 ui-monospace, monospace; padding:6px 9px;
  border-radius:6px; box-shadow:0 4px 14px rgba(0,0,0,.25); }
"""

_JS = r"""
(function () {
  var tip = document.getElementById('tip');
  function owner(el, attr) {
    while (el && el.getAttribute && !el.hasAttribute(attr)) { el = el.parentNode; }
    return el && el.getAttribute ? el : null;
  }
  document.addEventListener('mousemove', function (event) {
    var el = owner(event.target, 'data-tip');
    if (!el || !el.getAttribute('data-tip')) { tip.hidden = true; return; }
    tip.textContent = el.getAttribute('data-tip');
    tip.hidden = false;
    tip.style.left = Math.min(event.clientX + 14, window.innerWidth - 470) + 'px';
    tip.style.top = (event.clientY + 14) + 'px';
  });
  function highlight(svg, match) {
    if (!svg) { return; }
    var hot = {};
    svg.querySelectorAll('.node').forEach(function (node) {
      var on = match(node);
      node.classList.toggle('hot', on);
      if (on) { hot[node.getAttribute('data-id')] = true; }
    });
    svg.querySelectorAll('.edge').forEach(function (edge) {
      edge.classList.toggle('hot', !!(hot[edge.getAttribute('data-from')] &&
                                      hot[edge.getAttribute('data-to')]));
    });
    svg.classList.add('dim');
  }
  function clear(svg) { if (svg) { svg.classList.remove('dim'); } }
  var drawn = 0;
  document.querySelectorAll('section.trace').forEach(function (section) {
    var svg = section.querySelector('svg.dag');
    if (svg) { drawn += 1; }
    section.querySelectorAll('.node.clustered').forEach(function (node) {
      var name = node.getAttribute('data-cluster');
      node.addEventListener('mouseenter', function () {
        highlight(svg, function (n) { return n.getAttribute('data-cluster') === name; });
      });
      node.addEventListener('mouseleave', function () { clear(svg); });
      node.addEventListener('click', function () {
        var target = document.getElementById(node.getAttribute('data-target'));
        if (target) { target.scrollIntoView({behavior: 'smooth'}); }
      });
    });
    section.querySelectorAll('.node.fallback').forEach(function (node) {
      var reason = node.getAttribute('data-reason');
      node.addEventListener('mouseenter', function () {
        highlight(svg, function (n) { return n.getAttribute('data-reason') === reason; });
      });
      node.addEventListener('mouseleave', function () { clear(svg); });
    });
    section.querySelectorAll('.legend .chip').forEach(function (chip) {
      var cluster = chip.getAttribute('data-cluster');
      var reason = chip.getAttribute('data-reason');
      chip.addEventListener('mouseenter', function () {
        highlight(svg, function (n) {
          return cluster ? n.getAttribute('data-cluster') === cluster
                         : n.getAttribute('data-reason') === reason;
        });
      });
      chip.addEventListener('mouseleave', function () { clear(svg); });
    });
  });
  document.querySelectorAll('.graph-box').forEach(function (box) {
    box.scrollLeft = Math.max(0, (box.scrollWidth - box.clientWidth) / 2);
  });
  // Proof for tests (and for a curious reader) that the script ran to its end.
  document.body.setAttribute('data-report-ready', String(drawn));
})();
"""
