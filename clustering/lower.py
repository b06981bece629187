"""Lowering: one cluster of a TF graph → one `HloModule`.

The last step of clustering (mark → cluster → lower), handing HLO to
`tfxla_lite.passes` and codegen. The entry computation takes the cluster's
`inputs` as parameters `arg0, arg1, ...` (in that order), lowers each op in
topological order through its registry rule, and returns the tuple of the
cluster's `outputs` (in that order). Const values are embedded when first read,
so unused ones (axes, permutations) leave no instruction behind.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tfxla_lite.clustering.cluster import Cluster
from tfxla_lite.clustering.registry import (
    OP_RULES,
    LoweringContext,
    LoweringError,
    element_type,
    known_dims,
    source_frames,
    tensor_shape,
)
from tfxla_lite.clustering.rules_variables import written_variables
from tfxla_lite.hlo import HloModule, Instruction, Shape
from tfxla_lite.hlo.shape import MAX_ARRAY_SIZE

if TYPE_CHECKING:
    import tensorflow as tf


def lower_cluster(graph: tf.Graph, cluster: Cluster, name: str | None = None) -> HloModule:
    """The HLO of `cluster`: parameters are `cluster.inputs` (a variable's handle: its
    value), the root tuples `outputs` and then the values of the variables it writes."""
    module = HloModule(name or cluster.name)
    entry = module.new_computation("main", entry=True)
    ctx = LoweringContext(module, entry)
    values: dict[str, Instruction] = {}
    for number, tensor_name in enumerate(cluster.inputs):
        tensor = graph.get_tensor_by_name(tensor_name)
        if tensor.dtype.base_dtype.name == "variant":
            raise LoweringError(f"{cluster.name}: TensorList {tensor_name} would cross the "
                                f"cluster's boundary")
        values[tensor_name] = entry.add_parameter(number, tensor_shape(tensor), f"arg{number}")
    operations = [graph.get_operation_by_name(n) for n in cluster.op_names]
    outputs = lower_ops(ctx, operations, values,
                        [graph.get_tensor_by_name(n) for n in cluster.outputs], cluster.name)
    if any(o.shape.is_tuple for o in outputs):
        raise LoweringError(f"{cluster.name}: a TensorList would leave the cluster")
    # Then each written variable's last value, which the launch op stores into it.
    outputs += [ctx.variables[h] for h in written_variables(graph, cluster.op_names)]
    entry.root = entry.create("tuple", outputs)
    return module


def lower_ops(ctx: LoweringContext, operations: list[tf.Operation],
              values: dict[str, Instruction], outputs: list[tf.Tensor], where: str
              ) -> list[Instruction]:
    """Lower `operations` (in topological order) into `ctx`'s computation, given the
    values of the tensors they read from elsewhere (`values`, by tensor name, updated
    with theirs); returns the values of `outputs`. Shared by clusters and the bodies of
    loops and branches (clustering/rules_control_flow.py)."""

    def value_of(tensor: tf.Tensor) -> Instruction:
        if tensor.name in values:
            return values[tensor.name]
        if tensor.op.type == "Const":  # embedded on first use, wherever the Const lives
            ctx.begin(tensor.op)
            (values[tensor.name],) = OP_RULES["Const"].lower(ctx, tensor.op, [])
            return values[tensor.name]
        raise LoweringError(f"{where}: tensor {tensor.name} is neither made inside "
                            f"the cluster nor one of its inputs")

    for op in operations:
        if op.type == "Const":
            continue
        rule = OP_RULES.get(op.type)
        if rule is None:
            raise LoweringError(f"op type {op.type} has no lowering ({op.name})")
        value_free = rule.value_free_indices(op)
        operands: list[Any] = [None if i in value_free else value_of(t)
                               for i, t in enumerate(op.inputs)]
        _check_sizes(op)
        ctx.begin(op)
        results = rule.lower(ctx, op, operands)
        _check_results(op, results)
        for tensor, result in zip(op.outputs, results):
            values[tensor.name] = result
    return [value_of(t) for t in outputs]


def _check_results(op: tf.Operation, results: list[Instruction]) -> None:
    """Each lowering must give one HLO value per TF output, of the TF output's shape."""
    if len(results) != len(op.outputs):
        raise LoweringError(f"lowering of {op.type} {op.name} gave {len(results)} values for "
                            f"{len(op.outputs)} outputs")
    for tensor, result in zip(op.outputs, results):
        if tensor.dtype.base_dtype.name == "resource":  # a loop's variable, passed on
            continue
        if tensor.dtype.base_dtype.name == "variant":
            if not result.shape.is_tuple:  # a TensorList is (buffer, length)
                raise LoweringError(f"lowering of {op.type} {op.name} gave {result.shape} "
                                    f"for TensorList {tensor.name}")
            continue
        dims = known_dims(tensor)
        if dims is None:
            raise LoweringError(f"shape of {tensor.name} is not known at compile time")
        expected = Shape(element_type(tensor.dtype), dims)
        if result.shape != expected:
            raise LoweringError(f"lowering of {op.type} {op.name} gave {result.shape} for "
                                f"output {tensor.name} of shape {expected}")


def _check_sizes(op: tf.Operation) -> None:
    """An output past the int64 limit is refused with the op's name and source line
    before its rule runs (TF raises InvalidArgumentError for it; compiled as is, a
    broadcast of 2^65 elements feeding a sum ran a loop nest that never ended). `Shape`
    refuses such shapes too, but cannot say which op asked for one."""
    for tensor in op.outputs:
        dims = known_dims(tensor)
        if dims is None or tensor.dtype.is_quantized or tensor.dtype.size == 0:
            continue
        count = math.prod(dims)
        if count * tensor.dtype.size > MAX_ARRAY_SIZE:
            where = source_frames(op)
            raise LoweringError(
                f"{op.type} {op.name}{f' ({where})' if str(where) else ''} makes "
                f"{tensor.name} of shape {list(dims)}: {count} elements of "
                f"{tensor.dtype.name}, more than a tensor can hold (2^63-1 elements and "
                f"bytes)")
