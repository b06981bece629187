"""CUDA element generator for `convolution`: one output element per thread, a loop over
the window positions and the input features of its group (f16/bf16 accumulate in
float), reading the input only where a position lands on a real element. The same
order and rules as the CPU element generator (`codegen/cpu/convolution.py`)."""

from __future__ import annotations

from tfxla_lite.codegen.gpu.cuda_source import compute_type, literal
from tfxla_lite.codegen.gpu.elemental import (
    Index,
    KernelContext,
    binary_op,
    convert,
    register,
)
from tfxla_lite.hlo.convolution import ConvolutionDimensions, group_counts
from tfxla_lite.hlo.ir import Instruction


@register("convolution")
def emit_convolution(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    lhs, rhs = inst.operands
    element_type = inst.shape.element_type
    dnums: ConvolutionDimensions = inst.attributes["dim_labels"]
    window = inst.attributes["window"].dimensions
    feature_groups, batch_groups = group_counts(inst.attributes)
    out = index.get_multi(ctx)
    batch, feature = out[dnums.output_batch], out[dnums.output_feature]
    outputs = rhs.shape.dims[dnums.kernel_output_feature]
    group_inputs = rhs.shape.dims[dnums.kernel_input_feature]
    first_input = "0"
    if feature_groups > 1:
        first_input = f"({feature} / {outputs // feature_groups}) * {group_inputs}"
    if batch_groups > 1:
        per_group = lhs.shape.dims[dnums.input_batch] // batch_groups
        batch = f"({batch} + ({feature} / {outputs // batch_groups}) * {per_group})"
    w = ctx.writer
    accumulate = "f32" if element_type in ("f16", "bf16") else element_type
    accumulator = w.fresh("acc")
    w.line(f"{compute_type(accumulate)} {accumulator} = {literal(accumulate, 0)};")
    positions = []
    for d in window:
        name = w.fresh("w")
        w.open(f"for (long long {name} = 0; {name} < {d.size}; ++{name})")
        positions.append(name)
    with ctx.scope():
        checks = []
        lhs_multi = ["0"] * lhs.shape.rank
        rhs_multi = ["0"] * rhs.shape.rank
        for i, (d, position) in enumerate(zip(window, positions)):
            at = ctx.bind(f"{out[dnums.output_spatial[i]]} * {d.stride} + {position} * "
                          f"{d.window_dilation} - {d.padding_low}", "long long", "pos")
            checks.append(f"{at} >= 0")
            element = at
            if d.base_dilation != 1:
                checks.append(f"{at} % {d.base_dilation} == 0")
                element = f"({at} / {d.base_dilation})"
            checks.append(f"{element} < {lhs.shape.dims[dnums.input_spatial[i]]}")
            lhs_multi[dnums.input_spatial[i]] = element
            rhs_multi[dnums.kernel_spatial[i]] = (f"({d.size - 1} - {position})"
                                                  if d.window_reversal else position)
        lhs_multi[dnums.input_batch] = batch
        rhs_multi[dnums.kernel_output_feature] = feature
        k = w.fresh("k")
        w.open(f"if ({' && '.join(checks)})")
        w.open(f"for (long long {k} = 0; {k} < {group_inputs}; ++{k})")
        with ctx.scope():
            lhs_multi[dnums.input_feature] = f"({first_input} + {k})"
            rhs_multi[dnums.kernel_input_feature] = k
            x = convert(ctx.value(lhs, Index(lhs.shape.dims, list(lhs_multi))), element_type,
                        accumulate)
            y = convert(ctx.value(rhs, Index(rhs.shape.dims, list(rhs_multi))), element_type,
                        accumulate)
            product = binary_op("multiply", accumulate, x, y, inst)
            w.line(f"{accumulator} = {binary_op('add', accumulate, accumulator, product, inst)};")
        w.close()
        w.close()
    for _ in window:
        w.close()
    return convert(accumulator, accumulate, element_type)
