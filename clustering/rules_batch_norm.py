"""Lowering rules of TF's fused batch norm: FusedBatchNorm/V2/V3 (training and inference)
and FusedBatchNormGrad/V2/V3.

Registered into `registry.OP_RULES` on import. Each becomes primitive HLO, as XLA's
BatchNormExpander expands it, so that the fusions take it with its neighbours, with the
arithmetic of TF's CPU kernels (`fused_batch_norm_op.cc`) rather than XLA's: a two-pass
variance, Bessel-corrected running variance, TF's reserve spaces, NaN statistics of an
empty input; 2-byte floats compute in float32 and round once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfxla_lite.clustering.registry import (
    DATA_FORMATS,
    HALF,
    LoweringContext,
    LoweringError,
    attribute,
    register,
)
from tfxla_lite.hlo import Instruction

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]


def _check(op: tf.Operation) -> str | None:
    data_format = attribute(op, "data_format", "NHWC")
    if data_format not in DATA_FORMATS:
        return f"data_format {data_format}"
    rank = op.inputs[0].shape.rank
    if rank is not None and rank != len(data_format):
        return f"a rank-{rank} input for {data_format}"
    return None


class _Features:
    """The feature dimension of the op's layout, and how a per-feature vector spreads."""

    def __init__(self, op: tf.Operation, x: Instruction) -> None:
        data_format = attribute(op, "data_format", "NHWC")
        rank = x.shape.rank
        if rank != len(data_format):
            raise LoweringError(f"a rank-{rank} input for {data_format}")
        self.dims = x.shape.dims
        self.axis = rank - 1 if data_format.endswith("C") else 1
        self.reduced = tuple(d for d in range(rank) if d != self.axis)
        self.count = 1
        for d in self.reduced:
            self.count *= self.dims[d]

    def spread(self, ctx: LoweringContext, vector: Instruction) -> Instruction:
        dims = self.dims
        return ctx.emit("broadcast", [vector], shape=vector.shape.with_dims(dims),
                        dimensions=(self.axis,))

    def total(self, ctx: LoweringContext, x: Instruction) -> Instruction:
        return ctx.reduce(x, self.reduced, "add", 0)


def _binary(ctx: LoweringContext, opcode: str, a: Instruction, b: Instruction) -> Instruction:
    return ctx.emit(opcode, [a, b])


def _scalar_times(ctx: LoweringContext, x: Instruction, value: float) -> Instruction:
    return ctx.emit("multiply", [x, ctx.full(value, x.shape)])


def _scale_and_shift(ctx: LoweringContext, features: _Features, centered: Instruction,
                     variance: Instruction, scale: Instruction, offset: Instruction,
                     epsilon: float) -> Instruction:
    """(x - mean) * (rsqrt(variance + epsilon) * scale) + offset, in TF's order."""
    inv = ctx.emit("rsqrt", [_binary(ctx, "add", variance, ctx.full(epsilon, variance.shape))])
    factor = features.spread(ctx, _binary(ctx, "multiply", inv, scale))
    return _binary(ctx, "add", _binary(ctx, "multiply", centered, factor),
                   features.spread(ctx, offset))


_NOTE_FORWARD = ("training and inference, NHWC/NCHW (NDHWC/NCDHW), exponential_avg_factor; "
                 "TF's CPU arithmetic (two-pass variance); 2-byte floats compute in float32")


# TF's kernels: the first versions take float32 only; V2 and V3 float32 and the 2-byte
# floats (their statistics float32).
_V1_DTYPES = frozenset({"float32"})
_DTYPES = HALF | _V1_DTYPES


@register("FusedBatchNorm", dtypes=_V1_DTYPES, check=_check, note=_NOTE_FORWARD)
@register("FusedBatchNormV2", dtypes=_DTYPES, check=_check, note=_NOTE_FORWARD)
def _lower_batch_norm(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    x, scale, offset, old_mean, old_variance = operands[:5]
    etype = x.shape.element_type
    wide_type = scale.shape.element_type
    epsilon = float(attribute(op, "epsilon", 1e-4))
    features = _Features(op, x)
    wide = ctx.convert(x, wide_type)
    if x.shape.num_elements == 0:
        # TF's kernel, in either mode: NaN statistics and zero reserve spaces.
        nan, zero = ctx.full(float("nan"), scale.shape), ctx.full(0, scale.shape)
        outputs = [ctx.full(0, x.shape), nan, nan, zero, zero]
    elif not attribute(op, "is_training", True):
        centered = _binary(ctx, "subtract", wide, features.spread(ctx, old_mean))
        y = _scale_and_shift(ctx, features, centered, old_variance, scale, offset, epsilon)
        outputs = [ctx.convert(y, etype), old_mean, old_variance, old_mean, old_variance]
    else:
        count = features.count
        mean = _scalar_times(ctx, features.total(ctx, wide), 1.0 / count)
        centered = _binary(ctx, "subtract", wide, features.spread(ctx, mean))
        squares = features.total(ctx, _binary(ctx, "multiply", centered, centered))
        variance = _scalar_times(ctx, squares, 1.0 / count)
        y = _scale_and_shift(ctx, features, centered, variance, scale, offset, epsilon)
        corrected = _scalar_times(ctx, variance, count / max(count - 1, 1))
        factor = float(attribute(op, "exponential_avg_factor", 1.0))
        running_mean, running_variance = mean, corrected
        if factor != 1.0:
            running_mean = _binary(ctx, "add", _scalar_times(ctx, old_mean, 1.0 - factor),
                                   _scalar_times(ctx, mean, factor))
            running_variance = _binary(ctx, "add",
                                       _scalar_times(ctx, old_variance, 1.0 - factor),
                                       _scalar_times(ctx, corrected, factor))
        outputs = [ctx.convert(y, etype), running_mean, running_variance, mean, variance]
    if len(op.outputs) == 6:  # TF's CPU kernel leaves reserve space 3 empty
        outputs.append(ctx.full(0, ctx.output_shape(5)))
    return outputs


def _reserve_space_dims(op: tf.Operation, index: int) -> tuple[int, ...] | None:
    return (0,) if index == 5 else None


register("FusedBatchNormV3", dtypes=_DTYPES, check=_check, note=_NOTE_FORWARD,
         output_dims=_reserve_space_dims)(_lower_batch_norm)


_NOTE_GRADIENT = ("training and inference, NHWC/NCHW (NDHWC/NCDHW), reading the forward "
                  "op's reserve spaces; 2-byte floats compute in float32")


@register("FusedBatchNormGrad", dtypes=_V1_DTYPES, unused_inputs=(5,), check=_check,
          note=_NOTE_GRADIENT)
@register("FusedBatchNormGradV2", "FusedBatchNormGradV3", dtypes=_DTYPES, unused_inputs=(5,),
          check=_check, note=_NOTE_GRADIENT)
def _lower_batch_norm_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                           ) -> list[Instruction]:
    dy, x, scale, mean, variance = operands[:5]
    etype = x.shape.element_type
    wide_type = scale.shape.element_type
    epsilon = float(attribute(op, "epsilon", 1e-4))
    features = _Features(op, x)
    dy, x = ctx.convert(dy, wide_type), ctx.convert(x, wide_type)
    inv = ctx.emit("rsqrt", [_binary(ctx, "add", variance, ctx.full(epsilon, variance.shape))])
    centered = _binary(ctx, "subtract", x, features.spread(ctx, mean))
    x_scaled = _binary(ctx, "multiply", centered, features.spread(ctx, inv))
    offset_backprop = features.total(ctx, dy)
    scale_backprop = features.total(ctx, _binary(ctx, "multiply", dy, x_scaled))
    coefficient = features.spread(ctx, _binary(ctx, "multiply", scale, inv))
    if not attribute(op, "is_training", True):
        x_backprop = _binary(ctx, "multiply", dy, coefficient)
    else:
        count = features.count
        per_element = 1.0 / count if count else float("nan")
        mean_dy = _scalar_times(ctx, offset_backprop, per_element)
        mean_dy_centered = _scalar_times(
            ctx, features.total(ctx, _binary(ctx, "multiply", dy, centered)), per_element)
        slope = _binary(ctx, "multiply", _binary(ctx, "multiply", inv, inv), mean_dy_centered)
        deviation = _binary(ctx, "subtract",
                            _binary(ctx, "subtract", dy, features.spread(ctx, mean_dy)),
                            _binary(ctx, "multiply", centered, features.spread(ctx, slope)))
        x_backprop = _binary(ctx, "multiply", coefficient, deviation)
    outputs = [ctx.convert(x_backprop, etype), scale_backprop, offset_backprop]
    outputs += [ctx.full(0, ctx.output_shape(i)) for i in range(3, len(op.outputs))]
    return outputs
