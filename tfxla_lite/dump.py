"""Dumps under `--dump_to=DIR`: XLA-style files per compiled cluster, the clustering
decisions per traced function, and report.html.

The driver calls `dump_cluster` as each cluster compiles (a dynamic cluster, as each
input shape compiles) and `dump_trace` once a trace is clustered. Both do nothing
unless the options ask for dumps, and never raise: a dump that cannot be written is a
warning, never a failure of the user's program. The files, named as XLA names its own
(with the task first in a tf.distribute cluster), and `--dump_hlo_as_text`:
docs/inspecting.md, "Dumps and the visual report".
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
import threading
from typing import Any

from tfxla_lite.distributed import task_tag
from tfxla_lite.options import Options
from tfxla_lite.report import ClusteringReport
from tfxla_lite.report_html import ClusterRecord, GraphNodeRecord, TraceRecord, render_page

logger = logging.getLogger("tfxla_lite")

STDOUT = "-"
CLUSTER_ATTR = "_tfxla_lite_cluster"  # as TF's `_XlaCluster`
REPORT_NAME = "report.html"

_module_ids = itertools.count()
_lock = threading.Lock()


class _Session:
    """What one dump directory has seen in this process: the report's contents."""

    def __init__(self) -> None:
        self.traces: list[TraceRecord] = []
        self.clusters: dict[str, list[ClusterRecord]] = {}
        self.warned = False


_sessions: dict[str, _Session] = {}


def dump_directory(options: Options) -> str | None:
    """Where dumps go: `dump_to`, stdout ("-") for `dump_hlo_as_text` alone, or None."""
    if options.dump_to:
        return options.dump_to
    return STDOUT if options.dump_hlo_as_text else None


def task_prefix() -> str:
    """"worker_1." in a task of a tf.distribute cluster, else "": every file name's start."""
    tag = task_tag()
    return f"{tag}." if tag else ""


def file_stem(text: str) -> str:
    """`text` as a file name part: letters, digits, '_', '-' and '.' only."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "_"


# -- per compiled cluster --------------------------------------------------------------
def dump_cluster(options: Options, function_name: str, cluster_name: str, hlo_text: str,
                 executable: Any, compile_seconds: float, title: str | None = None) -> None:
    """Write the module_NNNN.* files of one compiled cluster (or one shape of a
    dynamic cluster) and, when its trace is known, the report again."""
    directory = dump_directory(options)
    if directory is None:
        return
    try:
        _dump_cluster(directory, function_name, cluster_name, hlo_text, executable,
                      compile_seconds, title or cluster_name)
    except Exception as error:  # noqa: BLE001 - a dump never fails the user's program
        _warn(directory, error)


def _dump_cluster(directory: str, function_name: str, cluster_name: str, hlo_text: str,
                  executable: Any, compile_seconds: float, title: str) -> None:
    module_id = next(_module_ids)
    prefix = (f"{task_prefix()}module_{module_id:04d}.{file_stem(function_name)}_"
              f"{file_stem(cluster_name)}")
    texts = {
        f"{prefix}.before_optimizations.txt": hlo_text,
        f"{prefix}.after_optimizations.txt": executable.optimized_hlo_text,
    }
    if directory == STDOUT:
        for name, text in texts.items():
            sys.stdout.write(f"*** Begin {name} ***\n{text}\n*** End {name} ***\n")
        sys.stdout.flush()
        return
    texts[f"{prefix}.buffer-assignment.txt"] = executable.assignment.to_text()
    gpu = gpu_texts(executable, prefix)
    if gpu is None:
        texts[f"{prefix}.ir-no-opt.ll"] = executable.llvm_ir
        texts[f"{prefix}.ir-with-opt.ll"] = executable.llvm_ir_optimized
    else:
        texts.update(gpu)
    os.makedirs(directory, exist_ok=True)
    for name, text in texts.items():
        _write(directory, name, text)
    flops = transcendentals = bytes_accessed = 0
    try:
        from tfxla_lite.hlo.cost_analysis import analyze

        cost = analyze(executable.module)
        flops, transcendentals = cost.flops, cost.transcendentals
        bytes_accessed = cost.bytes_accessed
    except Exception as error:  # noqa: BLE001 - the report shows zeros instead
        logger.debug("tfxla-lite: no cost analysis for %s: %s", prefix, error)
    record = ClusterRecord(
        module_id=module_id, function_name=function_name, cluster_name=cluster_name,
        title=title, hlo_before=hlo_text, hlo_after=executable.optimized_hlo_text,
        module=executable.module, assignment=executable.assignment,
        compile_seconds=compile_seconds, kernel_count=executable.kernel_count, flops=flops,
        transcendentals=transcendentals, bytes_accessed=bytes_accessed, files=list(texts),
        device=device_of(executable),
        cuda_source=gpu[f"{prefix}.cu"] if gpu else "",
        kernel_plan=gpu[f"{prefix}.kernel-plan.txt"] if gpu else "")
    with _lock:
        session = _session(directory)
        session.clusters.setdefault(function_name, []).append(record)
        if any(trace.function_name == function_name for trace in session.traces):
            _write_report(directory, session)


def device_of(executable: Any) -> str:
    """"CPU", or "GPU:i" for an executable the GPU backend built (it has CUDA source):
    the device dumps, the report and `experimental_get_compiler_ir` name."""
    if hasattr(type(executable), "cuda_source"):
        return f"GPU:{executable.device_id}"
    return "CPU"


def gpu_texts(executable: Any, prefix: str) -> dict[str, str] | None:
    """A GPU cluster's files in place of the CPU's LLVM IR: its CUDA C and its kernel
    plan (`codegen/gpu/inspection.py`); None for a CPU executable."""
    device = device_of(executable)
    if device == "CPU":
        return None
    from tfxla_lite.codegen.gpu.inspection import kernel_plan_text

    cu = f"{prefix}.cu"
    plan = kernel_plan_text(executable.program, executable.temp_bytes, device, cu_name=cu)
    return {cu: executable.cuda_source, f"{prefix}.kernel-plan.txt": plan}


# -- per traced function ---------------------------------------------------------------
def dump_trace(options: Options, graph: Any, report: ClusteringReport) -> None:
    """Write the marking dumps and clustering table of one trace, then the report."""
    directory = dump_directory(options)
    if directory is None or directory == STDOUT:
        return
    try:
        _dump_trace(directory, graph, report)
    except Exception as error:  # noqa: BLE001 - a dump never fails the user's program
        _warn(directory, error)


def trace_nodes(graph: Any, report: ClusteringReport) -> list[GraphNodeRecord]:
    """Every op of `graph` with its compiled cluster or the reason it stays in TF."""
    from tfxla_lite.clustering.mark import format_source

    cluster_of = {name: c.name for c in report.compiled_clusters for name, _ in c.ops}
    fallbacks = {node.op_name: node for node in report.fallbacks}
    nodes = []
    for op in graph.get_operations():
        cluster = cluster_of.get(op.name)
        fallback = fallbacks.get(op.name)
        reason = None
        if cluster is None:
            reason = (fallback.reason if fallback is not None
                      else report.note or "not in any cluster")
        source = fallback.source if fallback is not None else format_source(op)
        nodes.append(GraphNodeRecord(
            op.name, op.type, cluster, reason, source,
            inputs=list(dict.fromkeys(t.op.name for t in op.inputs)),
            # Sorted: TF adds automatic control edges in an order that changes from
            # trace to trace (they have no order), and dumps must compare across runs.
            control_inputs=sorted(c.name for c in op.control_inputs)))
    return nodes


def clustering_table(function_name: str, mode: str, nodes: list[GraphNodeRecord]) -> str:
    """The text table of `<function>.clustering.txt`."""
    clustered = sum(node.cluster is not None for node in nodes)
    clusters = len({node.cluster for node in nodes if node.cluster is not None})
    rows = [("node", "op", "cluster / reason", "source")]
    for node in nodes:
        decision = node.cluster if node.cluster is not None else f"TF: {node.reason}"
        rows.append((node.name, node.op_type, decision, node.source or "-"))
    widths = [min(60, max(len(row[i]) for row in rows)) for i in range(3)]
    lines = [f"Clustering of {function_name} ({mode}): {len(nodes)} nodes, {clustered} in "
             f"{clusters} compiled cluster(s), {len(nodes) - clustered} left in TensorFlow"]
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths))
                     + "  " + row[3])
    return "\n".join(lines) + "\n"


def _dump_trace(directory: str, graph: Any, report: ClusteringReport) -> None:
    function_name = report.function_name
    mode = {True: "must-compile", None: "auto-clustering", False: "off"}[report.jit_compile]
    nodes = trace_nodes(graph, report)
    stem = task_prefix() + file_stem(function_name)
    graph_def = graph.as_graph_def(add_shapes=True)
    before = str(graph_def)
    cluster_of = {node.name: node.cluster for node in nodes if node.cluster is not None}
    for node in graph_def.node:
        if node.name in cluster_of:
            node.attr[CLUSTER_ATTR].s = cluster_of[node.name].encode()
    table = {
        "function": function_name,
        "mode": mode,
        "note": report.note,
        "clusters": [{"name": c.name, "compiled": c.compiled, "error": c.error,
                      "ops": [name for name, _ in c.ops], "kernel_count": c.kernel_count,
                      "temp_bytes": c.temp_bytes,
                      "temp_bytes_without_reuse": c.temp_bytes_without_reuse}
                     for c in report.clusters],
        "nodes": [{"name": n.name, "op": n.op_type, "cluster": n.cluster, "reason": n.reason,
                   "source": n.source, "inputs": n.inputs, "control_inputs": n.control_inputs}
                  for n in nodes],
    }
    files = {
        f"{stem}.before_marking.pbtxt": before,
        f"{stem}.after_marking.pbtxt": str(graph_def),
        f"{stem}.clustering.txt": clustering_table(function_name, mode, nodes),
        f"{stem}.clustering.json": json.dumps(table, indent=1) + "\n",
    }
    os.makedirs(directory, exist_ok=True)
    for name, text in files.items():
        _write(directory, name, text)
    with _lock:
        session = _session(directory)
        # A trace whose rewrite failed is reported again, as left to TF: replace it.
        session.traces = [t for t in session.traces if t.function_name != function_name]
        session.traces.append(TraceRecord(function_name, mode, nodes, report.note,
                                          list(files)))
        _write_report(directory, session)


# -- files -----------------------------------------------------------------------------
def _session(directory: str) -> _Session:
    key = os.path.abspath(directory)
    if key not in _sessions:
        _sessions[key] = _Session()
    return _sessions[key]


def _write(directory: str, name: str, text: str) -> None:
    """Write `text` to directory/name through a temporary file and a rename, so that
    a reader (a browser reloading report.html) never sees half a file."""
    path = os.path.join(directory, name)
    temporary = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _write_report(directory: str, session: _Session) -> None:
    _write(directory, task_prefix() + REPORT_NAME,
           render_page(session.traces, session.clusters))


def _warn(directory: str, error: Exception) -> None:
    """Warn once per dump directory; later failures go to DEBUG."""
    with _lock:
        session = _session(directory)
        first, session.warned = not session.warned, True
    if first:
        logger.warning("tfxla-lite: cannot write dumps to %s: %s: %s (further dump errors are "
                       "logged at DEBUG)", directory, type(error).__name__, error)
    else:
        logger.debug("tfxla-lite: cannot write dumps to %s: %s", directory, error)
