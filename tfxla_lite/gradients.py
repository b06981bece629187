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
edges, so a launch's writes (which have no data outputs) never run again. A read in the
cluster differentiates through the handle, as `ReadVariableOp` does, and the rerun reads
the variable again, which gives the value the forward read unless the launch writes
that variable after the read. For such a read (BatchNorm's
moving statistics feed only their own update, but a training step's loss reads the
weights its optimizer then writes), the gradient adds a `ReadVariableOp` of the variable
to the forward graph, ordered before the launch (`value_before`), and the backward reads
that value instead: TF makes it a forward output, as it does for the intermediates of
any op it differentiates, and the launch, seeing another holder of the old buffer,
writes a new one (copy-on-write). The read exists only in the forward TF derives when it
differentiates: an undifferentiated call runs the launch alone, writing in place. A read
after the launch's last write of its variable reads the written value again. A read
between two writes of one variable, whose value the outputs need, has no value to
differentiate from: LookupError, as for an op without a gradient.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.ops import gen_resource_variable_ops

from tfxla_lite.clustering.rules_variables import WRITES
from tfxla_lite.rewrite import ORIGINAL_ATTR, ORIGINAL_INPUT_PREFIX, ORIGINAL_OUTPUTS_ATTR

__all__ = ["LaunchGradient", "launch_gradient"]

# In a gradient's template, the placeholder of a written variable's value before the launch.
BEFORE_PREFIX = "tfxla_lite_before_"
# The name of the forward graph's read of that value (`value_before`), after the launch's.
_BEFORE_SUFFIX = "_value_before_"
_READS = ("ReadVariableOp", "ResourceGather")


def _differentiable(dtype: tf.DType) -> bool:
    return dtype.is_floating or dtype.is_complex


@dataclass(frozen=True)
class LaunchGradient:
    """The gradient of one launch node's cluster, as a Python function of the launch
    inputs, the values before the launch of the variables in `before`, and the incoming
    gradients of the outputs in `present`; returns the gradients of the inputs in
    `differentiable` (None where unconnected).

    Hashable: equal clusters with equal masks share one compiled gradient."""

    template: bytes  # serialized GraphDef: the cluster's ops the `present` outputs need
    outputs: tuple[str, ...]  # its tensors that are the launch outputs, in order
    input_count: int
    present: tuple[int, ...]  # outputs with an incoming gradient
    differentiable: tuple[int, ...]  # inputs that get a gradient
    before: tuple[int, ...] = ()  # written variables (inputs) read before their write

    def __call__(self, *tensors: tf.Tensor) -> list[tf.Tensor | None]:
        count, known = self.input_count, self.input_count + len(self.before)
        inputs, values, output_gradients = tensors[:count], tensors[count:known], tensors[known:]
        graph_def = tf.compat.v1.GraphDef.FromString(self.template)
        input_map = {f"{ORIGINAL_INPUT_PREFIX}{j}:0": tensor for j, tensor in enumerate(inputs)}
        input_map.update({f"{BEFORE_PREFIX}{j}:0": value
                          for j, value in zip(self.before, values)})
        outputs = tf.graph_util.import_graph_def(
            graph_def, input_map=input_map,
            return_elements=[self.outputs[i] for i in self.present], name="original")
        found = tf.gradients(outputs, [*(inputs[j] for j in self.differentiable), *values],
                             grad_ys=list(output_gradients))
        results = found[:len(self.differentiable)]
        # A variable's gradient sums over its reads, those of the value before the launch
        # included, as TF's gradient of the variable sums over its ReadVariableOps.
        for j, extra in zip(self.before, found[len(self.differentiable):]):
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
    no gradient, for a launch node without its cluster's ops, and for outputs that need
    a variable's value between two writes of the launch."""
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
    written = set(op.get_attr("variable_writes"))
    earlier = _reads_before_writes(cluster, needed, written, op.name) if written else {}
    before = tuple(sorted(set(earlier.values())))
    _read_values_before(needed, earlier)
    gradient = LaunchGradient(needed.SerializeToString(deterministic=True), outputs,
                              len(op.inputs), present, differentiable, before)
    dtypes = {j: tf.as_dtype(node.attr["dtype"].type) for node in cluster.node
              if (j := earlier.get(node.name)) is not None}
    values = [value_before(op, j, dtypes[j]) for j in before]
    # A gradient arriving as IndexedSlices (a Gather downstream) is made dense: the
    # compiled gradient takes tensors.
    incoming = [tf.convert_to_tensor(output_gradients[i]) for i in present]
    return gradient, [*op.inputs, *values, *incoming]


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


def _reads_before_writes(cluster: tf.compat.v1.GraphDef, needed: tf.compat.v1.GraphDef,
                         written: set[int], launch: str) -> dict[str, int]:
    """The reads in `needed` of a variable the launch writes that come before its writes
    in the cluster (by its data and control edges, which hold TF's order of one
    variable's ops): read name -> launch input of the variable."""
    consumers: dict[str, list[str]] = {}
    producers: dict[str, list[str]] = {}
    for node in cluster.node:
        for reference in node.input:
            consumers.setdefault(_input_name(reference), []).append(node.name)
            producers.setdefault(node.name, []).append(_input_name(reference))
    handles = {f"{ORIGINAL_INPUT_PREFIX}{j}": j for j in written}
    writes: dict[int, list[str]] = {}
    for node in cluster.node:
        for reference in node.input[:WRITES.get(node.op, 0)]:
            if _input_name(reference) in handles:
                writes.setdefault(handles[_input_name(reference)], []).append(node.name)
    earlier: dict[str, int] = {}
    for node in needed.node:
        if node.op not in _READS or not node.input or _input_name(node.input[0]) not in handles:
            continue
        j = handles[_input_name(node.input[0])]
        after_a_write = node.name in _closure(writes.get(j, []), consumers)
        if not after_a_write:
            earlier[node.name] = j
        elif node.name in _closure(writes.get(j, []), producers):
            raise LookupError(
                f"tfxla-lite: launch node '{launch}' reads a variable between two of its "
                f"writes ({node.name}) where the differentiated outputs need that value, "
                "so it has no gradient (read it before or after the writes)")
    return earlier


def _closure(start: Sequence[str], edges: dict[str, list[str]]) -> set[str]:
    """The nodes reached from `start` along `edges`, `start` excluded."""
    seen: set[str] = set()
    pending = [n for name in start for n in edges.get(name, [])]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(edges.get(name, []))
    return seen


def _read_values_before(needed: tf.compat.v1.GraphDef, earlier: dict[str, int]) -> None:
    """Rewrite the reads of `earlier` in `needed` to read the placeholder of their
    variable's value before the launch (`BEFORE_PREFIX`) instead of the variable."""
    made: set[int] = set()
    for node in list(needed.node):
        if node.name not in earlier:
            continue
        j = earlier[node.name]
        dtype = node.attr["dtype"].type
        if j not in made:
            made.add(j)
            placeholder = needed.node.add(name=f"{BEFORE_PREFIX}{j}", op="Placeholder")
            placeholder.attr["dtype"].type = dtype
        source = f"{BEFORE_PREFIX}{j}"
        if node.op == "ReadVariableOp":
            node.op = "Identity"
            del node.input[:]
            node.input.append(source)
            del node.attr["dtype"]
            node.attr["T"].type = dtype
        else:  # ResourceGather: the same gather of the value
            batch_dims = node.attr["batch_dims"].i
            axis = needed.node.add(name=f"{node.name}/{BEFORE_PREFIX}axis", op="Const")
            axis.attr["dtype"].type = tf.int32.as_datatype_enum
            axis.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(batch_dims, tf.int32))
            indices = node.input[1]
            node.op = "GatherV2"
            del node.input[:]
            node.input.extend([source, indices, axis.name])
            index_type = node.attr["Tindices"].type
            for name in list(node.attr):
                del node.attr[name]
            node.attr["Tparams"].type = dtype
            node.attr["Tindices"].type = index_type
            node.attr["Taxis"].type = tf.int32.as_datatype_enum
            node.attr["batch_dims"].i = batch_dims
