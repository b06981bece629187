"""CPU code for GEMM-shaped convolutions: patches of the input, then the library GEMM.

A channels-last convolution (`b01f_01io->b01f`, the form TF lowering gives every
Conv2D/Conv3D/depthwise op) is a matrix product once each output pixel's window is
laid out as a row: C[pixels, O] = P[pixels, K] · W[K, O], where K is the window's
positions times the input features (the filter `01io` is already that K×O matrix, row
major, and the output's rows are the pixels). The kernel cuts the pixels into blocks
fixed by the shape (`plan`); for each block (a parallel unit) it writes the block's
patch rows into a stack buffer (one `memcpy` of the input features per window position
that lands on the input, zeros where it falls in the padding: no gather, no index per
element) and calls GEMM on that buffer, with the output's rows as C. A 1×1 window of
stride 1 without padding needs no patches: the input is P. Feature groups are GEMMs on
column slices of W and C (leading dimension O). A backprop-input's filter as it is
(`b01f_01oi->b01f`, flipped by `rhs_reversal`) is one GEMM per window position instead,
C += P[:, position's features] · W[position]^T, so no transposed copy of the filter is
made.

Where the direct register blocks apply (`convolution_direct.py`: f32 on AVX-512, at
least 8 input features, a patch of at least 64, output features a multiple of 16) they
run instead: no patch copy and no packing, which the narrow GEMMs of 32-256 output
features could not repay. This path keeps the rest: f64, hosts without AVX-512, first
layers of a few channels (one GEMM over the whole window), odd feature counts and 1×1
backprop-inputs (the filter read transposed in place by the library).

What it does not take (the element generator in `convolution.py` does): other layouts,
base dilation (transposed convolutions), kernels reversed in some dimensions only or
in the `01io` layout, batch groups, grouped `01oi` filters, types without
a library GEMM (f16/bf16 are lowered to f32 convolutions already), and depthwise-like
groups whose GEMMs would be a few columns wide.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from llvmlite import ir

from tfxla_lite.codegen.cpu import engine, parallel
from tfxla_lite.codegen.cpu.convolution_depthwise import emit_depthwise_kernel
from tfxla_lite.codegen.cpu.convolution_direct import direct_plan, emit_direct_kernel, window_read
from tfxla_lite.codegen.cpu.convolution_filter import accumulating_gemm, emit_filter_gradient_kernel
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
)
from tfxla_lite.hlo.convolution import ConvolutionDimensions, group_counts
from tfxla_lite.hlo.ir import Instruction

# A block's patch rows live on the stack of the thread computing it; this many bytes
# keep them, with the filter's K×O panel, inside a core's L2.
PATCH_BYTES = 384 << 10
ROW_ALIGN = 16
MAX_BLOCK_ROWS = 1024
# At least this many units when the pixels allow, so that a team of two or four has
# work to share; fixed by the shape, never by the thread count.
MIN_UNITS = 4
# Groups narrower than this (depthwise convolutions) are left to the element generator:
# a GEMM a few columns wide is all call overhead.
MIN_GROUP_COLUMNS = 8
MIN_GROUP_DEPTH = 16
PARALLEL_MIN_FLOPS = 1 << 21


@dataclass(frozen=True)
class ConvolutionPlan:
    """A convolution as blocks of patch rows times the filter, per feature group."""

    element_type: str
    input_dims: tuple[int, ...]  # N, spatial..., C
    output_dims: tuple[int, ...]  # N, spatial..., O
    window: tuple  # WindowDimension per spatial dim
    groups: int
    group_inputs: int  # input features per group (the filter's `i`)
    group_outputs: int  # output features per group
    k: int  # patch length: window positions × group_inputs
    rows: int  # output pixels
    direct: bool  # the input is the patch matrix (1×1, stride 1, no padding)
    block_rows: int
    # The filter is `01oi` (a backprop-input's forward filter, as it is) and flipped when
    # `reversed`: one GEMM per window position, its filter slice transposed, accumulated.
    transposed_filter: bool = False
    reversed: bool = False

    @property
    def row_blocks(self) -> int:
        return -(-self.rows // self.block_rows)

    @property
    def units(self) -> int:
        return self.row_blocks * self.groups

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.k * self.group_outputs * self.groups


def plan(inst: Instruction) -> ConvolutionPlan | None:
    """How `inst` runs as patches and GEMM calls, or None when the element generator must."""
    if inst.opcode != "convolution":
        return None
    lhs, rhs = inst.operands
    element_type = inst.shape.element_type
    if engine.gemm(element_type) is None or lhs.shape.element_type != element_type:
        return None
    dnums: ConvolutionDimensions = inst.attributes["dim_labels"]
    rank = dnums.spatial_rank
    transposed = dnums == transposed_filter_dimensions(rank)
    if dnums != ConvolutionDimensions.channels_last(rank) and not transposed:
        return None
    window = inst.attributes["window"].dimensions
    reversed_taps = any(d.window_reversal for d in window)
    if any(d.base_dilation != 1 for d in window) or (
            reversed_taps and not (transposed and all(d.window_reversal for d in window))):
        return None
    groups, batch_groups = group_counts(inst.attributes)
    if batch_groups != 1 or (transposed and groups != 1):
        return None
    group_inputs = rhs.shape.dims[dnums.kernel_input_feature]
    group_outputs = rhs.shape.dims[dnums.kernel_output_feature] // groups
    k = math.prod(d.size for d in window) * group_inputs
    rows = math.prod(inst.shape.dims[:-1])
    if rows == 0 or k == 0 or group_outputs == 0:
        return None
    if groups > 1 and (group_outputs < MIN_GROUP_COLUMNS or k < MIN_GROUP_DEPTH):
        return None
    direct = all(d.size == 1 and d.stride == 1 and d.window_dilation == 1
                 and d.padding_low == 0 and d.padding_high == 0 for d in window)
    element_bytes = inst.shape.numpy_dtype.itemsize
    block = max(ROW_ALIGN, PATCH_BYTES // (k * element_bytes) // ROW_ALIGN * ROW_ALIGN)
    block = min(block, MAX_BLOCK_ROWS)
    if rows >= MIN_UNITS * ROW_ALIGN:
        share = -(-rows // MIN_UNITS)
        block = min(block, -(-share // ROW_ALIGN) * ROW_ALIGN)
    return ConvolutionPlan(element_type, lhs.shape.dims, inst.shape.dims, tuple(window),
                           groups, group_inputs, group_outputs, k, rows, direct,
                           min(block, rows), transposed, reversed_taps)


def transposed_filter_dimensions(spatial_rank: int) -> ConvolutionDimensions:
    """`b01f_01oi->b01f`: channels-last with the filter's feature dimensions swapped."""
    channels_last = ConvolutionDimensions.channels_last(spatial_rank)
    return dataclasses.replace(channels_last, kernel_input_feature=spatial_rank + 1,
                               kernel_output_feature=spatial_rank)


def emit_convolution_kernel(module: ir.Module, pool: object, inst: Instruction, name: str,
                            noalias_output: bool, threads: int, new_kernel: NewKernel
                            ) -> ir.Function | None:
    """The kernel of a convolution `plan` accepts (units of patch rows and a GEMM call
    each, on `threads` threads when big), of a filter gradient (`convolution_filter.py`),
    of a depthwise convolution (`convolution_depthwise.py`), or None."""
    conv = plan(inst)
    if conv is None:
        return emit_filter_gradient_kernel(module, pool, inst, name, noalias_output, threads,
                                           new_kernel) or emit_depthwise_kernel(
            module, pool, inst, name, noalias_output, threads, new_kernel)
    threads = 1 if conv.flops < PARALLEL_MIN_FLOPS else threads
    direct = direct_plan(conv)
    if direct is not None:
        return emit_direct_kernel(module, pool, inst, name, noalias_output, threads,
                                  new_kernel, direct)
    return parallel.emit_unit_kernel(
        module, pool, inst, name, noalias_output, new_kernel, conv.units, threads,
        lambda ctx, output, unit: _emit_unit(ctx, inst, conv, output, unit))


def _emit_unit(ctx: KernelContext, inst: Instruction, conv: ConvolutionPlan, output: ir.Value,
               unit: ir.Value) -> None:
    b = ctx.builder
    etype = storage_type(conv.element_type)
    lhs = ctx.buffers[id(inst.operand(0))]
    rhs = ctx.buffers[id(inst.operand(1))]
    group = b.udiv(unit, i64(conv.row_blocks))
    row0 = b.mul(b.urem(unit, i64(conv.row_blocks)), i64(conv.block_rows))
    row1 = minimum(b, b.add(row0, i64(conv.block_rows)), i64(conv.rows))
    channels = conv.input_dims[-1]
    outputs = conv.output_dims[-1]
    input_offset = b.mul(group, i64(conv.group_inputs))
    if conv.direct:
        patches = b.gep(lhs, [b.add(b.mul(row0, i64(channels)), input_offset)],
                        source_etype=etype)
        lda = channels
    else:
        buffer = ctx.alloca(etype, name="patches", count=conv.block_rows * conv.k)
        buffer.align = 64
        _emit_patches(ctx, conv, lhs, buffer, row0, row1, input_offset)
        patches, lda = buffer, conv.k
    if conv.transposed_filter:
        _emit_transposed_filter_gemms(ctx, conv, rhs, output, patches, lda, row0, row1)
        return
    column = b.mul(group, i64(conv.group_outputs))
    library_gemm(ctx, conv.element_type, False, False, b.sub(row1, row0), conv.group_outputs,
                 conv.k, patches, lda, b.gep(rhs, [column], source_etype=etype), outputs,
                 b.gep(output, [b.add(b.mul(row0, i64(outputs)), column)], source_etype=etype),
                 outputs)


def _emit_transposed_filter_gemms(ctx: KernelContext, conv: ConvolutionPlan, rhs: ir.Value,
                                  output: ir.Value, patches: ir.Value, lda: int,
                                  row0: ir.Value, row1: ir.Value) -> None:
    """C[rows, O] = sum over window positions t of P[rows, t's inputs] · W[t']^T, where
    W[t'] (O×I, row major) is the filter at t (or its mirror t' = taps-1-t)."""
    b = ctx.builder
    etype = storage_type(conv.element_type)
    taps = conv.k // conv.group_inputs
    outputs, inputs = conv.group_outputs, conv.group_inputs
    result = b.gep(output, [b.mul(row0, i64(outputs))], source_etype=etype)
    with ctx.loop(taps, name="tap") as tap:
        source = b.sub(i64(taps - 1), tap) if conv.reversed else tap
        accumulating_gemm(ctx, conv.element_type, False, True, b.sub(row1, row0), outputs,
                          inputs, b.gep(patches, [b.mul(tap, i64(inputs))], source_etype=etype),
                          lda, b.gep(rhs, [b.mul(source, i64(outputs * inputs))],
                                     source_etype=etype),
                          inputs, result, outputs, b.icmp_unsigned("==", tap, i64(0)))


def _emit_patches(ctx: KernelContext, conv: ConvolutionPlan, lhs: ir.Value, buffer: ir.Value,
                  row0: ir.Value, row1: ir.Value, input_offset: ir.Value) -> None:
    """Patch rows [row0, row1) into `buffer`: per output pixel and window position, the
    group's input features (one memcpy), or zeros where the position is padding."""
    b = ctx.builder
    etype = storage_type(conv.element_type)
    element_bytes = 8 if conv.element_type == "f64" else 4
    copy_bytes = i64(conv.group_inputs * element_bytes)
    memcpy = ctx.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    memset = ctx.module.declare_intrinsic("llvm.memset", [PTR, I64])
    pixel_dims = conv.output_dims[:-1]  # N, spatial...
    input_strides = row_major_strides(conv.input_dims)
    sizes = tuple(d.size for d in conv.window)
    position_strides = row_major_strides(sizes)
    with ctx.loop(row1, name="pixel", start=row0) as row:
        pixel = row_major_index(b, row, pixel_dims)
        row_start = b.mul(b.sub(row, row0), i64(conv.k))
        with ctx.loop_nest(sizes, name="tap") as taps:
            inside, source, position = window_read(b, conv, pixel, taps, input_strides,
                                                   position_strides, input_offset)
            target = b.gep(buffer, [b.add(row_start, b.mul(position, i64(conv.group_inputs)))],
                           source_etype=etype)
            with b.if_else(inside) as (real, padding):
                with real:
                    b.call(memcpy, [target, b.gep(lhs, [source], source_etype=etype),
                                    copy_bytes, ir.Constant(I1, 0)])
                with padding:
                    b.call(memset, [target, ir.Constant(ir.IntType(8), 0), copy_bytes,
                                    ir.Constant(I1, 0)])
