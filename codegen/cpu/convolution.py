"""CPU code for `convolution`: the element generator, for every convolution.

Each output element is a loop over the window positions and then the input features of
its group, reading the input where the position lands on a real element (not padding,
not a base-dilation hole), accumulating f16/bf16 in f32 as dots do. It is correct for
every attribute (groups, dilations, negative padding, reversal, any layout) and is what
fused or unusual convolutions run; GEMM-shaped convolutions run as patches and library
GEMM calls instead (`convolution_gemm.py`).
"""

from __future__ import annotations

from llvmlite import ir

from tfxla_lite.codegen.cpu.elementwise import binary_op, convert
from tfxla_lite.codegen.cpu.emitter import (
    I1,
    Index,
    KernelContext,
    constant,
    i64,
    register,
    value_type,
)
from tfxla_lite.hlo.convolution import ConvolutionDimensions, group_counts
from tfxla_lite.hlo.ir import Instruction


def accumulator_type(element_type: str) -> str:
    """The type a convolution sums in: f32 for the 2-byte floats."""
    return "f32" if element_type in ("f16", "bf16") else element_type


@register("convolution")
def emit_convolution(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    lhs, rhs = inst.operands
    element_type = inst.shape.element_type
    dnums: ConvolutionDimensions = inst.attributes["dim_labels"]
    window = inst.attributes["window"].dimensions
    feature_groups, batch_groups = group_counts(inst.attributes)
    b = ctx.builder
    out = index.get_multi(b)
    batch, feature = out[dnums.output_batch], out[dnums.output_feature]
    outputs = rhs.shape.dims[dnums.kernel_output_feature]
    group_inputs = rhs.shape.dims[dnums.kernel_input_feature]
    # The input features this output feature reads, and the input batch element.
    first_input: ir.Value = i64(0)
    if feature_groups > 1:
        group = b.udiv(feature, i64(outputs // feature_groups))
        first_input = b.mul(group, i64(group_inputs))
    if batch_groups > 1:
        group = b.udiv(feature, i64(outputs // batch_groups))
        per_group = lhs.shape.dims[dnums.input_batch] // batch_groups
        batch = b.add(batch, b.mul(group, i64(per_group)))
    accumulate = accumulator_type(element_type)
    accumulator = ctx.alloca(value_type(accumulate), name="convolution.accumulator")
    b.store(constant(accumulate, 0), accumulator)
    with ctx.loop_nest(tuple(d.size for d in window), name="window") as position:
        inside: ir.Value = ir.Constant(I1, 1)
        lhs_multi: list[ir.Value] = [i64(0)] * lhs.shape.rank
        rhs_multi: list[ir.Value] = [i64(0)] * rhs.shape.rank
        for i, d in enumerate(window):
            at = b.add(b.mul(out[dnums.output_spatial[i]], i64(d.stride)),
                       b.mul(position[i], i64(d.window_dilation)))
            at = b.sub(at, i64(d.padding_low))
            element = at
            inside = b.and_(inside, b.icmp_signed(">=", at, i64(0)))
            if d.base_dilation != 1:
                inside = b.and_(inside, b.icmp_signed(
                    "==", b.srem(at, i64(d.base_dilation)), i64(0)))
                element = b.sdiv(at, i64(d.base_dilation))
            size = lhs.shape.dims[dnums.input_spatial[i]]
            inside = b.and_(inside, b.icmp_signed("<", element, i64(size)))
            lhs_multi[dnums.input_spatial[i]] = element
            kernel = b.sub(i64(d.size - 1), position[i]) if d.window_reversal else position[i]
            rhs_multi[dnums.kernel_spatial[i]] = kernel
        lhs_multi[dnums.input_batch] = batch
        rhs_multi[dnums.kernel_output_feature] = feature
        with b.if_then(inside), ctx.scope(), ctx.loop(group_inputs, name="feature") as k:
            lhs_multi[dnums.input_feature] = b.add(first_input, k)
            rhs_multi[dnums.kernel_input_feature] = k
            x = convert(ctx, ctx.value(lhs, Index(lhs.shape.dims, list(lhs_multi))),
                        element_type, accumulate)
            y = convert(ctx, ctx.value(rhs, Index(rhs.shape.dims, list(rhs_multi))),
                        element_type, accumulate)
            product = binary_op(ctx, "multiply", accumulate, x, y, inst)
            b.store(binary_op(ctx, "add", accumulate, b.load(accumulator), product, inst),
                    accumulator)
    return convert(ctx, b.load(accumulator), accumulate, element_type)
