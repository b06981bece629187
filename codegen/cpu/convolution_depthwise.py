"""CPU code for depthwise convolutions and their filter gradients: direct loops,
vectorized over the channels.

A depthwise convolution (channels-last, `feature_group_count` = the input's channels C,
one input feature per group, C·M outputs: `rules_conv.py`'s DepthwiseConv2dNative and
its backprop-input, whose gradient a stride dilates: window positions that land on the
dilation's holes are skipped like the padding) is no GEMM: each output pixel is a sum over
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
a filter gradient's base dilation, kernels reversed in some dimensions only, types
other than f32/f64 (the 2-byte floats are lowered to f32 convolutions), empty operands.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from tfxla_lite.codegen.cpu import parallel
from tfxla_lite.codegen.cpu.dot import NewKernel
from tfxla_lite.codegen.cpu.emitter import (
    I1,
    KernelContext,
    i64,
    minimum,
    row_major_index,
    row_major_strides,
    value_type,
)
from tfxla_lite.hlo.convolution import ConvolutionDimensions, group_counts
from tfxla_lite.hlo.ir import Instruction

# Output pixels per unit of a forward depthwise convolution.
BLOCK_PIXELS = 64
# Channels summed at once in a vector register block (the widest of these dividing C,
# multiplier 1): the sums stay in registers over the window (forward) or the pixels
# (filter gradient) instead of going through memory once per term.
LANES = (32, 16, 8, 4)
# A filter gradient of at most this many window positions, multiplier 1 and C a multiple
# of TAP_LANES sums every position at once: a unit per block of TAP_LANES channels, one
# register of sums per position, one pass over the pixels (x and the gradient read once,
# not once per position).
MAX_TAP_SUMS = 25
TAP_LANES = 16
# Such a gradient of few channel blocks cuts its window positions into parts until it
# has this many units (each part one more pass over the pixels), so that a team of two
# has work to share and a thread the OS preempts holds up less of it.
MIN_TAP_UNITS = 4
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
    lanes: int  # channels per vector block; 0: one loop over the row instead

    @property
    def blocks(self) -> int:
        """Channel blocks per row (1 without vector blocks)."""
        return self.channels // self.lanes if self.lanes else 1

    @property
    def tap_sums(self) -> bool:
        """A filter gradient summed for all window positions at once (MAX_TAP_SUMS)."""
        return self.filter_gradient and self.multiplier == 1 \
            and self.taps <= MAX_TAP_SUMS and self.channels % TAP_LANES == 0

    @property
    def tap_chunk(self) -> int:
        """Window positions per part (tap_sums), the last part's possibly fewer."""
        wanted = min(self.taps, -(-MIN_TAP_UNITS // (self.channels // TAP_LANES)))
        return -(-self.taps // wanted)

    @property
    def tap_parts(self) -> int:
        """Parts of the window positions, a unit each per channel block (tap_sums)."""
        return -(-self.taps // self.tap_chunk)

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
        if self.tap_sums:
            return self.channels // TAP_LANES * self.tap_parts
        if self.filter_gradient:
            return self.taps * self.blocks
        return -(-self.pixels // BLOCK_PIXELS)

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
    reversed_taps = any(d.window_reversal for d in window)
    if reversed_taps and not all(d.window_reversal for d in window):
        return None
    feature_groups, batch_groups = group_counts(inst.attributes)
    channels = lhs.shape.dims[-1]
    if dnums == ConvolutionDimensions.channels_last(rank):
        if batch_groups != 1 or feature_groups != channels or rhs.shape.dims[-2] != 1:
            return None
        multiplier = rhs.shape.dims[-1] // channels
        return DepthwisePlan(element_type, lhs.shape.dims, inst.shape.dims[:-1],
                             rhs.shape.dims[:rank], window, multiplier, reversed_taps, False,
                             _lanes(channels, multiplier))
    if dnums == ConvolutionDimensions.filter_gradient(rank):
        if any(d.base_dilation != 1 for d in window) or feature_groups != 1 \
                or batch_groups != channels or inst.shape.dims[rank] != 1 or reversed_taps:
            return None
        multiplier = rhs.shape.dims[-1] // channels
        return DepthwisePlan(element_type, lhs.shape.dims, rhs.shape.dims[:-1],
                             inst.shape.dims[:rank], window, multiplier, False, True,
                             _lanes(channels, multiplier))
    return None


def _lanes(channels: int, multiplier: int) -> int:
    if multiplier != 1:
        return 0
    return next((n for n in LANES if channels % n == 0), 0)


def emit_depthwise_kernel(module: ir.Module, pool: object, inst: Instruction, name: str,
                          noalias_output: bool, threads: int, new_kernel: NewKernel
                          ) -> ir.Function | None:
    """The kernel of a depthwise convolution or filter gradient `plan` accepts, or None."""
    conv = plan(inst)
    if conv is None:
        return None
    emit_unit = (_emit_filter_block if conv.tap_sums else
                 _emit_filter_unit if conv.filter_gradient else _emit_forward_unit)
    threads = 1 if conv.flops < PARALLEL_MIN_FLOPS else threads
    return parallel.emit_unit_kernel(
        module, pool, inst, name, noalias_output, new_kernel, conv.units, threads,
        lambda ctx, output, unit: emit_unit(ctx, inst, conv, output, unit))


def _flat(b: ir.IRBuilder, multi: list[ir.Value], dims: tuple[int, ...]) -> ir.Value:
    """The row-major flat index of `multi` in `dims`."""
    flat = multi[0]
    for index, size in zip(multi[1:], dims[1:]):
        flat = b.add(b.mul(flat, i64(size)), index)
    return flat


def _input_row(ctx: KernelContext, conv: DepthwisePlan, batch: ir.Value,
               positions: list[ir.Value]) -> tuple[ir.Value, ir.Value]:
    """Whether the input position lies on an element of x (not the padding, not a hole
    a base dilation leaves), and that element's row's first element."""
    b = ctx.builder
    strides = row_major_strides(conv.input_dims)
    inside: ir.Value = ir.Constant(I1, 1)
    offset = b.mul(batch, i64(strides[0]))
    for i, at in enumerate(positions):
        size = conv.input_dims[1 + i]
        base = 1 if conv.filter_gradient else conv.window[i].base_dilation
        if base != 1:
            # A strided depthwise backprop-input: x is the gradient, dilated by the stride.
            inside = b.and_(inside, b.icmp_unsigned("<", at, i64((size - 1) * base + 1)))
            inside = b.and_(inside, b.icmp_unsigned("==", b.urem(at, i64(base)), i64(0)))
            at = b.udiv(at, i64(base))
        else:
            inside = b.and_(inside, b.icmp_unsigned("<", at, i64(size)))
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


def _positions(b: ir.IRBuilder, conv: DepthwisePlan, pixel: list[ir.Value],
               taps: list[ir.Value]) -> list[ir.Value]:
    """The input position of each spatial dim for output `pixel` and window `taps`: the
    forward's stride and dilation are the filter gradient's window dilation and stride."""
    positions = []
    for i, d in enumerate(conv.window):
        stride, dilation = (d.window_dilation, d.stride) if conv.filter_gradient \
            else (d.stride, d.window_dilation)
        positions.append(b.sub(b.add(b.mul(pixel[1 + i], i64(stride)),
                                     b.mul(taps[i], i64(dilation))), i64(d.padding_low)))
    return positions


def _vector_accumulator(ctx: KernelContext, conv: DepthwisePlan, lanes: int = 0
                        ) -> tuple[ir.Value, ir.Type]:
    """A stack slot of one channel block's sums (promoted to registers), cleared."""
    lanes = lanes or conv.lanes
    vector = ir.VectorType(value_type(conv.element_type), lanes)
    slot = ctx.alloca(vector, name="sums")
    ctx.builder.store(ir.Constant(vector, [0.0] * lanes), slot)
    return slot, vector


def _add_products(ctx: KernelContext, conv: DepthwisePlan, slot: ir.Value, vector: ir.Type,
                  x: ir.Value, y: ir.Value) -> None:
    """sums += x[0:lanes] · y[0:lanes] (unaligned vector loads)."""
    b = ctx.builder
    align = 8 if conv.element_type == "f64" else 4
    product = b.fmul(b.load(x, typ=vector, align=align), b.load(y, typ=vector, align=align))
    b.store(b.fadd(b.load(slot, typ=vector), product), slot)


def _store_sums(ctx: KernelContext, conv: DepthwisePlan, slot: ir.Value, vector: ir.Type,
                target: ir.Value) -> None:
    align = 8 if conv.element_type == "f64" else 4
    ctx.builder.store(ctx.builder.load(slot, typ=vector), target, align=align)


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
        pixel = row_major_index(b, row, conv.pixel_dims)
        target = b.gep(output, [b.mul(row, i64(outputs))], source_etype=etype)

        def taps_loop(add: Callable[[ir.Value, ir.Value], None]) -> None:
            """add(x row, weight row) for each window position on the input."""
            with ctx.loop_nest(conv.taps_dims, name="tap") as taps:
                tap = _flat(b, taps, conv.taps_dims)
                positions = _positions(b, conv, pixel, taps)
                inside, offset = _input_row(ctx, conv, pixel[0], positions)
                kernel_tap = b.sub(i64(conv.taps - 1), tap) if conv.reversed else tap
                with b.if_then(inside):
                    add(b.gep(x, [offset], source_etype=etype),
                        b.gep(w, [b.mul(kernel_tap, i64(outputs))], source_etype=etype))

        if conv.lanes:
            with ctx.loop(conv.blocks, name="channel.block") as block:
                channel0 = b.mul(block, i64(conv.lanes))
                slot, vector = _vector_accumulator(ctx, conv)
                taps_loop(lambda xs, ws: _add_products(
                    ctx, conv, slot, vector, b.gep(xs, [channel0], source_etype=etype),
                    b.gep(ws, [channel0], source_etype=etype)))
                _store_sums(ctx, conv, slot, vector,
                            b.gep(target, [channel0], source_etype=etype))
        else:
            _clear_row(ctx, conv, target)
            taps_loop(lambda xs, ws: _accumulate_row(ctx, conv, target, xs, ws))


def _emit_filter_unit(ctx: KernelContext, inst: Instruction, conv: DepthwisePlan,
                      output: ir.Value, unit: ir.Value) -> None:
    b = ctx.builder
    etype = value_type(conv.element_type)
    x = ctx.buffers[id(inst.operand(0))]
    dy = ctx.buffers[id(inst.operand(1))]
    outputs = conv.channels * conv.multiplier
    tap = b.udiv(unit, i64(conv.blocks))
    channel0 = b.mul(b.urem(unit, i64(conv.blocks)), i64(conv.lanes))
    target = b.gep(output, [b.add(b.mul(tap, i64(outputs)), channel0)], source_etype=etype)
    taps = row_major_index(b, tap, conv.taps_dims)
    if conv.lanes:
        slot, vector = _vector_accumulator(ctx, conv)
    else:
        _clear_row(ctx, conv, target)
    # A nest over the pixel's dimensions: no division per pixel.
    with ctx.loop_nest(conv.pixel_dims, name="pixel") as pixel:
        row = _flat(b, pixel, conv.pixel_dims)
        inside, offset = _input_row(ctx, conv, pixel[0], _positions(b, conv, pixel, taps))
        with b.if_then(inside):
            xs = b.gep(x, [b.add(offset, channel0)], source_etype=etype)
            ys = b.gep(dy, [b.add(b.mul(row, i64(outputs)), channel0)], source_etype=etype)
            if conv.lanes:
                _add_products(ctx, conv, slot, vector, xs, ys)
            else:
                _accumulate_row(ctx, conv, target, xs, ys)
    if conv.lanes:
        _store_sums(ctx, conv, slot, vector, target)


def _emit_filter_block(ctx: KernelContext, inst: Instruction, conv: DepthwisePlan,
                       output: ir.Value, unit: ir.Value) -> None:
    """Channels [c0, c0 + TAP_LANES) of one part's window positions, summed in one pass
    over the pixels (a register of sums per position)."""
    b = ctx.builder
    etype = value_type(conv.element_type)
    x = ctx.buffers[id(inst.operand(0))]
    dy = ctx.buffers[id(inst.operand(1))]
    blocks = conv.channels // TAP_LANES
    channel0 = b.mul(b.urem(unit, i64(blocks)), i64(TAP_LANES))
    if conv.tap_parts == 1:
        numbers: list[ir.Value] = [i64(t) for t in range(conv.taps)]
        taps = [[i64(i) for i in t]
                for t in itertools.product(*(range(n) for n in conv.taps_dims))]
        valid: list[ir.Value] = [ir.Constant(I1, 1)] * conv.taps
    else:
        first = b.mul(b.udiv(unit, i64(blocks)), i64(conv.tap_chunk))
        numbers = [b.add(first, i64(t)) for t in range(conv.tap_chunk)]
        # The last part's positions past the window read nothing and store nothing.
        valid = [b.icmp_unsigned("<", n, i64(conv.taps)) for n in numbers]
        taps = [row_major_index(b, minimum(b, n, i64(conv.taps - 1)), conv.taps_dims)
                for n in numbers]
    sums = [_vector_accumulator(ctx, conv, TAP_LANES) for _ in taps]
    vector = sums[0][1]
    align = 8 if conv.element_type == "f64" else 4
    with ctx.loop_nest(conv.pixel_dims, name="pixel") as pixel:
        row = _flat(b, pixel, conv.pixel_dims)
        ys = b.load(b.gep(dy, [b.add(b.mul(row, i64(conv.channels)), channel0)],
                          source_etype=etype), typ=vector, align=align)
        for tap, ok, (slot, _) in zip(taps, valid, sums):
            inside, offset = _input_row(ctx, conv, pixel[0], _positions(b, conv, pixel, tap))
            with b.if_then(b.and_(inside, ok)):
                xs = b.load(b.gep(x, [b.add(offset, channel0)], source_etype=etype),
                            typ=vector, align=align)
                b.store(b.fadd(b.load(slot, typ=vector), b.fmul(xs, ys)), slot)
    for number, ok, (slot, _) in zip(numbers, valid, sums):
        target = b.gep(output, [b.add(b.mul(number, i64(conv.channels)), channel0)],
                       source_etype=etype)
        with b.if_then(ok):
            b.store(b.load(slot, typ=vector), target, align=align)
