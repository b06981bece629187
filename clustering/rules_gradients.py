"""Lowering rules of the gradient ops that `tf.GradientTape` and Keras training emit.

Registered into `registry.OP_RULES` on import. Each follows the arithmetic of TF's own
CPU kernel (Eigen functors in relu_op_functor.h, cwise_ops_gradients.h, ...) operation
by operation, so that NaN and inf land where TF puts them: a ReluGrad multiplies by a
0/1 mask (NaN gradients stay NaN), a LeakyReluGrad selects. BroadcastGradientArgs has
only static inputs: its outputs are constants, folded into the reductions that read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.clustering.registry import (
    FLOAT,
    INTEGER,
    NUMERIC,
    LoweringContext,
    element_type,
    register,
)
from tfxla_lite.clustering.rules_elementwise import SELU_SCALE, SELU_SCALE_ALPHA
from tfxla_lite.clustering.rules_tensor import bias_channel, check_bias_data_format
from tfxla_lite.hlo import Instruction

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]


def _mask(ctx: LoweringContext, predicate: Instruction, like: Instruction) -> Instruction:
    """A 0/1 mask of `like`'s type: TF multiplies gradients by it."""
    return ctx.convert(predicate, like.shape.element_type)


def _compare_constant(ctx: LoweringContext, x: Instruction, value: float, direction: str
                      ) -> Instruction:
    return ctx.emit("compare", [x, ctx.full(value, x.shape)], direction=direction)


# -- activations: (gradients, features) ---------------------------------------------------------
@register("ReluGrad", dtypes=NUMERIC)
def _lower_relu_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    gradients, features = operands
    positive = _compare_constant(ctx, features, 0, "GT")
    return [ctx.emit("multiply", [gradients, _mask(ctx, positive, gradients)])]


@register("Relu6Grad", dtypes=NUMERIC)
def _lower_relu6_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    gradients, features = operands
    inside = ctx.emit("and", [_compare_constant(ctx, features, 0, "GT"),
                              _compare_constant(ctx, features, 6, "LT")])
    return [ctx.emit("multiply", [gradients, _mask(ctx, inside, gradients)])]


@register("LeakyReluGrad", dtypes=FLOAT)
def _lower_leaky_relu_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                           ) -> list[Instruction]:
    gradients, features = operands
    alpha = ctx.full(float(op.get_attr("alpha")), gradients.shape)
    positive = _compare_constant(ctx, features, 0, "GT")
    return [ctx.emit("select", [positive, gradients,
                                ctx.emit("multiply", [gradients, alpha])])]


@register("SoftplusGrad", dtypes=FLOAT)
def _lower_softplus_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                         ) -> list[Instruction]:
    # gradients / (exp(-features) + 1)
    gradients, features = operands
    denominator = ctx.emit("add", [ctx.emit("exponential", [ctx.emit("negate", [features])]),
                                   ctx.full(1, features.shape)])
    return [ctx.emit("divide", [gradients, denominator])]


@register("SoftsignGrad", dtypes=FLOAT)
def _lower_softsign_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                         ) -> list[Instruction]:
    # gradients / (|features| + 1)²
    gradients, features = operands
    denominator = ctx.emit("add", [ctx.emit("abs", [features]), ctx.full(1, features.shape)])
    return [ctx.emit("divide", [gradients, ctx.emit("multiply", [denominator, denominator])])]


# -- activations: (gradients, outputs) ----------------------------------------------------------
@register("EluGrad", dtypes=FLOAT)
def _lower_elu_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                    ) -> list[Instruction]:
    # outputs < 0 ? (outputs + 1) * gradients : gradients
    gradients, outputs = operands
    negative = _compare_constant(ctx, outputs, 0, "LT")
    below = ctx.emit("multiply", [ctx.emit("add", [outputs, ctx.full(1, outputs.shape)]),
                                  gradients])
    return [ctx.emit("select", [negative, below, gradients])]


@register("SeluGrad", dtypes=FLOAT)
def _lower_selu_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    # outputs < 0 ? gradients * (outputs + scale * alpha) : gradients * scale
    gradients, outputs = operands
    negative = _compare_constant(ctx, outputs, 0, "LT")
    shifted = ctx.emit("add", [outputs, ctx.full(SELU_SCALE_ALPHA, outputs.shape)])
    below = ctx.emit("multiply", [gradients, shifted])
    above = ctx.emit("multiply", [gradients, ctx.full(SELU_SCALE, gradients.shape)])
    return [ctx.emit("select", [negative, below, above])]


# -- unary math: (y, dy), y the op's output -------------------------------------------------------
def _zero_where_dy_is_zero(ctx: LoweringContext, dy: Instruction, value: Instruction
                           ) -> Instruction:
    """TF's Sqrt, Rsqrt and Reciprocal gradients give 0 for a zero dy, even where the
    formula gives NaN (y = 0 or inf)."""
    zero = ctx.full(0, dy.shape)
    return ctx.emit("select", [ctx.emit("compare", [dy, zero], direction="EQ"), zero, value])



@register("SigmoidGrad", dtypes=FLOAT)
def _lower_sigmoid_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                        ) -> list[Instruction]:
    # dy * y * (1 - y)
    y, dy = operands
    one_minus = ctx.emit("subtract", [ctx.full(1, y.shape), y])
    return [ctx.emit("multiply", [ctx.emit("multiply", [dy, y]), one_minus])]


@register("TanhGrad", dtypes=FLOAT)
def _lower_tanh_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    # dy * (1 - y * y)
    y, dy = operands
    one_minus = ctx.emit("subtract", [ctx.full(1, y.shape), ctx.emit("multiply", [y, y])])
    return [ctx.emit("multiply", [dy, one_minus])]


@register("SqrtGrad", dtypes=FLOAT)
def _lower_sqrt_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    # dy == 0 ? 0 : 0.5 * dy / y
    y, dy = operands
    half = ctx.emit("multiply", [ctx.full(0.5, dy.shape), dy])
    return [_zero_where_dy_is_zero(ctx, dy, ctx.emit("divide", [half, y]))]


@register("RsqrtGrad", dtypes=FLOAT)
def _lower_rsqrt_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    # dy == 0 ? 0 : -0.5 * (dy * y) * (y * y)
    y, dy = operands
    scaled = ctx.emit("multiply", [ctx.full(-0.5, y.shape), ctx.emit("multiply", [dy, y])])
    return [_zero_where_dy_is_zero(ctx, dy, ctx.emit("multiply", [scaled,
                                                                  ctx.emit("multiply", [y, y])]))]


@register("ReciprocalGrad", "InvGrad", dtypes=FLOAT)
def _lower_reciprocal_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                           ) -> list[Instruction]:
    # dy == 0 ? 0 : -y * y * dy
    y, dy = operands
    square = ctx.emit("multiply", [ctx.emit("negate", [y]), y])
    return [_zero_where_dy_is_zero(ctx, dy, ctx.emit("multiply", [square, dy]))]


# -- shapes ---------------------------------------------------------------------------------------
@register("BiasAddGrad", dtypes=NUMERIC, check=check_bias_data_format)
def _lower_bias_add_grad(ctx: LoweringContext, op: tf.Operation, operands: Operands
                         ) -> list[Instruction]:
    (out_backprop,) = operands
    channel = bias_channel(op, out_backprop.shape.rank)
    axes = [a for a in range(out_backprop.shape.rank) if a != channel]
    return [ctx.reduce(out_backprop, axes, "add", 0)]


def broadcast_gradient_args(s0: np.ndarray, s1: np.ndarray) -> tuple[list[int], list[int]]:
    """The axes to sum each operand's gradient over, as TF's BCast::GradReduce gives them."""
    s0, s1 = [int(d) for d in s0], [int(d) for d in s1]
    rank = max(len(s0), len(s1))
    a = [1] * (rank - len(s0)) + s0
    b = [1] * (rank - len(s1)) + s1
    r0, r1 = [], []
    for axis, (x, y) in enumerate(zip(a, b)):
        if x == y:  # TF keeps equal dims, even equal 1s, out of both lists... except 1 vs 1
            if x == 1:
                r0.append(axis)
                r1.append(axis)
            continue
        if x == 1:
            r0.append(axis)
        elif y == 1:
            r1.append(axis)
        else:
            raise ValueError(f"incompatible shapes {s0} and {s1}")
    return r0, r1


@register("BroadcastGradientArgs", dtypes=INTEGER, static_inputs=(0, 1),
          note="outputs are compile-time constants")
def _lower_broadcast_gradient_args(ctx: LoweringContext, op: tf.Operation, operands: Operands
                                   ) -> list[Instruction]:
    r0, r1 = broadcast_gradient_args(ctx.static_input(0), ctx.static_input(1))
    etype = element_type(op.outputs[0].dtype)
    return [ctx.constant(np.array(r, dtype=np.int64), etype) for r in (r0, r1)]
