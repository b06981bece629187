"""CPU code for filter-gradient convolutions: the forward's patches, transposed, times the
output gradient, as library GEMMs whose long dimension is the contracted one.

A convolution gradient with respect to the filter (`f01b_i01o->01bf`, the form
`clustering/rules_conv_grad.py` gives Conv2DBackpropFilter and its 3-D and grouped
kin, XLA's own) sums over the batch and every output pixel:
dW[taps, Cin, Cout] = P^T · dY, where P[pixels, taps·Cin] is the forward's patch matrix
of the input x (NHWC, read in place) and dY[pixels, Cout] is the output gradient
(NHWC, already that matrix). K, the pixels, is long (batch × H × W); the result is
small. The kernel cuts the result, not K, into units (a block of the K×O rows, taps
times input features, by a block of output features, per group): each unit walks all
pixels in blocks, copies the block's patch columns for its rows into a stack buffer
(one `memcpy` per pixel and tap, zeros where the tap falls in the padding) and
accumulates one GEMM per block (`beta` 1 after the first) into its own part of the
result. No unit shares a sum with another, so the result does not depend on the
thread count, and no partial sums are stored or added. A 1×1 stride-1 unpadded filter
needs no patches: x is P, and one GEMM over all pixels makes the unit.

Filter gradients with at least 8 input features and output features a multiple of 16
run as direct register blocks instead on AVX-512 hosts (`convolution_filter_direct.py`:
no patch columns copied, nothing packed).

What it does not take (the element generator of `convolution.py` does): other layouts,
base dilation or reversal (a filter gradient has neither), feature groups, types
without a library GEMM, empty operands, and groups too narrow for a GEMM (depthwise
filter gradients: a few output columns per group).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from tfxla_lite.codegen.cpu import convolution_filter_direct, engine, parallel
from tfxla_lite.codegen.cpu.dot import NewKernel, library_gemm
from tfxla_lite.codegen.cpu.emitter import (
    I1,
    I64,
    PTR,
    KernelContext,
    i64,
    minimum,
    row_major_index,
    row_major_strides,
    storage_type,
    value_type,
)
from tfxla_lite.hlo.convolution import ConvolutionDimensions, group_counts
from tfxla_lite.hlo.ir import Instruction

# The result rows (taps × input features) one unit owns, and its output features: a
# block of C that stays in L2 while the pixel blocks stream through it.
UNIT_ROWS = 256
UNIT_COLUMNS = 256
# The stack buffer of one pixel block's patch columns.
PATCH_BYTES = 256 << 10
PIXEL_ALIGN = 16
MAX_BLOCK_PIXELS = 1024
# At least this many units when the result allows, so that a team of two has work to
# share (more follow from UNIT_ROWS on big filters); fixed by the shape, never by the
# thread count.
MIN_UNITS = 2
MIN_SPLIT = 32
# Narrower groups (depthwise) are left to the element generator.
MIN_GROUP_COLUMNS = 8
PARALLEL_MIN_FLOPS = 1 << 21


@dataclass(frozen=True)
class FilterGradientPlan:
    """dW = P^T · dY in units of (group, tap block or input-feature block, column block)."""

    element_type: str
    input_dims: tuple[int, ...]  # x: N, spatial..., C
    grad_dims: tuple[int, ...]  # dY: N, spatial..., O
    taps_dims: tuple[int, ...]  # the filter's spatial sizes
    window: tuple  # WindowDimension per spatial dim (stride = forward dilation, ...)
    groups: int
    group_inputs: int  # Cg: input features per group (the result's `b`)
    group_outputs: int  # Og
    tap_block: int  # taps per unit (1 when the input features are split)
    input_block: int  # input features per unit
    column_block: int  # output features per unit
    block_pixels: int
    direct: bool  # x is P: a 1×1 filter, stride 1, no padding

    @property
    def taps(self) -> int:
        return math.prod(self.taps_dims)

    @property
    def pixels(self) -> int:
        return math.prod(self.grad_dims[:-1])

    @property
    def unit_counts(self) -> tuple[int, int, int, int]:
        """Groups, tap blocks, input-feature blocks and column blocks."""
        return (self.groups, -(-self.taps // self.tap_block),
                -(-self.group_inputs // self.input_block),
                -(-self.group_outputs // self.column_block))

    @property
    def units(self) -> int:
        return math.prod(self.unit_counts)

    @property
    def flops(self) -> int:
        return 2 * self.pixels * self.taps * self.group_inputs * self.group_outputs \
            * self.groups


def _halve(n: int) -> int:
    """Half of `n`, rounded up to a multiple of PIXEL_ALIGN."""
    half = -(-n // 2)
    return -(-half // PIXEL_ALIGN) * PIXEL_ALIGN


def plan(inst: Instruction) -> FilterGradientPlan | None:
    """How `inst` runs as accumulated GEMMs over pixel blocks, or None."""
    if inst.opcode != "convolution":
        return None
    lhs, rhs = inst.operands
    element_type = inst.shape.element_type
    if engine.gemm(element_type) is None or lhs.shape.element_type != element_type \
            or rhs.shape.element_type != element_type:
        return None
    dnums: ConvolutionDimensions = inst.attributes["dim_labels"]
    rank = dnums.spatial_rank
    if dnums != ConvolutionDimensions.filter_gradient(rank):
        return None
    window = tuple(inst.attributes["window"].dimensions)
    if any(d.base_dilation != 1 or d.window_reversal for d in window):
        return None
    feature_groups, groups = group_counts(inst.attributes)
    if feature_groups != 1:
        return None
    taps_dims = inst.shape.dims[:rank]
    group_inputs, outputs = inst.shape.dims[rank], inst.shape.dims[rank + 1]
    group_outputs = outputs // groups
    if 0 in (*lhs.shape.dims, *rhs.shape.dims, *inst.shape.dims):
        return None
    if groups > 1 and group_outputs < MIN_GROUP_COLUMNS:
        return None
    taps = math.prod(taps_dims)
    if group_inputs >= UNIT_ROWS:
        tap_block, input_block = 1, _halve(group_inputs) if group_inputs > UNIT_ROWS \
            else group_inputs
        while input_block > UNIT_ROWS:
            input_block = _halve(input_block)
    else:
        # As many taps as fit UNIT_ROWS, spread evenly over the tap blocks.
        tap_blocks = -(-taps // max(1, UNIT_ROWS // group_inputs))
        tap_block, input_block = -(-taps // tap_blocks), group_inputs
    column_block = min(group_outputs, UNIT_COLUMNS)

    def units() -> int:
        return groups * -(-taps // tap_block) * -(-group_inputs // input_block) \
            * -(-group_outputs // column_block)

    # Rows before columns: a unit's GEMMs pack its patch columns once per pixel block
    # for all its output features, so narrower column blocks pack the same patches again.
    while units() < MIN_UNITS:
        if tap_block > 1 and tap_block * input_block >= 2 * MIN_SPLIT:
            tap_block = -(-taps // (2 * -(-taps // tap_block)))
        elif input_block >= 2 * MIN_SPLIT:
            input_block = _halve(input_block)
        elif column_block >= 2 * MIN_SPLIT:
            column_block = _halve(column_block)
        else:
            break
    direct = taps == 1 and all(d.window_dilation == 1 and d.padding_low == 0
                               for d in window) and lhs.shape.dims[1:-1] == rhs.shape.dims[1:-1]
    element_bytes = inst.shape.numpy_dtype.itemsize
    pixels = math.prod(rhs.shape.dims[:-1])
    row_bytes = tap_block * input_block * element_bytes
    block = max(PIXEL_ALIGN, PATCH_BYTES // row_bytes // PIXEL_ALIGN * PIXEL_ALIGN)
    return FilterGradientPlan(element_type, lhs.shape.dims, rhs.shape.dims, taps_dims, window,
                              groups, group_inputs, group_outputs, tap_block, input_block,
                              column_block, min(block, MAX_BLOCK_PIXELS, pixels), direct)


def emit_filter_gradient_kernel(module: ir.Module, pool: object, inst: Instruction,
                                name: str, noalias_output: bool, threads: int,
                                new_kernel: NewKernel) -> ir.Function | None:
    """The kernel of a filter-gradient convolution `plan` accepts, or None."""
    conv = plan(inst)
    if conv is None:
        return None
    threads = 1 if conv.flops < PARALLEL_MIN_FLOPS else threads
    direct = convolution_filter_direct.direct_plan(conv)
    if direct is not None:
        return convolution_filter_direct.emit_direct_kernel(
            module, pool, inst, name, noalias_output, threads, new_kernel, direct)
    return parallel.emit_unit_kernel(
        module, pool, inst, name, noalias_output, new_kernel, conv.units, threads,
        lambda ctx, output, unit: _emit_unit(ctx, inst, conv, output, unit))


def _emit_unit(ctx: KernelContext, inst: Instruction, conv: FilterGradientPlan,
               output: ir.Value, unit: ir.Value) -> None:
    b = ctx.builder
    etype = storage_type(conv.element_type)
    x = ctx.buffers[id(inst.operand(0))]
    dy = ctx.buffers[id(inst.operand(1))]
    _, tap_blocks, input_blocks, column_blocks = conv.unit_counts
    # unit = ((group · tap blocks + tap block) · input blocks + input block) · columns + ...
    column_index = b.urem(unit, i64(column_blocks))
    rest = b.udiv(unit, i64(column_blocks))
    input_index = b.urem(rest, i64(input_blocks))
    rest = b.udiv(rest, i64(input_blocks))
    tap_index = b.urem(rest, i64(tap_blocks))
    group = b.udiv(rest, i64(tap_blocks))
    tap0 = b.mul(tap_index, i64(conv.tap_block))
    tap1 = minimum(b, b.add(tap0, i64(conv.tap_block)), i64(conv.taps))
    input0 = b.mul(input_index, i64(conv.input_block))
    inputs = b.sub(minimum(b, b.add(input0, i64(conv.input_block)), i64(conv.group_inputs)),
                   input0)
    column0 = b.add(b.mul(group, i64(conv.group_outputs)),
                    b.mul(column_index, i64(conv.column_block)))
    columns = b.sub(minimum(b, b.mul(b.add(column_index, i64(1)), i64(conv.column_block)),
                            i64(conv.group_outputs)),
                    b.mul(column_index, i64(conv.column_block)))
    rows = b.mul(b.sub(tap1, tap0), inputs)
    channels, outputs = conv.input_dims[-1], conv.grad_dims[-1]
    # Input feature `input0` of group `group` is channel group·Cg + input0 of x.
    channel0 = b.add(b.mul(group, i64(conv.group_inputs)), input0)
    result = b.gep(output, [b.add(b.mul(b.add(b.mul(tap0, i64(conv.group_inputs)), input0),
                                        i64(outputs)), column0)], source_etype=etype)
    if conv.direct:
        accumulating_gemm(ctx, conv.element_type, True, False, rows, columns, i64(conv.pixels),
              b.gep(x, [channel0], source_etype=etype), channels,
              b.gep(dy, [column0], source_etype=etype), outputs, result, outputs, 0.0)
        return
    lda = conv.tap_block * conv.input_block
    buffer = ctx.alloca(etype, name="patches", count=conv.block_pixels * lda)
    buffer.align = 64
    blocks = -(-conv.pixels // conv.block_pixels)
    with ctx.loop(blocks, name="pixel.block") as block:
        pixel0 = b.mul(block, i64(conv.block_pixels))
        pixel1 = minimum(b, b.add(pixel0, i64(conv.block_pixels)), i64(conv.pixels))
        _emit_patches(ctx, conv, x, buffer, pixel0, pixel1, tap0, tap1, channel0, inputs)
        first = b.icmp_unsigned("==", block, i64(0))
        accumulating_gemm(ctx, conv.element_type, True, False, rows, columns,
                          b.sub(pixel1, pixel0), buffer, lda,
              b.gep(dy, [b.add(b.mul(pixel0, i64(outputs)), column0)], source_etype=etype),
              outputs, result, outputs, first)


def _emit_patches(ctx: KernelContext, conv: FilterGradientPlan, x: ir.Value, buffer: ir.Value,
                  pixel0: ir.Value, pixel1: ir.Value, tap0: ir.Value, tap1: ir.Value,
                  channel0: ir.Value, inputs: ir.Value) -> None:
    """Rows [pixel0, pixel1) of P's columns for taps [tap0, tap1) and `inputs` input
    features from `channel0`: per pixel and tap one memcpy, or zeros in the padding."""
    b = ctx.builder
    etype = storage_type(conv.element_type)
    element_bytes = 8 if conv.element_type == "f64" else 4
    # A constant length (the usual case: whole blocks) lets LLVM inline short copies.
    copy_bytes = i64(conv.input_block * element_bytes) \
        if conv.group_inputs % conv.input_block == 0 else b.mul(inputs, i64(element_bytes))
    memcpy = ctx.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    memset = ctx.module.declare_intrinsic("llvm.memset", [PTR, I64])
    input_strides = row_major_strides(conv.input_dims)
    tap_strides = row_major_strides(conv.taps_dims)
    lda = conv.tap_block * conv.input_block
    with ctx.loop(pixel1, name="pixel", start=pixel0) as row:
        pixel = row_major_index(b, row, conv.grad_dims[:-1])
        row_start = b.mul(b.sub(row, pixel0), i64(lda))
        with ctx.loop(tap1, name="tap", start=tap0) as tap:
            inside: ir.Value = ir.Constant(I1, 1)
            source = b.add(b.mul(pixel[0], i64(input_strides[0])), channel0)
            for i, d in enumerate(conv.window):
                part = tap if i == 0 else b.urem(tap, i64(tap_strides[i - 1]))
                position = part if tap_strides[i] == 1 else b.udiv(part, i64(tap_strides[i]))
                # Forward stride is this window's dilation; forward dilation its stride.
                at = b.sub(b.add(b.mul(pixel[1 + i], i64(d.window_dilation)),
                                 b.mul(position, i64(d.stride))), i64(d.padding_low))
                inside = b.and_(inside, b.icmp_unsigned("<", at, i64(conv.input_dims[1 + i])))
                source = b.add(source, b.mul(at, i64(input_strides[1 + i])))
            target = b.gep(buffer, [b.add(row_start, b.mul(b.sub(tap, tap0), inputs))],
                           source_etype=etype)
            with b.if_else(inside) as (real, padding):
                with real:
                    b.call(memcpy, [target, b.gep(x, [source], source_etype=etype),
                                    copy_bytes, ir.Constant(I1, 0)])
                with padding:
                    b.call(memset, [target, ir.Constant(ir.IntType(8), 0), copy_bytes,
                                    ir.Constant(I1, 0)])


def accumulating_gemm(ctx: KernelContext, element_type: str, transpose_a: bool,
                      transpose_b: bool, m: ir.Value | int, n: ir.Value | int,
                      k: ir.Value | int, a: ir.Value, lda: int, b_matrix: ir.Value, ldb: int,
                      c: ir.Value, ldc: int, first: ir.Value | float) -> None:
    """C[m, n] (+)= op(A) · op(B) by one library GEMM, row major: C is overwritten where
    `first` holds (or is 0.0), accumulated into otherwise (beta 0 or 1)."""
    if isinstance(first, float):
        beta: ir.Value | float = first
    else:
        scalar = value_type(element_type)
        beta = ctx.builder.select(first, ir.Constant(scalar, 0.0), ir.Constant(scalar, 1.0))
    library_gemm(ctx, element_type, transpose_a, transpose_b, m, n, k, a, lda, b_matrix, ldb,
                 c, ldc, beta)
