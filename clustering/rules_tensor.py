"""Lowering rules of TF's whole-tensor ops: constants, shapes, reductions, dots, softmax.

Registered into `registry.OP_RULES` on import. Shape-changing ops (Reshape,
ExpandDims, Squeeze) need no constant inputs: every shape is static here, so the
result shape alone says what to build. Axes and permutations are read at compile
time from Const inputs (`static_inputs`), as TF's XLA bridge requires.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.clustering.registry import (
    ALL,
    BOOL,
    FLOAT,
    INTEGER,
    NUMERIC,
    LoweringContext,
    LoweringError,
    constant_value,
    element_type,
    register,
    same_dims_as_input,
    static_dims,
    value_range,
)
from tfxla_lite.hlo import Instruction, numpy_dtype
from tfxla_lite.hlo.shape import FLOAT_TYPES

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]


# -- sources -----------------------------------------------------------------------------------
@register("Const", dtypes=ALL)
def _lower_const(ctx: LoweringContext, op: tf.Operation, operands: Operands
                 ) -> list[Instruction]:
    value = constant_value(op.outputs[0])
    assert value is not None
    return [ctx.constant(value, element_type(op.outputs[0].dtype))]


@register("Shape", dtypes=INTEGER, unused_inputs=(0,))
def _lower_shape(ctx: LoweringContext, op: tf.Operation, operands: Operands
                 ) -> list[Instruction]:
    dims = static_dims(op.inputs[0])
    assert dims is not None
    return [ctx.constant(np.array(dims), ctx.output_shape().element_type)]


# Convolution gradients take their input and filter sizes from a ShapeN. Its inputs are
# all value-free: negative indices count from the end, so these cover every input of a
# ShapeN of up to 1024 (a larger one is refused by its inputs' dtypes).
@register("ShapeN", dtypes=INTEGER, unused_inputs=tuple(range(-1024, 0)),
          note="folded to constants: the inputs' shapes are static")
def _lower_shape_n(ctx: LoweringContext, op: tf.Operation, operands: Operands
                   ) -> list[Instruction]:
    etype = ctx.output_shape().element_type
    results = []
    for tensor in op.inputs:
        dims = static_dims(tensor)
        if dims is None:
            raise LoweringError(f"shape of {tensor.name} is not fully static: {tensor.shape}")
        results.append(ctx.constant(np.array(dims), etype))
    return results


# ConcatV2's gradient slices its output gradient at these offsets: the axis and the N
# shapes (inputs 0..N) are all static.
@register("ConcatOffset", dtypes=INTEGER, static_inputs=(-1,), static_leading="N",
          note="folded to constants")
def _lower_concat_offset(ctx: LoweringContext, op: tf.Operation, operands: Operands
                         ) -> list[Instruction]:
    shapes = [ctx.static_input(i).reshape(-1) for i in range(1, len(op.inputs))]
    rank = len(shapes[0])
    axis = int(ctx.static_input(0))
    if not -rank <= axis < rank:
        raise LoweringError(f"ConcatOffset axis {axis} out of range for rank {rank}")
    axis %= rank
    etype = ctx.output_shape().element_type
    results, offset = [], 0
    for shape in shapes:
        if len(shape) != rank or any(shape[d] != shapes[0][d] for d in range(rank)
                                     if d != axis):
            raise LoweringError(f"ConcatOffset shapes {[list(s) for s in shapes]} differ "
                                f"outside axis {axis}")
        value = np.zeros(rank, np.int64)
        value[axis] = offset
        results.append(ctx.constant(value, etype))
        offset += int(shape[axis])
    return results


@register("Rank", "Size", dtypes=INTEGER, unused_inputs=(0,))
def _lower_rank_and_size(ctx: LoweringContext, op: tf.Operation, operands: Operands
                         ) -> list[Instruction]:
    dims = static_dims(op.inputs[0])
    assert dims is not None
    value = len(dims) if op.type == "Rank" else int(np.prod(dims, dtype=np.int64))
    return [ctx.constant(np.array(value), ctx.output_shape().element_type)]


# TF's Range has no float16 (its shape function rejects it); bfloat16 it has.
@register("Range", dtypes=NUMERIC - {"float16"}, static_inputs=(0, 1, 2))
def _lower_range(ctx: LoweringContext, op: tf.Operation, operands: Operands
                 ) -> list[Instruction]:
    out = ctx.output_shape()
    start, limit, delta = (ctx.static_input(i)[()] for i in range(3))
    values = np.arange(start, limit, delta, dtype=numpy_dtype(out.element_type))
    if values.shape != out.dims:
        raise LoweringError(f"Range({start}, {limit}, {delta}) has {values.size} elements, "
                            f"TF says {out.dims}")
    return [ctx.constant(values, out.element_type)]


def _check_zeros_like(op: tf.Operation) -> str | None:
    from tfxla_lite.clustering.rules_control_flow import zeros_list_refusal

    return zeros_list_refusal(op) if op.outputs[0].dtype.name == "variant" else None


@register("ZerosLike", dtypes=ALL, unused_inputs=(0,), output_dims=same_dims_as_input(0),
          check=_check_zeros_like, note="of a TensorList: one whose length is its capacity")
def _lower_zeros_like(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    if op.outputs[0].dtype.name == "variant":  # a gradient's zeros for a TensorList
        from tfxla_lite.clustering.rules_control_flow import zeros_list

        return [zeros_list(ctx, op)]
    return [ctx.full(0, ctx.output_shape())]


@register("OnesLike", dtypes=ALL, unused_inputs=(0,), output_dims=same_dims_as_input(0))
def _lower_ones_like(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    return [ctx.full(1, ctx.output_shape())]


@register("Fill", dtypes=ALL, unused_inputs=(0,))
def _lower_fill(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    return [ctx.broadcast_to(operands[1], ctx.output_shape().dims)]


@register("BroadcastTo", dtypes=ALL, unused_inputs=(1,))
def _lower_broadcast_to(ctx: LoweringContext, op: tf.Operation, operands: Operands
                        ) -> list[Instruction]:
    return [ctx.broadcast_to(operands[0], ctx.output_shape().dims)]


# -- shapes and layouts ------------------------------------------------------------------------
@register("Reshape", "ExpandDims", dtypes=ALL, unused_inputs=(1,))
@register("Squeeze", dtypes=ALL)
def _lower_reshape(ctx: LoweringContext, op: tf.Operation, operands: Operands
                   ) -> list[Instruction]:
    # The static result shape already resolves -1 and says where size-1 dims go.
    return [ctx.reshape(operands[0], ctx.output_shape().dims)]


@register("Transpose", dtypes=ALL, static_inputs=(1,))
def _lower_transpose(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    x = operands[0]
    perm = tuple(int(p) % max(x.shape.rank, 1) for p in ctx.static_input(1).reshape(-1))
    if perm == tuple(range(x.shape.rank)):
        return [x]
    return [ctx.emit("transpose", [x], dimensions=perm)]


@register("InvertPermutation", dtypes=INTEGER, static_inputs=(0,),
          note="a constant permutation (the gradient of a Transpose)")
def _lower_invert_permutation(ctx: LoweringContext, op: tf.Operation, operands: Operands
                              ) -> list[Instruction]:
    perm = ctx.static_input(0).reshape(-1).astype(np.int64)
    if sorted(perm.tolist()) != list(range(perm.size)):
        raise LoweringError(f"{perm.tolist()} is not a permutation")
    return [ctx.constant(np.argsort(perm), ctx.output_shape().element_type)]


@register("ConcatV2", dtypes=ALL, static_inputs=(-1,))
def _lower_concat(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    pieces = operands[:-1]
    rank = pieces[0].shape.rank
    axis = int(ctx.static_input(len(op.inputs) - 1)) % rank
    if len(pieces) == 1:
        return [pieces[0]]
    return [ctx.emit("concatenate", pieces, dimensions=(axis,))]


@register("Pack", dtypes=ALL)
def _lower_pack(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    out = ctx.output_shape()
    axis = int(op.get_attr("axis")) % out.rank
    piece_dims = list(out.dims)
    piece_dims[axis] = 1
    pieces = [ctx.reshape(x, piece_dims) for x in operands]
    if len(pieces) == 1:
        return pieces
    return [ctx.emit("concatenate", pieces, dimensions=(axis,))]


@register("Slice", dtypes=ALL, static_inputs=(1, 2))
def _lower_slice(ctx: LoweringContext, op: tf.Operation, operands: Operands
                 ) -> list[Instruction]:
    x = operands[0]
    begin = [int(b) for b in ctx.static_input(1).reshape(-1)]
    size = [int(s) for s in ctx.static_input(2).reshape(-1)]
    spec = []
    for start, length, extent in zip(begin, size, x.shape.dims):
        stop = extent if length == -1 else start + length
        spec.append((start, stop, 1))
    return [ctx.emit("slice", [x], slice=tuple(spec))]


# -- reductions --------------------------------------------------------------------------------
def _reduction_axes(ctx: LoweringContext, x: Instruction) -> list[int]:
    rank = x.shape.rank
    axes = ctx.static_input(1).reshape(-1)
    if rank == 0:
        return []
    return sorted({int(a) % rank for a in axes})


def _lowest(etype: str) -> Any:
    return -np.inf if etype in FLOAT_TYPES else value_range(etype)[0]


def _highest(etype: str) -> Any:
    return np.inf if etype in FLOAT_TYPES else value_range(etype)[1]


def _reduction(kind: str, init: Any) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        x = operands[0]
        axes = _reduction_axes(ctx, x)
        start = init(x.shape.element_type) if callable(init) else init
        reduced = ctx.reduce(x, axes, kind, start)
        return [ctx.reshape(reduced, ctx.output_shape().dims)]  # keep_dims

    lower.__doc__ = f"TF's reduction over constant axes as HLO `reduce` with `{kind}`."
    return lower


register("Sum", dtypes=NUMERIC, static_inputs=(1,))(_reduction("add", 0))
register("Prod", dtypes=NUMERIC, static_inputs=(1,))(_reduction("multiply", 1))
# `maximum`/`minimum` propagate NaN, as TF's Max/Min reductions do.
register("Max", dtypes=NUMERIC, static_inputs=(1,))(_reduction("maximum", _lowest))
register("Min", dtypes=NUMERIC, static_inputs=(1,))(_reduction("minimum", _highest))
register("Any", dtypes=BOOL, static_inputs=(1,))(_reduction("or", False))
register("All", dtypes=BOOL, static_inputs=(1,))(_reduction("and", True))


@register("Mean", dtypes=NUMERIC, static_inputs=(1,))
def _lower_mean(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    # TF divides the sum by the count in the input dtype: integer means truncate, and an
    # empty float mean is 0/0 = NaN. 2-byte floats sum and divide in f32 (a count of
    # 65520 or more is inf in f16).
    x = operands[0]
    etype = x.shape.element_type
    if etype in ("f16", "bf16"):
        x = ctx.convert(x, "f32")
    axes = _reduction_axes(ctx, x)
    total = ctx.reduce(x, axes, "add", 0)
    count = int(np.prod([x.shape.dims[a] for a in axes], dtype=np.int64))
    mean = ctx.emit("divide", [total, ctx.full(count, total.shape)])
    return [ctx.reshape(ctx.convert(mean, etype), ctx.output_shape().dims)]


# -- dots --------------------------------------------------------------------------------------
MATMUL_DTYPES = FLOAT | {"int32"}


@register("MatMul", dtypes=MATMUL_DTYPES)
def _lower_matmul(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    # Transposed operands become other contracting dims: no transpose instruction.
    a, b = operands
    return [ctx.dot(a, b, lhs_contracting_dims=(0 if op.get_attr("transpose_a") else 1,),
                    rhs_contracting_dims=(1 if op.get_attr("transpose_b") else 0,))]


def _check_batch_matmul(op: tf.Operation) -> str | None:
    # BatchMatMulV3 may mix input and output dtypes; only the uniform form compiles.
    dtypes = {t.dtype for t in list(op.inputs) + list(op.outputs)}
    return None if len(dtypes) == 1 else f"{op.type} with mixed dtypes"


@register("BatchMatMulV2", "BatchMatMul", "BatchMatMulV3", dtypes=MATMUL_DTYPES,
          check=_check_batch_matmul)
def _lower_batch_matmul(ctx: LoweringContext, op: tf.Operation, operands: Operands
                        ) -> list[Instruction]:
    x, y = operands
    batch = ctx.output_shape().dims[:-2]
    x = ctx.broadcast_to(x, batch + x.shape.dims[-2:])
    y = ctx.broadcast_to(y, batch + y.shape.dims[-2:])
    n = len(batch)
    # adj_x/adj_y: conjugate transposes, plain transposes for real dtypes.
    return [ctx.dot(x, y, lhs_batch_dims=tuple(range(n)), rhs_batch_dims=tuple(range(n)),
                    lhs_contracting_dims=(n + (0 if op.get_attr("adj_x") else 1),),
                    rhs_contracting_dims=(n + (1 if op.get_attr("adj_y") else 0),))]


def check_bias_data_format(op: tf.Operation) -> str | None:
    if op.type == "BiasAddV1":  # no data_format attr: always channels last
        return None
    data_format = op.get_attr("data_format")
    data_format = data_format.decode() if isinstance(data_format, bytes) else data_format
    if data_format not in ("NHWC", "NCHW"):
        return f"data_format {data_format} not supported by BiasAdd"
    return None


def bias_channel(op: tf.Operation, rank: int) -> int:
    """The channel axis of a BiasAdd or BiasAddGrad: 1 for NCHW of rank > 2, else the last."""
    data_format = op.get_attr("data_format") if op.type != "BiasAddV1" else b"NHWC"
    channels_first = data_format in (b"NCHW", "NCHW") and rank > 2
    return 1 if channels_first else rank - 1


@register("BiasAdd", "BiasAddV1", dtypes=NUMERIC, check=check_bias_data_format)
def _lower_bias_add(ctx: LoweringContext, op: tf.Operation, operands: Operands
                    ) -> list[Instruction]:
    value, bias = operands
    channel = bias_channel(op, value.shape.rank)
    spread = ctx.emit("broadcast", [bias], shape=value.shape, dimensions=(channel,))
    return [ctx.emit("add", [value, spread])]


# -- softmax -----------------------------------------------------------------------------------
def softmax_parts(ctx: LoweringContext, logits: Instruction
                   ) -> tuple[Instruction, Instruction, Instruction]:
    """(logits - max, its exp, the sum of that exp) along the last axis, all broadcast."""
    if logits.shape.rank == 0:
        raise LoweringError("softmax needs rank >= 1")
    last = logits.shape.rank - 1
    kept = tuple(range(last))
    peak = ctx.reduce(logits, [last], "maximum", -np.inf)
    shifted = ctx.emit("subtract", [logits, ctx.emit("broadcast", [peak], shape=logits.shape,
                                                     dimensions=kept)])
    exponent = ctx.emit("exponential", [shifted])
    total = ctx.reduce(exponent, [last], "add", 0)
    return shifted, exponent, ctx.emit("broadcast", [total], shape=logits.shape,
                                       dimensions=kept)


@register("Softmax", dtypes=FLOAT)
def _lower_softmax(ctx: LoweringContext, op: tf.Operation, operands: Operands
                   ) -> list[Instruction]:
    _, exponent, total = softmax_parts(ctx, operands[0])
    return [ctx.emit("divide", [exponent, total])]


@register("LogSoftmax", dtypes=FLOAT)
def _lower_log_softmax(ctx: LoweringContext, op: tf.Operation, operands: Operands
                       ) -> list[Instruction]:
    shifted, _, total = softmax_parts(ctx, operands[0])
    return [ctx.emit("subtract", [shifted, ctx.emit("log", [total])])]
