"""Numerics check mode (`--check_numerics=compare|raise`): every launch against its TF ops.

After the rewrite (`tfxla_lite/rewrite.py`), `instrument` splices beside each launch
that carries its cluster's TF ops (`rewrite.ORIGINAL_ATTR`) a renamed copy of those ops,
in-graph comparison math, and one EagerPyFunc that hands a few scalars per output to
this module's collector (`numerics_report()`); an IdentityN takes the launch's name so
that every consumer waits for the check. What is compared, at which granularity, and
what is not checked: docs/numerics_check.md.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_script_ops, script_ops

from tfxla_lite.options import CHECK_NUMERICS_MODES as CHECK_MODES
from tfxla_lite.rewrite import (
    LAUNCH_OP_TYPES,
    ORIGINAL_ATTR,
    ORIGINAL_INPUT_PREFIX,
    ORIGINAL_OUTPUTS_ATTR,
)

logger = logging.getLogger("tfxla_lite")

# Per dtype (rtol, atol): an element is out of tolerance when both sides are finite and
# |compiled - tf| > atol + rtol * |tf|. Looser than the per-op test table
# (tests/tolerances.py): a cluster chains many ops.
TOLERANCES: dict[tf.DType, tuple[float, float]] = {
    tf.float16: (1e-2, 1e-3), tf.bfloat16: (4e-2, 1e-2), tf.float32: (1e-4, 1e-5),
    tf.float64: (1e-9, 1e-12), tf.complex64: (1e-4, 1e-5), tf.complex128: (1e-9, 1e-12)}
_ORDERED_INTS = {tf.float16: tf.int16, tf.bfloat16: tf.int16, tf.float32: tf.int32,
                 tf.float64: tf.int64}
# The statistics of one output, in the order the graph stacks them.
STATISTICS = ("elements", "max_abs", "max_rel", "max_ulp", "out_of_tolerance",
              "nonfinite_only_compiled", "nonfinite_only_tf", "nonfinite_mismatch")


class NumericsCheckError(ValueError):
    """Compiled code made NaN/Inf where TF's ops did not (`--check_numerics=raise`).
    A ValueError, which TF's EagerPyFunc kernel turns into INVALID_ARGUMENT."""


@dataclass
class OutputCheck:
    """One cluster output, accumulated over the calls: worst differences seen."""

    index: int
    tensor: str  # TF's name of the output in the original graph ('op:i')
    op: str
    dtype: str
    calls: int = 0
    elements: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: float | None = 0.0  # None: not a real float dtype
    out_of_tolerance: int = 0
    nonfinite_only_compiled: int = 0
    nonfinite_only_tf: int = 0
    nonfinite_mismatch: int = 0

    def reset(self) -> None:
        """Forget the calls seen so far."""
        for name in ("calls", "elements", *STATISTICS[4:]):
            setattr(self, name, 0)
        self.max_abs = self.max_rel = 0.0
        if self.max_ulp is not None:
            self.max_ulp = 0.0

    @property
    def within_tolerance(self) -> bool:
        return not (self.out_of_tolerance or self.nonfinite_only_compiled
                    or self.nonfinite_only_tf or self.nonfinite_mismatch)


@dataclass
class ClusterCheck:
    """One checked launch: its outputs, TF's intermediates, the first bad op."""

    launch: str
    ops: tuple[tuple[str, str], ...]  # (name, type) in topological order
    outputs: list[OutputCheck]
    paths: dict[str, tuple[str, ...]]  # output op -> cluster ops on its path, in order
    intermediates: tuple[str, ...]  # TF tensors inside the cluster checked for NaN/Inf
    calls: int = 0
    tf_nonfinite: dict[str, int] = field(default_factory=dict)  # tensor -> worst count
    first_nonfinite_op: str | None = None

    def describe_first_nonfinite(self) -> str | None:
        """Where compiled code first went NaN/Inf while TF stayed finite, in words."""
        if self.first_nonfinite_op is None:
            return None
        output = next(o for o in self.outputs if o.op == self.first_nonfinite_op)
        path = self.paths.get(output.op, ())
        text = (f"op '{output.op}' (cluster output {output.index}, {output.tensor}): "
                "compiled NaN/Inf where TF's value is finite")
        if len(path) > 1:
            text += f"; cluster ops on its path: {', '.join(path)}"
        return text


@dataclass
class NumericsReport:
    """What `--check_numerics` found so far in this process (`numerics_report()`)."""

    clusters: dict[str, ClusterCheck]
    unchecked: dict[str, str]  # launch -> why it is not checked

    @property
    def problems(self) -> list[tuple[ClusterCheck, OutputCheck]]:
        return [(c, o) for c in self.clusters.values() for o in c.outputs
                if not o.within_tolerance]

    def __str__(self) -> str:
        lines = [f"tfxla-lite numerics check: {len(self.clusters)} cluster(s) checked, "
                 f"{len(self.problems)} output(s) out of tolerance"]
        for cluster in self.clusters.values():
            lines.append(f"{cluster.launch}: {cluster.calls} call(s), {len(cluster.ops)} op(s)")
            for o in cluster.outputs:
                ulp = "-" if o.max_ulp is None else f"{o.max_ulp:.0f}"
                flag = "" if o.within_tolerance else "  OUT OF TOLERANCE"
                lines.append(
                    f"  output {o.index} {o.op} ({o.dtype}): max abs {o.max_abs:.3g}, "
                    f"max rel {o.max_rel:.3g}, max ulp {ulp}, out of tolerance "
                    f"{o.out_of_tolerance}, NaN/Inf only compiled {o.nonfinite_only_compiled},"
                    f" only TF {o.nonfinite_only_tf}, different {o.nonfinite_mismatch}{flag}")
            first = cluster.describe_first_nonfinite()
            if first:
                lines.append(f"  first NaN/Inf: {first}")
            bad = {t: n for t, n in cluster.tf_nonfinite.items() if n}
            if bad:
                lines.append("  TF's own NaN/Inf inside the cluster: "
                             + ", ".join(f"{t} ({n})" for t, n in bad.items()))
        for launch, why in self.unchecked.items():
            lines.append(f"{launch}: not checked ({why})")
        return "\n".join(lines)


_lock = threading.Lock()
_clusters: dict[str, ClusterCheck] = {}
_unchecked: dict[str, str] = {}
# token -> (EagerFunc, its collector): TF's py-function registry holds them only weakly.
_live: dict[str, tuple[Any, _Collector]] = {}


def numerics_report() -> NumericsReport:
    """A snapshot of the checks so far (copies: later calls do not change it)."""
    with _lock:
        return NumericsReport(copy.deepcopy(_clusters), dict(_unchecked))


def reset_numerics_report() -> None:
    """Forget what the checks recorded (the instrumented graphs keep checking)."""
    with _lock:
        for cluster in _clusters.values():
            cluster.calls = 0
            cluster.first_nonfinite_op = None
            cluster.tf_nonfinite = {t: 0 for t in cluster.intermediates}
            for output in cluster.outputs:
                output.reset()
        for _, collector in _live.values():
            collector.warned.clear()
        _unchecked.clear()


def instrument(graph_def: tf.compat.v1.GraphDef, mode: str,
               function_name: str | bytes = "") -> tf.compat.v1.GraphDef:
    """A copy of the rewritten `graph_def` in which every checkable launch is compared
    with its cluster's TF ops on each call (see the module docstring). `mode`: "compare"
    warns past the tolerance, "raise" also fails the call when compiled code makes
    NaN/Inf that TF does not; "off" returns `graph_def` itself. The report names each
    launch `<function_name>/<launch>` (a traced function's name is unique)."""
    if mode not in CHECK_MODES:
        raise ValueError(f"check_numerics must be one of {', '.join(CHECK_MODES)}, "
                         f"got {mode!r}")
    if mode == "off":
        return graph_def
    result = tf.compat.v1.GraphDef()
    result.CopyFrom(graph_def)
    if isinstance(function_name, bytes):
        function_name = function_name.decode()
    prefix = f"{function_name}/" if function_name else ""
    launches = [n for n in result.node if n.op in LAUNCH_OP_TYPES]
    for node in result.node:
        if node.op == "StatelessIf" and node.name.startswith("tfxla_lite_launch_"):
            _note_unchecked(prefix + node.name, "unknown dimensions: a fallback If")
        elif node.op == "IdentityN" and node.name.startswith("tfxla_lite_launch_"):
            _note_unchecked(prefix + node.name, "a GPU cluster")
    for launch in launches:
        if ORIGINAL_ATTR not in launch.attr:
            _note_unchecked(prefix + launch.name,
                            "its TF ops read a tensor that is not an input")
            continue
        try:
            _instrument_launch(result, launch, mode, prefix + launch.name)
        except _Unsupported as error:
            _note_unchecked(prefix + launch.name, str(error))
    return result


def _note_unchecked(launch: str, why: str) -> None:
    with _lock:
        _unchecked[launch] = why


def _instrument_launch(graph_def: tf.compat.v1.GraphDef, launch: Any, mode: str,
                       report_name: str) -> None:
    template = tf.compat.v1.GraphDef.FromString(launch.attr[ORIGINAL_ATTR].s)
    output_names = [s.decode() for s in launch.attr[ORIGINAL_OUTPUTS_ATTR].list.s]
    input_dtypes = [tf.as_dtype(t) for t in launch.attr["Tin"].list.type]
    output_dtypes = [tf.as_dtype(t) for t in launch.attr["Tout"].list.type]
    name = launch.name
    order = _topological(template)
    reference, pre_reads, written = _without_writes(template, order)
    outputs = [OutputCheck(i, t, _producer(template, t), d.name,
                           max_ulp=0.0 if d in _ORDERED_INTS else None)
               for i, (t, d) in enumerate(zip(output_names, output_dtypes))]
    outputs += [OutputCheck(len(outputs) + k, f"variable of input {j}, as written", op,
                            d.name, max_ulp=0.0 if d in _ORDERED_INTS else None)
                for k, (j, _, op, d) in enumerate(written)]
    cluster = ClusterCheck(
        launch=report_name, ops=tuple((n.name, n.op) for n in order), outputs=outputs,
        paths={o.op: _path(template, order, o.op) for o in outputs}, intermediates=())
    collector = _Collector(cluster, mode)
    check = _check_graph(reference, [*output_names, *(value for _, value, _, _ in written)],
                         [*output_dtypes, *(d for _, _, _, d in written)], order, collector)
    cluster.intermediates = collector.intermediates
    cluster.tf_nonfinite = {t: 0 for t in collector.intermediates}
    with _lock:
        _clusters[report_name] = cluster
        _unchecked.pop(report_name, None)

    compiled_name = f"{name}/compiled"
    data = list(launch.input[: len(input_dtypes)])
    controls = [r for r in launch.input if r.startswith("^")]
    mapping = {f"reference/{ORIGINAL_INPUT_PREFIX}{j}": reference
               for j, reference in enumerate(data)}
    mapping.update({f"compiled_{i}": f"{compiled_name}:{i}" for i in range(len(output_dtypes))})
    # A written variable's compiled value: read once the launch has stored it.
    for k, (j, _, _, dtype) in enumerate(written):
        read = graph_def.node.add()
        read.name = f"{name}/check/written_{k}"
        read.op = "ReadVariableOp"
        read.device = launch.device
        read.input.extend([data[j], f"^{compiled_name}"])
        read.attr["dtype"].type = dtype.as_datatype_enum
        mapping[f"compiled_{len(output_dtypes) + k}"] = read.name
    _splice(graph_def, check, f"{name}/check/", mapping, controls, launch.device)
    # TF's reads of the values the variables hold before the launch writes them.
    launch.input.extend(f"^{name}/check/reference/{read}" for read in pre_reads)

    identity = graph_def.node.add()
    identity.CopyFrom(launch)
    launch.name = compiled_name
    identity.ClearField("attr")
    identity.ClearField("input")
    identity.input.extend(f"{compiled_name}:{i}" for i in range(len(output_dtypes)))
    identity.input.append(f"^{name}/check/collect")
    if not output_dtypes:  # a launch that only writes variables: ordered, not read
        identity.op = "NoOp"
        identity.input.append(f"^{compiled_name}")
        return
    identity.op = "IdentityN"
    identity.attr["T"].list.type.extend(d.as_datatype_enum for d in output_dtypes)
    if "_output_shapes" in launch.attr:
        identity.attr["_output_shapes"].CopyFrom(launch.attr["_output_shapes"])


class _Unsupported(ValueError):
    """A cluster whose TF ops the check cannot run beside its launch."""


# Variable writes the reference turns into values: op -> the arithmetic on the old value.
_FUNCTIONAL_WRITES = {"AssignVariableOp": None, "AssignAddVariableOp": "AddV2",
                      "AssignSubVariableOp": "Sub"}
_RESOURCE_READS = ("ReadVariableOp", "ResourceGather")


def _without_writes(template: tf.compat.v1.GraphDef, order: list[Any]
                    ) -> tuple[tf.compat.v1.GraphDef, list[str], list[tuple[int, str, str, Any]]]:
    """The cluster's TF ops with no variable writes, for running beside its launch.

    Walking the ops in topological order (which keeps the control edges that order the
    ops of one variable), a write becomes a NoOp and the value written becomes the
    variable's value for the reads after it; reads before any write stay real reads.
    Returns the GraphDef, the names of those real reads (the launch must wait for them)
    and, per variable written, (input index, reference to TF's last value, the last
    writing op, dtype). `_Unsupported` for other ops on variables (scatters, ResourceApply*).
    """
    resource = tf.resource.as_datatype_enum
    handles = {n.name for n in template.node
               if n.op == "Placeholder" and n.attr["dtype"].type == resource}
    if not handles:
        return template, [], []
    result = tf.compat.v1.GraphDef()
    result.versions.CopyFrom(template.versions)
    result.library.CopyFrom(template.library)
    ordered = {n.name for n in order}
    result.node.extend(n for n in template.node if n.name not in ordered)
    value: dict[str, str] = {}  # handle -> the tensor holding the variable's value now
    last: dict[str, tuple[str, Any]] = {}  # handle -> (last writing op, dtype)
    pre_reads: list[str] = []
    for node in order:
        handle = next((r.split(":")[0] for r in node.input
                       if not r.startswith("^") and r.split(":")[0] in handles), None)
        controls = [r for r in node.input if r.startswith("^")]
        if handle is None:
            result.node.add().CopyFrom(node)
        elif node.op in _RESOURCE_READS and handle not in value:
            result.node.add().CopyFrom(node)
            pre_reads.append(node.name)
        elif node.op == "ReadVariableOp":
            _add_node(result, node.name, "Identity", [value[handle], *controls],
                      T=node.attr["dtype"])
        elif node.op in _FUNCTIONAL_WRITES:
            written = node.input[1]
            arithmetic = _FUNCTIONAL_WRITES[node.op]
            if arithmetic is not None:
                if handle not in value:
                    read = _add_node(result, f"{node.name}/old", "ReadVariableOp",
                                     [handle, *controls], dtype=node.attr["dtype"])
                    pre_reads.append(read)
                    value[handle] = read
                written = _add_node(result, f"{node.name}/new", arithmetic,
                                    [value[handle], written], T=node.attr["dtype"])
            _add_node(result, node.name, "NoOp",
                      [f"^{written.lstrip('^').split(':')[0]}", *controls])
            value[handle] = written
            last[handle] = (node.name, tf.as_dtype(node.attr["dtype"].type))
        else:
            raise _Unsupported(f"{node.op} on a variable: only reads and assigns are "
                               "run beside the launch")
    written_variables = [(int(h[len(ORIGINAL_INPUT_PREFIX):]), value[h], *last[h])
                         for h in sorted(last)]
    return result, pre_reads, written_variables


def _add_node(graph_def: tf.compat.v1.GraphDef, name: str, op: str, inputs: list[str],
              **attrs: Any) -> str:
    node = graph_def.node.add()
    node.name = name
    node.op = op
    node.input.extend(inputs)
    for key, attr in attrs.items():
        node.attr[key].CopyFrom(attr)
    return name


# Ops that hand their input on unchanged: an output is named by the op that made it.
_PASS_THROUGH = frozenset({"Identity", "StopGradient", "Snapshot", "PreventGradient"})


def _producer(template: tf.compat.v1.GraphDef, tensor: str) -> str:
    """The op inside the cluster that computes `tensor`, looking through identities."""
    nodes = {n.name: n for n in template.node}
    op = tensor.split(":")[0]
    while nodes[op].op in _PASS_THROUGH and nodes[op].input:
        producer = nodes[op].input[0].split(":")[0]
        if producer not in nodes or nodes[producer].op in ("Placeholder", "Const"):
            break
        op = producer
    return op


def _topological(template: tf.compat.v1.GraphDef) -> list[Any]:
    """The template's ops (neither placeholders nor constants) in topological order."""
    nodes = {n.name: n for n in template.node}
    done: set[str] = set()
    order: list[Any] = []

    def visit(node: Any) -> None:
        stack = [(node, False)]
        while stack:
            current, expanded = stack.pop()
            if current.name in done:
                continue
            if expanded:
                done.add(current.name)
                order.append(current)
                continue
            stack.append((current, True))
            for reference in current.input:
                producer = reference.lstrip("^").split(":")[0]
                if producer in nodes and producer not in done:
                    stack.append((nodes[producer], False))

    for node in template.node:
        visit(node)
    return [n for n in order if n.op not in ("Placeholder", "Const")]


def _path(template: tf.compat.v1.GraphDef, order: list[Any], op: str) -> tuple[str, ...]:
    """The ops of `order` that `op` depends on (itself included), in that order."""
    nodes = {n.name: n for n in template.node}
    needed = {op}
    pending = [op]
    while pending:
        for reference in nodes[pending.pop()].input:
            producer = reference.lstrip("^").split(":")[0]
            if producer in nodes and producer not in needed:
                needed.add(producer)
                pending.append(producer)
    return tuple(n.name for n in order if n.name in needed)


def _check_graph(template: tf.compat.v1.GraphDef, output_names: Sequence[str],
                 output_dtypes: Sequence[tf.DType], order: list[Any],
                 collector: _Collector) -> tf.compat.v1.GraphDef:
    """A GraphDef of: the cluster's TF ops under "reference/" (their placeholders still
    there), placeholders `compiled_i` for the launch's outputs, the comparison math and
    the collector node "collect"."""
    graph = tf.Graph()
    with graph.as_default():
        compiled = [tf.compat.v1.placeholder(d, name=f"compiled_{i}")
                    for i, d in enumerate(output_dtypes)]
        tf.graph_util.import_graph_def(template, name="reference")
        reference = [graph.get_tensor_by_name(f"reference/{_tensor(t)}") for t in output_names]
        with tf.name_scope("compare"):
            statistics = [_statistics(c, r) for c, r in zip(compiled, reference)]
            stacked = (tf.stack(statistics) if statistics
                       else tf.zeros([0, len(STATISTICS)], tf.float64))
            inner = [t for n in order for t in graph.get_operation_by_name(
                f"reference/{n.name}").outputs if t.dtype.is_floating or t.dtype.is_complex]
            collector.intermediates = tuple(t.name[len("reference/"):] for t in inner)
            counts = (tf.stack([_nonfinite_count(t) for t in inner]) if inner
                      else tf.zeros([0], tf.float64))
        function = _eager_function(collector)
        gen_script_ops.eager_py_func([stacked, counts], token=function, Tout=[],
                                     name="collect")
    return graph.as_graph_def()


def _tensor(name: str) -> str:
    return name if ":" in name else f"{name}:0"


def _eager_function(collector: _Collector) -> str:
    function = script_ops.EagerFunc(collector, [], False)
    token = script_ops._py_funcs.insert(function)  # noqa: SLF001 - as tf.py_function does
    with _lock:
        _live[token] = (function, collector)
    return token


def _finite(x: tf.Tensor) -> tf.Tensor:
    if x.dtype.is_complex:
        return tf.math.is_finite(tf.math.real(x)) & tf.math.is_finite(tf.math.imag(x))
    return tf.math.is_finite(x)


def _count(mask: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.cast(mask, tf.float64))


def _worst(values: tf.Tensor) -> tf.Tensor:
    """The largest of `values` (float64), 0 for none."""
    return tf.maximum(tf.reduce_max(tf.reshape(values, [-1])), tf.constant(0.0, tf.float64))


def _nonfinite_count(x: tf.Tensor) -> tf.Tensor:
    return _count(tf.logical_not(_finite(x)))


def _statistics(compiled: tf.Tensor, reference: tf.Tensor) -> tf.Tensor:
    """STATISTICS of `compiled` against `reference` (TF's value), as one float64 vector."""
    dtype = compiled.dtype
    elements = tf.cast(tf.size(compiled), tf.float64)
    if not (dtype.is_floating or dtype.is_complex):
        wide = tf.float64 if dtype != tf.bool else tf.int32
        difference = tf.abs(tf.cast(tf.cast(compiled, wide), tf.float64)
                            - tf.cast(tf.cast(reference, wide), tf.float64))
        zero = tf.constant(0.0, tf.float64)
        return tf.stack([elements, _worst(difference), zero, zero,
                         _count(tf.not_equal(compiled, reference)), zero, zero, zero])
    rtol, atol = TOLERANCES[dtype]
    wide_type = tf.complex128 if dtype.is_complex else tf.float64
    c = tf.cast(compiled, wide_type)
    r = tf.cast(reference, wide_type)
    finite_c, finite_r = _finite(compiled), _finite(reference)
    both = finite_c & finite_r
    zero = tf.zeros_like(elements)
    difference = tf.where(both, tf.abs(c - r), zero)
    magnitude = tf.abs(r)
    # Relative and ulp differences mean something only where TF's value is not a
    # cancellation to near zero: over the elements whose magnitude exceeds atol.
    significant = both & (magnitude > atol)
    relative = tf.where(significant, difference / tf.where(significant, magnitude, 1.0), zero)
    out = both & (difference > atol + rtol * magnitude)
    if dtype in _ORDERED_INTS:
        ulp = _worst(tf.where(significant, _ulp_distance(compiled, reference), zero))
        nan_both = tf.math.is_nan(compiled) & tf.math.is_nan(reference)
    else:
        ulp = zero
        nan_both = tf.math.is_nan(tf.abs(compiled)) & tf.math.is_nan(tf.abs(reference))
    mismatch = ~finite_c & ~finite_r & ~nan_both & tf.not_equal(compiled, reference)
    return tf.stack([elements, _worst(difference), _worst(relative), ulp, _count(out),
                     _count(~finite_c & finite_r), _count(finite_c & ~finite_r),
                     _count(mismatch)])


def _ulp_distance(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Units in the last place between `a` and `b` (float64; finite values only)."""
    integer = _ORDERED_INTS[a.dtype]
    magnitude_mask = tf.constant(np.iinfo(integer.as_numpy_dtype).max, tf.int64)

    def ordered(x: tf.Tensor) -> tf.Tensor:
        bits = tf.cast(tf.bitcast(x, integer), tf.int64)
        # Sign-magnitude to a number line: -0.0 and 0.0 meet at 0.
        return tf.where(bits < 0, -tf.bitwise.bitwise_and(bits, magnitude_mask), bits)

    oa, ob = ordered(a), ordered(b)
    same_side = tf.equal(oa < 0, ob < 0)
    near = tf.cast(tf.abs(oa - ob), tf.float64)  # no overflow on one side of zero
    far = tf.cast(tf.abs(oa), tf.float64) + tf.cast(tf.abs(ob), tf.float64)
    return tf.where(same_side, near, far)


def _splice(graph_def: tf.compat.v1.GraphDef, part: tf.compat.v1.GraphDef, prefix: str,
            mapping: dict[str, str], controls: Sequence[str], device: str) -> None:
    """Add `part`'s nodes to `graph_def` under `prefix`; a placeholder named in `mapping`
    is not added, its readers read `mapping[name]` instead. Nodes without inputs get the
    launch's control inputs, so they run no earlier than the launch could."""
    present = {f.signature.name for f in graph_def.library.function}
    for function in part.library.function:
        if function.signature.name not in present:
            graph_def.library.function.add().CopyFrom(function)
    for node in part.node:
        if node.name in mapping:
            continue
        copy = graph_def.node.add()
        copy.CopyFrom(node)
        copy.name = prefix + node.name
        if device and node.op != "EagerPyFunc":
            copy.device = device
        del copy.input[:]
        for reference in node.input:
            control = reference.startswith("^")
            op, _, index = reference.lstrip("^").partition(":")
            if op in mapping:
                target = mapping[op]
                if index and index != "0":
                    raise ValueError(f"numerics check: {reference} of a placeholder")
                copy.input.append(f"^{target.split(':')[0]}" if control else target)
            else:
                copy.input.append(("^" if control else "") + prefix + reference.lstrip("^"))
        if all(r.lstrip("^").split(":")[0] in mapping for r in node.input):
            copy.input.extend(controls)  # no other node of `part` orders it
        if "_class" in copy.attr:
            del copy.attr["_class"]


class _Collector:
    """The EagerPyFunc of one checked launch: folds each call's statistics into its
    ClusterCheck, warns once per output that leaves the tolerance, raises in "raise"."""

    def __init__(self, cluster: ClusterCheck, mode: str) -> None:
        self.cluster = cluster
        self.mode = mode
        self.intermediates: tuple[str, ...] = ()
        self.warned: set[tuple[int, str]] = set()

    def __call__(self, statistics: Any, counts: Any) -> None:
        statistics = statistics.numpy()
        counts = counts.numpy()
        cluster = self.cluster
        messages: list[str] = []
        with _lock:
            cluster.calls += 1
            for tensor, count in zip(cluster.intermediates, counts):
                cluster.tf_nonfinite[tensor] = max(cluster.tf_nonfinite.get(tensor, 0),
                                                   int(count))
            positions = {name: i for i, (name, _) in enumerate(cluster.ops)}
            for output, row in zip(cluster.outputs, statistics):
                values = dict(zip(STATISTICS, row.tolist()))
                output.calls += 1
                output.elements = int(values["elements"])
                output.max_abs = max(output.max_abs, values["max_abs"])
                output.max_rel = max(output.max_rel, values["max_rel"])
                if output.max_ulp is not None:
                    output.max_ulp = max(output.max_ulp, values["max_ulp"])
                for name in STATISTICS[4:]:
                    setattr(output, name, getattr(output, name) + int(values[name]))
                if values["nonfinite_only_compiled"]:
                    first = cluster.first_nonfinite_op
                    if first is None or positions.get(output.op, 0) < positions.get(first, 0):
                        cluster.first_nonfinite_op = output.op
                for kind in ("out_of_tolerance", "nonfinite_only_compiled",
                             "nonfinite_only_tf", "nonfinite_mismatch"):
                    if values[kind] and (output.index, kind) not in self.warned:
                        self.warned.add((output.index, kind))
                        messages.append(_warning(cluster, output, kind, values))
            first = cluster.describe_first_nonfinite()
        for message in messages:
            logger.warning("%s", message)
        if self.mode == "raise" and statistics[:, 5].any():
            raise NumericsCheckError(f"tfxla-lite numerics check: {cluster.launch}: {first}")


def _warning(cluster: ClusterCheck, output: OutputCheck, kind: str,
             values: dict[str, float]) -> str:
    what = {"out_of_tolerance": "elements out of tolerance",
            "nonfinite_only_compiled": "NaN/Inf in compiled code only",
            "nonfinite_only_tf": "NaN/Inf in TF only",
            "nonfinite_mismatch": "different NaN/Inf"}[kind]
    return (f"tfxla-lite numerics check: {cluster.launch} output {output.index} "
            f"(op '{output.op}', {output.dtype}): {int(values[kind])} {what}; max abs "
            f"{values['max_abs']:.3g}, max rel {values['max_rel']:.3g}, max ulp "
            f"{values['max_ulp']:.0f} (tfxla_lite.numerics_report())")
