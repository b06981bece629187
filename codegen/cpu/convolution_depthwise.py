"""CPU code for depthwise convolutions and their filter gradients: direct loops,
vectorized over the channels.

A depthwise convolution (channels-last, `feature_group_count` = the input's channels C,
one input feature per group, C·M outputs: `rules_conv.py`'s DepthwiseConv2dNative and
the unstrided phases of its backprop-input) is no GEMM: each output pixel is a sum over
the window positions of the input pixel's C channels times that position's C·M
weights. The kernel walks blocks of output pixels (the parallel units); per pixel it
clears the output row and, per window position on the input, adds the input row times
the weight row into it, one loop over C·M contiguous elements that LLVM vectorizes.
The filter gradient (`f01b_i01o->01bf` with `batch_group_count` C, one input feature
per group: DepthwiseConv2dNativeBackpropFilter) is the same loop the other way round:
a unit per window position, its C·M-element row of the result summed over every
output pixel. Each output element is summed in one fixed order (window positions,
or pixels), so the result does not depend on the thread count.

What it does not take (the element generator in `convolution.py` does): other layouts,
base dilation, kernels reversed in some dimensions only, types other than f32/f64 (the
2-byte floats are lowered to f32 convolutions), empty operands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from tfxla_lite.codegen.cpu import parallel
from tfxla_lite.codegen.cpu.dot import NewKernel
from tfxla_lite.codegen.cpu.emitter import (
    I1,
    I64,
    KernelContext,
    i64,
    minimum,
    row_major_strides,
    value_type,
)
from tfxla_lite.hlo.convolution import ConvolutionDimensions, group_counts
from tfxla_lite.hlo.ir import Instruction

# Output pixels per unit of a forward depthwise convolution.
BLOCK_PIXELS = 64
PARALLEL_MIN_FLOPS = 1 << 20


@dataclass(frozen=True)
class DepthwisePlan:
    """A depthwise convolution (`filter_gradient` False) or its filter gradient."""

    element_type: str
    input_dims: tuple[int, ...]  # x: N, spatial..., C
    pixel_dims: tuple[int, ...]  # the output pixels (forward) or the gradient's
    taps_dims: tuple[int, ...]
    window: tuple
    multiplier: int  # M: outputs per channel
    reversed: bool
    filter_gradient: bool

    @property
    def channels(self) -> int:
        return self.input_dims[-1]

    @property
    def taps(self) -> int:
        return math.prod(self.taps_dims)

    @property
    def pixels(self) -> int:
        return math.prod(self.pixel_dims)

    @property
    def units(self) -> int:
        return self.taps if self.filter_gradient else -(-self.pixels // BLOCK_PIXELS)

    @property
    def flops(self) -> int:
        return 2 * self.pixels * self.taps * self.channels * self.multiplier


def plan(inst: Instruction) -> DepthwisePlan | None:
    """How `inst` runs as direct depthwise loops, or None."""
    if inst.opcode != "convolution":
        return None
    lhs, rhs = inst.operands
    element_type = inst.shape.element_type
    if element_type not in ("f32", "f64") or {lhs.shape.element_type,
                                              rhs.shape.element_type} != {element_type}:
        return None
    if 0 in (*lhs.shape.dims, *rhs.shape.dims, *inst.shape.dims):
        return None
    dnums: ConvolutionDimensions = inst.attributes["dim_labels"]
    rank = dnums.spatial_rank
    window = tuple(inst.attributes["window"].dimensions)
    if any(d.base_dilation != 1 for d in window):
        return None
    reversed_taps = any(d.window_reversal for d in window)
    if reversed_taps and not all(d.window_reversal for d in window):
        return None
    feature_groups, batch_groups = group_counts(inst.attributes)
    channels = lhs.shape.dims[-1]
    if dnums == ConvolutionDimensions.channels_last(rank):
        if batch_groups != 1 or feature_groups != channels or rhs.shape.dims[-2] != 1:
            return None
        return DepthwisePlan(element_type, lhs.shape.dims, inst.shape.dims[:-1],
                             rhs.shape.dims[:rank], window, rhs.shape.dims[-1] // channels,
                             reversed_taps, False)
    if dnums == ConvolutionDimensions.filter_gradient(rank):
        if feature_groups != 1 or batch_groups != channels or inst.shape.dims[rank] != 1 \
                or reversed_taps:
            return None
        return DepthwisePlan(element_type, lhs.shape.dims, rhs.shape.dims[:-1],
                             inst.shape.dims[:rank], window, rhs.shape.dims[-1] // channels,
                             False, True)
    return None


def emit_depthwise_kernel(module: ir.Module, pool: object, inst: Instruction, name: str,
                          noalias_output: bool, threads: int, new_kernel: NewKernel
                          ) -> ir.Function | None:
    """The kernel of a depthwise convolution or filter gradient `plan` accepts, or None."""
    conv = plan(inst)
    if conv is None:
        return None
    ctx, output, _ = new_kernel(module, pool, inst, name, noalias_output, [I64, I64])
    begin, end = ctx.function.args[-2:]
    begin.name, end.name = "begin", "end"
    with ctx.loop(end, name="unit", start=begin) as unit:
        if conv.filter_gradient:
            _emit_filter_unit(ctx, inst, conv, output, unit)
        else:
            _emit_forward_unit(ctx, inst, conv, output, unit)
    ctx.builder.ret_void()
    range_function = ctx.function

    launcher, output, inputs = new_kernel(module, pool, inst, name + ".launch", noalias_output)
    if conv.flops < PARALLEL_MIN_FLOPS:
        threads = 1
    parallel.emit_launch(launcher, range_function, [output, *inputs], conv.units, threads)
    launcher.builder.ret_void()
    return launcher.function


def _multi(b: ir.IRBuilder, flat: ir.Value, dims: tuple[int, ...]) -> list[ir.Value]:
    """The row-major multi-index of `flat` in `dims`."""
    strides = row_major_strides(dims)
    parts = []
    for d, stride in enumerate(strides):
        part = flat if d == 0 else b.urem(flat, i64(strides[d - 1]))
        parts.append(part if stride == 1 else b.udiv(part, i64(stride)))
    return parts


def _input_row(ctx: KernelContext, conv: DepthwisePlan, batch: ir.Value,
               positions: list[ir.Value]) -> tuple[ir.Value, ir.Value]:
    """Whether the input position lies inside x, and its row's first element."""
    b = ctx.builder
    strides = row_major_strides(conv.input_dims)
    inside: ir.Value = ir.Constant(I1, 1)
    offset = b.mul(batch, i64(strides[0]))
    for i, at in enumerate(positions):
        inside = b.and_(inside, b.icmp_unsigned("<", at, i64(conv.input_dims[1 + i])))
        offset = b.add(offset, b.mul(at, i64(strides[1 + i])))
    return inside, offset


def _accumulate_row(ctx: KernelContext, conv: DepthwisePlan, target: ir.Value,
                    x: ir.Value, weights: ir.Value) -> None:
    """target[c·M + m] += x[c] · weights[c·M + m] over the row (pointers to its starts)."""
    b = ctx.builder
    etype = value_type(conv.element_type)

    def add(value: ir.Value, o: ir.Value) -> None:
        at = b.gep(target, [o], source_etype=etype)
        product = b.fmul(value, b.load(b.gep(weights, [o], source_etype=etype), typ=etype))
        b.store(b.fadd(b.load(at, typ=etype), product), at)

    with ctx.loop(conv.channels, name="channel") as c:
        value = b.load(b.gep(x, [c], source_etype=etype), typ=etype)
        if conv.multiplier == 1:  # one plain loop over the row: what LLVM vectorizes
            add(value, c)
        else:
            with ctx.loop(conv.multiplier, name="multiple") as m:
                add(value, b.add(b.mul(c, i64(conv.multiplier)), m))


def _clear_row(ctx: KernelContext, conv: DepthwisePlan, target: ir.Value) -> None:
    b = ctx.builder
    etype = value_type(conv.element_type)
    with ctx.loop(conv.channels * conv.multiplier, name="clear") as o:
        b.store(ir.Constant(etype, 0.0), b.gep(target, [o], source_etype=etype))


def _emit_forward_unit(ctx: KernelContext, inst: Instruction, conv: DepthwisePlan,
                       output: ir.Value, unit: ir.Value) -> None:
    b = ctx.builder
    etype = value_type(conv.element_type)
    x = ctx.buffers[id(inst.operand(0))]
    w = ctx.buffers[id(inst.operand(1))]
    outputs = conv.channels * conv.multiplier
    first = b.mul(unit, i64(BLOCK_PIXELS))
    last = minimum(b, b.add(first, i64(BLOCK_PIXELS)), i64(conv.pixels))
    with ctx.loop(last, name="pixel", start=first) as row:
        pixel = _multi(b, row, conv.pixel_dims)
        target = b.gep(output, [b.mul(row, i64(outputs))], source_etype=etype)
        _clear_row(ctx, conv, target)
        with ctx.loop(conv.taps, name="tap") as tap:
            taps = _multi(b, tap, conv.taps_dims)
            positions = [b.sub(b.add(b.mul(pixel[1 + i], i64(d.stride)),
                                     b.mul(taps[i], i64(d.window_dilation))),
                               i64(d.padding_low)) for i, d in enumerate(conv.window)]
            inside, offset = _input_row(ctx, conv, pixel[0], positions)
            kernel_tap = b.sub(i64(conv.taps - 1), tap) if conv.reversed else tap
            with b.if_then(inside):
                _accumulate_row(ctx, conv, target, b.gep(x, [offset], source_etype=etype),
                                b.gep(w, [b.mul(kernel_tap, i64(outputs))],
                                      source_etype=etype))


def _emit_filter_unit(ctx: KernelContext, inst: Instruction, conv: DepthwisePlan,
                      output: ir.Value, tap: ir.Value) -> None:
    b = ctx.builder
    etype = value_type(conv.element_type)
    x = ctx.buffers[id(inst.operand(0))]
    dy = ctx.buffers[id(inst.operand(1))]
    outputs = conv.channels * conv.multiplier
    target = b.gep(output, [b.mul(tap, i64(outputs))], source_etype=etype)
    _clear_row(ctx, conv, target)
    taps = _multi(b, tap, conv.taps_dims)
    with ctx.loop(conv.pixels, name="pixel") as row:
        pixel = _multi(b, row, conv.pixel_dims)
        # In this form the window's dilation is the forward stride, its stride the
        # forward dilation.
        positions = [b.sub(b.add(b.mul(pixel[1 + i], i64(d.window_dilation)),
                                 b.mul(taps[i], i64(d.stride))), i64(d.padding_low))
                     for i, d in enumerate(conv.window)]
        inside, offset = _input_row(ctx, conv, pixel[0], positions)
        with b.if_then(inside):
            _accumulate_row(ctx, conv, target, b.gep(x, [offset], source_etype=etype),
                            b.gep(dy, [b.mul(row, i64(outputs))], source_etype=etype))
