"""Gradients of compiled clusters: what TF's autodiff finds for a launch node.

Where it sits: the graph rewrite (`tfxla_lite/rewrite.py`) gives every launch node its
cluster's own TF ops (`ORIGINAL_ATTR`: a GraphDef over placeholders for the launch
inputs, and `ORIGINAL_OUTPUTS_ATTR`: which of its tensors are the launch outputs), as
TF's XlaLaunch names its cluster's function. When TF differentiates a graph holding a
launch node (`tf.GradientTape` around a compiled call, eager or inside another
`tf.function`; `tf.gradients`; the forward and backward functions TF derives for a
concrete function), the gradient registered for the op types (`tfxla_lite/api.py`,
where `tfxla_lite.function` lives) calls a `LaunchGradient`: it imports the ops the
differentiated outputs depend on again over the launch's inputs and differentiates
them with TF's own gradient rules. That function is itself a tfxla-lite function, so
the backward pass is clustered and compiled; its launch nodes carry their clusters' ops
in turn, which is what makes second and higher derivatives (and `tape.jacobian`,
`ForwardAccumulator` over a backward pass) work the same way.

The cluster's forward values are recomputed inside the backward cluster, fused with
the gradient's ops, instead of being kept from the forward launch (XLA's
rematerialization, chosen here for every cluster): the forward launch stays one kernel
set with no extra outputs, at the cost of the forward's arithmetic once more in the
backward pass. A GPU cluster's nodes (EagerPyFunc) are not launch nodes and have no
such gradient.

Variables. The backward takes only the ops the differentiated outputs depend on by data
edges, so a launch's writes (which have no data outputs) never run again, and it never
reads a variable again: by then the caller may have written it (a tape's gradient taken
after an optimizer step). A read in the cluster differentiates through the handle, as
`ReadVariableOp` does, and takes the value the launch read:
- a read before any write of its variable in the cluster: the gradient adds a
  `ReadVariableOp` of the variable to the forward graph, ordered before the launch
  (`value_before`), and the backward reads that value instead: TF makes it a forward
  output, as it does for the intermediates of any op it differentiates, and a launch
  that writes the variable, seeing another holder of the old buffer, writes a new one
  (copy-on-write). The read exists only in the forward TF derives when it
  differentiates: an undifferentiated call runs the launch alone, writing in place;
- a read after a write (between two writes, or after the last one): clustering makes
  every such read that feeds a floating output a launch output (clustering/cluster.py),
  as TF's XLA keeps a differentiated function's intermediates, and the backward takes
  it from there. Its gradient goes to the variable; the write's operands get none, as
  in TF, whose variable writes have no gradient.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.ops import gen_resource_variable_ops

from tfxla_lite.clustering.cluster import reached
from tfxla_lite.clustering.rules_variables import WRITES
from tfxla_lite.rewrite import ORIGINAL_ATTR, ORIGINAL_INPUT_PREFIX, ORIGINAL_OUTPUTS_ATTR

__all__ = ["LaunchGradient", "launch_gradient"]

# In a gradient's template, the placeholder of a read variable's value before the launch,
# and that of a launch output (a read after a write, which the launch outputs for this).
BEFORE_PREFIX = "tfxla_lite_before_"
OUTPUT_PREFIX = "tfxla_lite_output_"
# The name of the forward graph's read of that value (`value_before`), after the launch's.
_BEFORE_SUFFIX = "_value_before_"
_READS = ("ReadVariableOp", "ResourceGather")


def _differentiable(dtype: tf.DType) -> bool:
    return dtype.is_floating or dtype.is_complex


@dataclass(frozen=True)
class LaunchGradient:
    """The gradient of one launch node's cluster, as a Python function of the launch
    inputs, the values before the launch of the variables in `before`, the launch
    outputs in `launched` and the incoming gradients of the outputs in `present`;
    returns the gradients of the inputs in `differentiable` (None where unconnected).

    Hashable: equal clusters with equal masks share one compiled gradient."""

    template: bytes  # serialized GraphDef: the cluster's ops the `present` outputs need
    outputs: tuple[str, ...]  # its tensors that are the launch outputs, in order
    input_count: int
    present: tuple[int, ...]  # outputs with an incoming gradient
    differentiable: tuple[int, ...]  # inputs that get a gradient
    before: tuple[int, ...] = ()  # variables (inputs) whose value before the launch is read
    launched: tuple[int, ...] = ()  # launch outputs the template reads (values read)
    # Template tensors whose gradient adds to a variable input's: (tensor, input).
    reads: tuple[tuple[str, int], ...] = ()

    def __call__(self, *tensors: tf.Tensor) -> list[tf.Tensor | None]:
        count = self.input_count
        values = count + len(self.before)
        known = values + len(self.launched)
        inputs, output_gradients = tensors[:count], tensors[known:]
        graph_def = tf.compat.v1.GraphDef.FromString(self.template)
        input_map = {f"{ORIGINAL_INPUT_PREFIX}{j}:0": tensor for j, tensor in enumerate(inputs)}
        input_map.update({f"{BEFORE_PREFIX}{j}:0": value
                          for j, value in zip(self.before, tensors[count:values])})
        input_map.update({f"{OUTPUT_PREFIX}{k}:0": value
                          for k, value in zip(self.launched, tensors[values:known])})
        found = tf.graph_util.import_graph_def(
            graph_def, input_map=input_map,
            return_elements=[*(self.outputs[i] for i in self.present),
                             *(name for name, _ in self.reads)], name="original")
        outputs, reads = found[:len(self.present)], found[len(self.present):]
        found = tf.gradients(outputs, [*(inputs[j] for j in self.differentiable), *reads],
                             grad_ys=list(output_gradients))
        results = found[:len(self.differentiable)]
        # A variable's gradient sums over its reads, as TF's gradient of the variable
        # sums over its ReadVariableOps.
        for (_, j), extra in zip(self.reads, found[len(self.differentiable):]):
            k = self.differentiable.index(j)
            if extra is not None:
                results[k] = extra if results[k] is None else tf.math.add_n(
                    [tf.convert_to_tensor(results[k]), tf.convert_to_tensor(extra)])
        return results

    def input_gradients(self, results: Sequence[Any]) -> list[Any]:
        """One entry per launch input: the computed gradient, or None."""
        gradients: list[Any] = [None] * self.input_count
        for j, gradient in zip(self.differentiable, results):
            gradients[j] = gradient
        return gradients


def launch_gradient(op: tf.Operation, output_gradients: Sequence[Any]
                    ) -> tuple[LaunchGradient | None, list[tf.Tensor]]:
    """The gradient function of launch node `op` for these incoming gradients, and the
    tensors to call it with; (None, []) when no gradient flows (no floating input or
    no floating output with a gradient). Raises LookupError, as TF does for an op with
    no gradient, for a launch node without its cluster's ops."""
    try:
        template = op.get_attr(ORIGINAL_ATTR)
        outputs = tuple(name.decode() for name in op.get_attr(ORIGINAL_OUTPUTS_ATTR))
    except ValueError as error:
        raise LookupError(f"tfxla-lite: launch node '{op.name}' does not carry its "
                          "cluster's TF ops, so it has no gradient") from error
    present = tuple(i for i, gradient in enumerate(output_gradients)
                    if gradient is not None and _differentiable(op.outputs[i].dtype))
    # A variable read inside the cluster takes its gradient through the handle, as
    # ReadVariableOp's gradient does.
    differentiable = tuple(j for j, tensor in enumerate(op.inputs)
                           if _differentiable(tensor.dtype) or tensor.dtype == tf.resource)
    if not present or not differentiable:
        return None, []
    cluster = tf.compat.v1.GraphDef.FromString(template)
    needed = _data_fanin(cluster, [outputs[i] for i in present])
    try:
        written = set(op.get_attr("variable_writes"))
    except ValueError:  # a launch without writes
        written = set()
    sources = _read_sources(cluster, needed, written, outputs, op.name)
    reads = _read_values(needed, sources)
    before = tuple(sorted({j for kind, j, _ in sources.values() if kind == BEFORE_PREFIX}))
    launched = tuple(sorted({k for kind, _, k in sources.values() if kind == OUTPUT_PREFIX}))
    gradient = LaunchGradient(needed.SerializeToString(deterministic=True), outputs,
                              len(op.inputs), present, differentiable, before, launched,
                              reads)
    dtypes = {sources[node.name][1]: tf.as_dtype(node.attr["dtype"].type)
              for node in cluster.node if node.name in sources}
    values = [value_before(op, j, dtypes[j]) for j in before]
    # A gradient arriving as IndexedSlices (a Gather downstream) is made dense: the
    # compiled gradient takes tensors.
    incoming = [tf.convert_to_tensor(output_gradients[i]) for i in present]
    return gradient, [*op.inputs, *values, *(op.outputs[k] for k in launched), *incoming]


def value_before(op: tf.Operation, j: int, dtype: tf.DType) -> tf.Tensor:
    """The value of variable input `j` of launch node `op` before the launch writes it:
    a ReadVariableOp in `op`'s graph after what the launch waits for and before it (once
    per launch and variable)."""
    handle = op.inputs[j]
    for control in op.control_inputs:
        if (control.type == "ReadVariableOp" and _BEFORE_SUFFIX in control.name
                and control.inputs[0] is handle):
            return control.outputs[0]
    graph = op.graph
    # Made in the forward graph, outside the backward's scopes and any tape: TF adds it
    # to the forward function it derives, as an output, once the backward captures it.
    with graph.as_default(), graph.name_scope(None), graph.control_dependencies(None), \
            graph.device(op.device), record.stop_recording():
        with graph.control_dependencies(op.control_inputs):
            value = gen_resource_variable_ops.read_variable_op(
                handle, dtype, name=f"{op.name}{_BEFORE_SUFFIX}{j}")
    op._add_control_input(value.op)  # noqa: SLF001 - no public way to order an op later
    return value


def _input_name(reference: str) -> str:
    return reference.lstrip("^").split(":")[0]


def _data_fanin(graph_def: tf.compat.v1.GraphDef, tensors: Iterable[str]
                ) -> tf.compat.v1.GraphDef:
    """The nodes `tensors` depend on by data edges, without their control inputs, and
    every launch-input placeholder (the gradient maps each): the launch's writes, which
    feed nothing by data, are left out."""
    nodes = {node.name: node for node in graph_def.node}
    keep = {name for name in nodes if name.startswith(ORIGINAL_INPUT_PREFIX)}
    pending = [_input_name(t) for t in tensors]
    while pending:
        name = pending.pop()
        if name in keep or name not in nodes:
            continue
        keep.add(name)
        pending.extend(_input_name(r) for r in nodes[name].input if not r.startswith("^"))
    pruned = tf.compat.v1.GraphDef()
    pruned.versions.CopyFrom(graph_def.versions)
    pruned.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in keep:
            copy = pruned.node.add()
            copy.CopyFrom(node)
            del copy.input[:]
            copy.input.extend(r for r in node.input if not r.startswith("^"))
    return pruned


def _read_sources(cluster: tf.compat.v1.GraphDef, needed: tf.compat.v1.GraphDef,
                  written: set[int], outputs: Sequence[str], launch: str
                  ) -> dict[str, tuple[str, int, int]]:
    """Where the gradient takes the value of each variable read in `needed`: read name ->
    (BEFORE_PREFIX, variable input, -1) for a read before any write of its variable in
    the cluster (by its data and control edges, which hold TF's order of one variable's
    ops): the value before the launch; (OUTPUT_PREFIX, variable input, k) for a read
    after a write, which the launch outputs as its output k (clustering/cluster.py).
    Never read again in the backward: the variable may have changed since."""
    consumers: dict[str, list[str]] = {}
    for node in cluster.node:
        for reference in node.input:
            consumers.setdefault(_input_name(reference), []).append(node.name)
    handles = {node.name: int(node.name[len(ORIGINAL_INPUT_PREFIX):])
               for node in cluster.node if node.name.startswith(ORIGINAL_INPUT_PREFIX)}
    writes: dict[int, list[str]] = {}
    for node in cluster.node:
        for reference in node.input[:WRITES.get(node.op, 0)]:
            j = handles.get(_input_name(reference))
            if j is not None and j in written:
                writes.setdefault(j, []).append(node.name)
    position = {name: k for k, name in enumerate(outputs)}
    sources: dict[str, tuple[str, int, int]] = {}
    for node in needed.node:
        if node.op not in _READS or not node.input or _input_name(node.input[0]) not in handles:
            continue
        j = handles[_input_name(node.input[0])]
        if node.name not in reached(writes.get(j, []), consumers):
            sources[node.name] = (BEFORE_PREFIX, j, -1)
        elif f"{node.name}:0" in position:
            sources[node.name] = (OUTPUT_PREFIX, j, position[f"{node.name}:0"])
        else:  # clustering outputs every such read that feeds a floating output
            raise LookupError(
                f"tfxla-lite: launch node '{launch}' does not output {node.name}, a read "
                "of a variable after the launch wrote it, so it has no gradient")
    return sources


def _read_values(needed: tf.compat.v1.GraphDef, sources: dict[str, tuple[str, int, int]]
                 ) -> tuple[tuple[str, int], ...]:
    """Rewrite the reads of `sources` in `needed` to read a placeholder of their value
    instead of the variable; the tensors whose gradients are the variables' (tensor
    name, variable input), as `LaunchGradient.reads`."""
    made: set[str] = set()
    reads: list[tuple[str, int]] = []
    for node in list(needed.node):
        if node.name not in sources:
            continue
        kind, j, k = sources[node.name]
        dtype = node.attr["dtype"].type
        source = f"{kind}{j if kind == BEFORE_PREFIX else k}"
        if source not in made:
            made.add(source)
            placeholder = needed.node.add(name=source, op="Placeholder")
            placeholder.attr["dtype"].type = dtype
            if kind == BEFORE_PREFIX:
                reads.append((f"{source}:0", j))
        if kind == OUTPUT_PREFIX and node.op == "ResourceGather":
            reads.append((_gathered_output(needed, node, source), j))
        elif kind == OUTPUT_PREFIX or node.op == "ReadVariableOp":
            _as_identity(node, source, dtype)
            if kind == OUTPUT_PREFIX:
                reads.append((f"{node.name}:0", j))
        else:  # ResourceGather of the value before: the same gather of the value
            _as_gather(needed, node, source, node.input[1], dtype)
    return tuple(reads)


def _as_identity(node: Any, source: str, dtype: int) -> None:
    node.op = "Identity"
    del node.input[:]
    node.input.append(source)
    for name in list(node.attr):
        del node.attr[name]
    node.attr["T"].type = dtype


def _as_gather(needed: tf.compat.v1.GraphDef, node: Any, source: str, indices: str,
               dtype: int) -> None:
    """`node` (a ResourceGather) as GatherV2 of `source` with its indices and batch_dims."""
    batch_dims = node.attr["batch_dims"].i
    axis = needed.node.add(name=f"{node.name}/{BEFORE_PREFIX}axis", op="Const")
    axis.attr["dtype"].type = tf.int32.as_datatype_enum
    axis.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(batch_dims, tf.int32))
    index_type = node.attr["Tindices"].type
    node.op = "GatherV2"
    del node.input[:]
    node.input.extend([source, indices, axis.name])
    for name in list(node.attr):
        del node.attr[name]
    node.attr["Tparams"].type = dtype
    node.attr["Tindices"].type = index_type
    node.attr["Taxis"].type = tf.int32.as_datatype_enum
    node.attr["batch_dims"].i = batch_dims


def _gathered_output(needed: tf.compat.v1.GraphDef, node: Any, source: str) -> str:
    """`node`, a ResourceGather whose rows the launch outputs as `source`, as those rows
    plus a gather of negative zeros of the variable's shape (x + -0.0 is x, bit for bit):
    the gather's gradient, which depends only on the shape, reaches the zeros, whose
    gradient is the variable's. Returns the zeros' tensor name."""
    handle, indices = node.input[0], node.input[1]
    dtype = node.attr["dtype"].type
    shape = needed.node.add(name=f"{node.name}/{OUTPUT_PREFIX}shape", op="VariableShape")
    shape.input.append(handle)
    shape.attr["out_type"].type = tf.int32.as_datatype_enum
    zero = needed.node.add(name=f"{node.name}/{OUTPUT_PREFIX}zero", op="Const")
    zero.attr["dtype"].type = dtype
    zero.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(-0.0, tf.as_dtype(dtype)))
    zeros = needed.node.add(name=f"{node.name}/{OUTPUT_PREFIX}zeros", op="Fill")
    zeros.input.extend([shape.name, zero.name])
    zeros.attr["T"].type = dtype
    zeros.attr["index_type"].type = tf.int32.as_datatype_enum
    gathered = f"{node.name}/{OUTPUT_PREFIX}gathered"
    copy = needed.node.add()
    copy.CopyFrom(node)
    copy.name = gathered
    _as_gather(needed, copy, zeros.name, indices, dtype)
    add = node
    add.op = "AddV2"
    del add.input[:]
    add.input.extend([source, gathered])
    for name in list(add.attr):
        del add.attr[name]
    add.attr["T"].type = dtype
    return f"{zeros.name}:0"
