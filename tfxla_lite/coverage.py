"""Coverage: how much of a program's compute tfxla-lite compiles, beside TF's own XLA.

`tfxla-lite coverage SCRIPT [ARG ...]` runs SCRIPT with tfxla-lite enabled
(auto_jit=2), records every program the compiler builds (`record()`), and counts for
each traced function its compute ops and their estimated FLOPs inside compiled
clusters and left in TF, the ops left out grouped by (op type, reason). Then, unless
`--no-tf`, it runs SCRIPT again in a subprocess under TF's auto-clustering and reads the
`mark_for_compilation*.pbtxt` GraphDefs TF dumps: a node with an `_XlaCluster` attribute
is clustered. TF's graphs are Grappler's output, so its counts compare by share only.
What counts as a compute op, the FLOPs of each op kind (`op_flops`) and the weights of
loop bodies and branches (`body_weight`): docs/inspecting.md, "Coverage of your own
script".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tfxla_lite.clustering.registry import constant_value
from tfxla_lite.stats import _NOT_COMPUTE

NOT_COMPUTE = _NOT_COMPUTE | {"_Arg", "_Retval", "_DeviceArg", "_DeviceRetval"}
DOT_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
REDUCTION_OPS = frozenset({
    "Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "ArgMax", "ArgMin", "Softmax",
    "LogSoftmax", "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits",
    "BiasAddGrad", "L2Loss"})
MOVEMENT_OPS = frozenset({
    "Reshape", "Transpose", "StridedSlice", "Slice", "ConcatV2", "Concat", "Shape", "ShapeN",
    "Size", "Rank", "Pack", "Unpack", "Tile", "GatherV2", "ExpandDims", "Squeeze", "Split",
    "SplitV", "Pad", "PadV2", "BroadcastTo", "StridedSliceGrad", "InvertPermutation",
    "BroadcastGradientArgs", "ZerosLike", "OnesLike", "Fill", "Range", "DynamicStitch"})
# While and If ops: not compute themselves; the ops of their functions are counted.
CONTROL_FLOW_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf"})
# Convolutions by where the kernel (or its sizes) and the forward output (or its gradient)
# are: ("input", i) or ("output", i).
CONVOLUTION_OPS: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {
    "Conv2D": (("input", 1), ("output", 0)),
    "Conv3D": (("input", 1), ("output", 0)),
    "DepthwiseConv2dNative": (("input", 1), ("output", 0)),
    "Conv2DBackpropInput": (("input", 1), ("input", 2)),
    "Conv3DBackpropInputV2": (("input", 1), ("input", 2)),
    "DepthwiseConv2dNativeBackpropInput": (("input", 1), ("input", 2)),
    "Conv2DBackpropFilter": (("output", 0), ("input", 2)),
    "Conv3DBackpropFilterV2": (("output", 0), ("input", 2)),
    "DepthwiseConv2dNativeBackpropFilter": (("output", 0), ("input", 2)),
}
# Pooling ops by the input whose elements each scan one window: the forward ops' output
# (None), the gradients' output gradient.
POOLING_OPS: dict[str, int | None] = {
    "MaxPool": None, "MaxPoolV2": None, "MaxPool3D": None, "AvgPool": None,
    "AvgPool3D": None, "MaxPoolGradGrad": None, "MaxPoolGradGradV2": None,
    "MaxPool3DGradGrad": None, "MaxPoolGrad": 2, "MaxPoolGradV2": 2, "MaxPool3DGrad": 2,
    "AvgPoolGrad": 1, "AvgPool3DGrad": 1}
TF_XLA_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit --tf_xla_clustering_debug"
DEFAULT_ASSUMED_DIM = 64


@dataclass
class FunctionCoverage:
    """One traced function (one input signature): compute inside clusters and out."""

    name: str
    ops_compiled: int = 0
    ops_left: int = 0
    flops_compiled: int = 0
    flops_left: int = 0
    # "op type: reason" -> count of ops left in TF
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def op_share(self) -> float:
        return _share(self.ops_compiled, self.ops_left)

    @property
    def flop_share(self) -> float:
        return _share(self.flops_compiled, self.flops_left)


@dataclass
class TfClustering:
    """TF's own auto-clustering of the script: compute ops in `_XlaCluster`s and not."""

    graphs: int = 0
    ops_clustered: int = 0
    ops_left: int = 0
    clusters: int = 0
    error: str | None = None

    @property
    def op_share(self) -> float:
        return _share(self.ops_clustered, self.ops_left)


def _share(inside: int, outside: int) -> float:
    return inside / (inside + outside) if inside + outside else 0.0


# -- FLOPs --------------------------------------------------------------------------------
def _dims(tensor: Any, assumed_dim: int) -> list[int] | None:
    shape = tensor.shape
    if shape.rank is None:
        return None
    return [assumed_dim if d is None else int(d) for d in shape.as_list()]


def op_flops(op: Any, assumed_dim: int = DEFAULT_ASSUMED_DIM) -> int:
    """Estimated FLOPs of one TF op from its shapes (see the module docstring)."""
    if op.type in NOT_COMPUTE or op.type in MOVEMENT_OPS or not op.outputs:
        return 0
    out = _dims(op.outputs[0], assumed_dim)
    if out is None:
        return 0
    if op.type in DOT_OPS:
        a = _dims(op.inputs[0], assumed_dim)
        if not a:
            return 0
        transposed = any(_attr(op, name) for name in ("transpose_a", "adj_x"))
        k = a[-2] if transposed else a[-1]
        return 2 * math.prod(out) * k
    if op.type == "Einsum":
        return 2 * _einsum_size(op, assumed_dim)
    if op.type in CONVOLUTION_OPS:
        return _convolution_flops(op, assumed_dim)
    if op.type in POOLING_OPS:
        return _pooling_flops(op, out, assumed_dim)
    if op.type in REDUCTION_OPS:
        source = _dims(op.inputs[0], assumed_dim)
        return math.prod(source) if source is not None else 0
    return math.prod(out)


def _tensor(op: Any, where: tuple[str, int]) -> Any:
    kind, index = where
    return op.inputs[index] if kind == "input" else op.outputs[index]


def _convolution_flops(op: Any, assumed_dim: int) -> int:
    kernel_place, output_place = CONVOLUTION_OPS[op.type]
    kernel = _dims(_tensor(op, kernel_place), assumed_dim)
    output = _dims(_tensor(op, output_place), assumed_dim)
    if kernel is None or output is None or len(kernel) < 3:
        return 0
    spatial = math.prod(kernel[:-2])
    channels = 1 if op.type.startswith("Depthwise") else kernel[-2]
    return 2 * math.prod(output) * spatial * channels


def _pooling_flops(op: Any, out: list[int], assumed_dim: int) -> int:
    source = POOLING_OPS[op.type]
    elements = out if source is None else _dims(op.inputs[source], assumed_dim)
    if elements is None:
        return 0
    try:
        window = [int(k) for k in op.get_attr("ksize")]
    except ValueError:  # the V2 ops take ksize as an input
        value = constant_value(op.inputs[1 if op.type == "MaxPoolV2" else 3])
        window = [] if value is None else [int(k) for k in value.reshape(-1)]
    return math.prod(elements) * math.prod(window)


def _attr(op: Any, name: str) -> bool:
    try:
        return bool(op.get_attr(name))
    except ValueError:
        return False


def _einsum_size(op: Any, assumed_dim: int) -> int:
    equation = op.get_attr("equation").decode().replace(" ", "")
    sizes: dict[str, int] = {}
    for labels, tensor in zip(equation.split("->")[0].split(","), op.inputs):
        dims = _dims(tensor, assumed_dim) or []
        for label, size in zip(labels.replace("...", ""), dims[-len(labels):] if labels else []):
            sizes[label] = size
    return math.prod(sizes.values()) if sizes else 0


# -- recording tfxla-lite's programs --------------------------------------------------------
def function_coverage(program: Any, assumed_dim: int = DEFAULT_ASSUMED_DIM
                      ) -> FunctionCoverage:
    """The coverage of one built program (`tfxla_lite.program.Program`), the functions of
    its While and If ops included (see `body_weight`)."""
    report = program.report
    result = FunctionCoverage(report.function_name)
    left: Counter[str] = Counter()
    _count_program(program, 1.0, assumed_dim, result, left)
    result.flops_compiled, result.flops_left = (round(result.flops_compiled),
                                                round(result.flops_left))
    result.left_out = dict(left.most_common())
    return result


def body_weight(parent_op: Any, attr: str, assumed_trip_count: int) -> float:
    """How many times a function of a control-flow op runs per run of the op: a While
    body its estimated trip count (`body_graphs.trip_count`, `assumed_trip_count` when
    unknown) and its condition once more; each of an If's two branches one half."""
    from tfxla_lite.clustering import body_graphs

    if parent_op.type in body_graphs.WHILE_OPS:
        trips = body_graphs.trip_count(parent_op, assumed_trip_count)
        return float(trips + 1 if attr == "cond" else trips)
    return 0.5


def _count_program(program: Any, weight: float, assumed_dim: int, result: FunctionCoverage,
                   left: Counter[str]) -> None:
    graph = program.graph if program.graph is not None else program.concrete_function.graph
    report = program.report
    compiled = {name for cluster in report.compiled_clusters for name, _ in cluster.ops}
    reasons = {node.op_name: node.reason for node in report.fallbacks}
    for op in graph.get_operations():
        if op.type in NOT_COMPUTE or op.type in CONTROL_FLOW_OPS:
            continue
        flops = op_flops(op, assumed_dim) * weight
        if op.name in compiled:
            result.ops_compiled += 1
            result.flops_compiled += flops  # type: ignore[assignment]
        else:
            result.ops_left += 1
            result.flops_left += flops  # type: ignore[assignment]
            left[f"{op.type}: {reasons.get(op.name, 'not clustered')}"] += 1
    for body in getattr(program, "bodies", ()):
        parent = graph.get_operation_by_name(body.call.node)
        _count_program(body.program, weight * body_weight(parent, body.call.attr, assumed_dim),
                       assumed_dim, result, left)


@contextlib.contextmanager
def record(assumed_dim: int = DEFAULT_ASSUMED_DIM) -> Iterator[list[FunctionCoverage]]:
    """Within the block, the coverage of every program tfxla-lite builds is appended to
    the list it yields."""
    from tfxla_lite import api

    recorded: list[FunctionCoverage] = []
    build = api.build_program

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        program = build(*args, **kwargs)
        recorded.append(function_coverage(program, assumed_dim))
        return program

    api.build_program = recording_build
    try:
        yield recorded
    finally:
        api.build_program = build


def total(functions: list[FunctionCoverage]) -> FunctionCoverage:
    result = FunctionCoverage("total")
    left: Counter[str] = Counter()
    for f in functions:
        result.ops_compiled += f.ops_compiled
        result.ops_left += f.ops_left
        result.flops_compiled += f.flops_compiled
        result.flops_left += f.flops_left
        left.update(f.left_out)
    result.left_out = dict(left.most_common())
    return result


# -- TF's own auto-clustering ----------------------------------------------------------------
def tf_clustering_of_dumps(directory: str | Path) -> TfClustering:
    """Count clustered and unclustered compute ops in TF's mark_for_compilation dumps."""
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    result = TfClustering()
    clusters: set[tuple[int, str]] = set()
    for path in sorted(Path(directory).glob("mark_for_compilation*.pbtxt")):
        if "annotated" in path.name:
            continue
        graph_def = text_format.Parse(path.read_text(), graph_pb2.GraphDef())
        result.graphs += 1
        for node in graph_def.node:
            if node.op in NOT_COMPUTE:
                continue
            if "_XlaCluster" in node.attr:
                result.ops_clustered += 1
                clusters.add((result.graphs, node.attr["_XlaCluster"].s.decode()))
            else:
                result.ops_left += 1
    result.clusters = len(clusters)
    return result


def run_under_tf_xla(script: str, arguments: list[str], timeout: float = 600) -> TfClustering:
    """Run the script with TF's auto-clustering on and read its clustering dumps."""
    with tempfile.TemporaryDirectory(prefix="tfxla_lite_tf_dump_") as directory:
        env = dict(os.environ, TF_XLA_FLAGS=TF_XLA_FLAGS, TF_DUMP_GRAPH_PREFIX=directory,
                   TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("TFXLA_LITE_FLAGS", None)
        completed = subprocess.run([sys.executable, script, *arguments], env=env,
                                   capture_output=True, text=True, timeout=timeout, check=False)
        result = tf_clustering_of_dumps(directory)
        if completed.returncode != 0:
            result.error = f"exit status {completed.returncode}: {completed.stderr[-500:]}"
        return result


# -- the command ------------------------------------------------------------------------------
def format_table(functions: list[FunctionCoverage], tf_side: TfClustering | None,
                 top: int = 15) -> str:
    rows = [*functions, total(functions)] if len(functions) != 1 else functions
    width = max([len(f.name) for f in rows] + [8])
    lines = [f"{'function':<{width}}  {'ops compiled':>14}  {'share':>6}  "
             f"{'FLOPs compiled':>22}  {'share':>6}"]
    for f in rows:
        lines.append(f"{f.name:<{width}}  {f.ops_compiled:>6} of {f.ops_left + f.ops_compiled:<6}"
                     f"  {f.op_share:>6.1%}  {f.flops_compiled:>10.3g} of "
                     f"{f.flops_left + f.flops_compiled:<8.3g}  {f.flop_share:>6.1%}")
    everything = total(functions)
    if everything.left_out:
        lines.append("left in TensorFlow (op type: reason, count):")
        for reason, count in list(everything.left_out.items())[:top]:
            lines.append(f"  {count:>5}  {reason}")
        if len(everything.left_out) > top:
            lines.append(f"  ... {len(everything.left_out) - top} more kinds")
    if tf_side is not None:
        seen = tf_side.ops_clustered + tf_side.ops_left
        lines.append(f"TF's auto-clustering (--tf_xla_auto_jit=2): {tf_side.ops_clustered} of "
                     f"{seen} compute ops clustered ({tf_side.op_share:.1%}) in "
                     f"{tf_side.clusters} clusters over {tf_side.graphs} graphs"
                     + (f"; {tf_side.error}" if tf_side.error else ""))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tfxla-lite coverage",
        description="Run SCRIPT with tfxla-lite (auto_jit=2) and report the share of compute "
                    "ops and FLOPs compiled, beside TF's own auto-clustering.")
    parser.add_argument("script")
    parser.add_argument("arguments", nargs=argparse.REMAINDER)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-tf", action="store_true", help="skip the TF auto-clustering run")
    parser.add_argument("--assumed-dim", type=int, default=DEFAULT_ASSUMED_DIM,
                        help="size counted for an unknown dimension in FLOPs (default 64)")
    args = parser.parse_args(argv)
    functions = run_script(args.script, args.arguments, args.assumed_dim)
    tf_side = None if args.no_tf else run_under_tf_xla(args.script, args.arguments)
    if args.json:
        print(json.dumps({
            "functions": [_as_json(f) for f in functions],
            "total": _as_json(total(functions)),
            "tf_auto_clustering": None if tf_side is None else {
                **asdict(tf_side), "op_share": tf_side.op_share}}, indent=2))
    else:
        print(format_table(functions, tf_side))
    return 0


def _as_json(f: FunctionCoverage) -> dict[str, Any]:
    return {**asdict(f), "op_share": f.op_share, "flop_share": f.flop_share}


def run_script(script: str, arguments: list[str], assumed_dim: int = DEFAULT_ASSUMED_DIM
               ) -> list[FunctionCoverage]:
    """Run the script as __main__ with auto_jit=2 and return what was recorded."""
    import runpy

    from tfxla_lite import autojit, flags

    if "auto_jit" not in flags.PROCESS_OPTIONS.environment_changes():
        flags.set_options(auto_jit=2)
    autojit.enable()
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    sys.argv = [script, *arguments]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    # The script's prints go to stderr, so that stdout is the report (and --json parses).
    with record(assumed_dim) as recorded, contextlib.redirect_stdout(sys.stderr):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as error:
            if error.code not in (None, 0):
                raise
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
    return recorded
