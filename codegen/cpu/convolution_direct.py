"""CPU code for channels-last f32 convolutions as direct register blocks (AVX-512).

Where it sits: `convolution_gemm.emit_convolution_kernel` hands a convolution its `plan`
accepts to this module first when `direct_plan` takes it; the patches-and-GEMM path
serves the rest. The product is the same implicit GEMM, C[pixels, O] = P[pixels, K] ·
W[K, O] with K = window positions × input features, but P is never built: a micro-kernel
keeps an MR × NR block of C (MR output pixels by NR = V·16 output features) in vector
registers and, for each window position, broadcasts each pixel's input features straight
from the input (one pointer per pixel and position, computed once per unit; a pointer
to a zeroed row where the position falls in the padding) and multiplies them by the
filter's row of NR features read in place (`01io` is already K×O, row major). So neither
operand is copied or packed: the library GEMM paid a patch copy and its own packing of
both per block, which the narrow GEMMs of 32-256 output features could not repay.

Units are (group, block of output features, block of pixels), fixed by the shape; each
output element is one chain of fused multiply-adds over the window positions and then
the input features in ascending order, inside one unit, so the result does not depend
on the thread count. V is the widest of 4, 3, 2, 1 vectors dividing the group's output
features (a multiple of 16), MR the pixels that keep 24 sums (12 for one vector) in the
32 zmm registers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llvmlite import ir

from tfxla_lite.codegen.cpu import gemm_packed, parallel
from tfxla_lite.codegen.cpu.dot import NewKernel
from tfxla_lite.codegen.cpu.dot_blocks import (
    internal_function,
    register_sums,
    splat,
    store_present_rows,
)
from tfxla_lite.codegen.cpu.emitter import (
    I1,
    I64,
    PTR,
    KernelContext,
    declare,
    i64,
    minimum,
    row_major_index,
    row_major_strides,
    zeroed_row,
)
from tfxla_lite.hlo.ir import Instruction

if TYPE_CHECKING:
    from tfxla_lite.codegen.cpu.convolution_gemm import ConvolutionPlan

F32 = ir.FloatType()
LANES = 16
# Rows (pixels) of the register block for V vectors of output features.
ROWS_FOR_VECTORS = {4: 6, 3: 8, 2: 12, 1: 12}
# Fewer input features than this per group leave too short a loop per window position
# (the stem's 3 colours): the GEMM path, whose K runs over the whole window, serves them.
MIN_INPUTS = 8
# A shorter patch (window positions × input features) leaves the per-pixel pointer work
# a large share of the products: the GEMM path serves it.
MIN_DEPTH = 64
# Pixels of one unit at most: their pointers (taps × pixels) stay on the stack, and the
# pixels' input rows in L2 while each NR-wide slice of the filter streams past them.
MAX_BLOCK_PIXELS = 192
# A backprop-input whose convolution has fewer FLOPs transposes its filter on one thread.
TRANSPOSE_PARALLEL_FLOPS = 1 << 24
# The unit's pixel pointers (pixels × window positions) on the stack at most.
POINTER_BYTES = 64 << 10
# At least this many units when the shape allows, so that a team of two has work to
# share; fixed by the shape, never by the thread count.
MIN_UNITS = 4


@dataclass(frozen=True)
class DirectPlan:
    """A convolution `ConvolutionPlan` accepts, as register blocks over pixels × features."""

    conv: ConvolutionPlan
    vectors: int  # V: vectors of 16 output features per block
    rows: int  # MR: pixels per block
    block_pixels: int  # pixels per unit, a multiple of MR
    strips: int  # NR-wide slices of one group's output features
    chunk: int  # strips per unit

    @property
    def width(self) -> int:
        return self.vectors * LANES

    @property
    def taps(self) -> int:
        return math.prod(d.size for d in self.conv.window)

    @property
    def pixel_blocks(self) -> int:
        return -(-self.conv.rows // self.block_pixels)

    @property
    def chunks(self) -> int:
        return -(-self.strips // self.chunk)

    @property
    def units(self) -> int:
        return self.conv.groups * self.chunks * self.pixel_blocks


def direct_plan(conv: ConvolutionPlan) -> DirectPlan | None:
    """The register-block plan of `conv`, or None where the GEMM path keeps it: not f32,
    no AVX-512, fewer than MIN_INPUTS input features or a patch shorter than MIN_DEPTH,
    output features not a multiple of 16 per group; a transposed filter of a 1×1 window
    (one library GEMM with the filter transposed in place, no patches, beat the
    transposing units on ResNet50's and MobileNetV2's)."""
    if (conv.element_type != "f32" or not gemm_packed.available()
            or conv.group_inputs < MIN_INPUTS or conv.k < MIN_DEPTH
            or conv.group_outputs % LANES):
        return None
    vectors = next(v for v in (4, 3, 2, 1) if conv.group_outputs % (v * LANES) == 0)
    if conv.transposed_filter and conv.direct:
        return None
    rows = ROWS_FOR_VECTORS[vectors]
    strips = conv.group_outputs // (vectors * LANES)
    taps = math.prod(d.size for d in conv.window)
    most = max(1, min(MAX_BLOCK_PIXELS, POINTER_BYTES // (8 * taps)) // rows) * rows
    slivers = -(-conv.rows // rows)
    # Each unit reads its pixels' windows and its slice of the filter once per strip
    # pass: split pixels and features so that the units read the least (pixel blocks ×
    # output features + feature chunks × pixels, both times K), at least MIN_UNITS.
    best: tuple[int, int, int] | None = None
    for split in range(1, strips + 1):
        wanted = -(-MIN_UNITS // (split * conv.groups))
        per_block = -(-slivers // min(slivers, max(-(-conv.rows // most), wanted)))
        chunk = -(-strips // split)
        blocks, chunks = -(-slivers // per_block), -(-strips // chunk)
        cost = blocks * conv.group_outputs + chunks * conv.rows
        if blocks * chunks * conv.groups < min(MIN_UNITS, slivers * strips * conv.groups):
            cost += 1 << 62  # too few units for the team, whatever they read
        if best is None or cost < best[0]:
            best = (cost, per_block * rows, chunk)
    _, block, chunk = best
    return DirectPlan(conv, vectors, rows, block, strips, chunk)


def emit_direct_kernel(module: ir.Module, pool: object, inst: Instruction, name: str,
                       noalias_output: bool, threads: int, new_kernel: NewKernel,
                       plan: DirectPlan) -> ir.Function:
    """The kernel of `plan`: its units on `threads` threads."""
    if plan.conv.transposed_filter:
        return _emit_transposed_kernel(module, pool, inst, name, noalias_output, threads,
                                       new_kernel, plan)
    return parallel.emit_unit_kernel(
        module, pool, inst, name, noalias_output, new_kernel, plan.units, threads,
        lambda ctx, output, unit: _emit_unit(ctx, inst, plan, output, unit,
                                             ctx.buffers[id(inst.operand(1))]))


def _emit_transposed_kernel(module: ir.Module, pool: object, inst: Instruction, name: str,
                            noalias_output: bool, threads: int, new_kernel: NewKernel,
                            plan: DirectPlan) -> ir.Function:
    """A backprop-input's `01oi` filter: the launcher transposes it once into `01io`
    (mirrored when reversed) in a heap buffer, one window position a unit; the units
    then run the forward's blocks over that buffer, every position in one kernel call."""
    conv = plan.conv
    depth, outputs = conv.group_inputs, conv.group_outputs
    extra = [PTR, I64, I64]
    transpose, _, _ = new_kernel(module, pool, inst, name + ".transpose", noalias_output,
                                 extra)
    buffer, begin, end = transpose.function.args[-3:]
    rhs = transpose.buffers[id(inst.operand(1))]
    b = transpose.builder
    with transpose.loop(end, name="tap", start=begin) as tap:
        source = b.sub(i64(plan.taps - 1), tap) if conv.reversed else tap
        with transpose.loop(depth, name="k") as k:
            row = b.gep(buffer, [b.mul(b.add(b.mul(tap, i64(depth)), k), i64(outputs))],
                        source_etype=F32)
            column = b.gep(rhs, [b.add(b.mul(source, i64(outputs * depth)), k)],
                           source_etype=F32)
            with transpose.loop(outputs, name="j") as j:
                value = b.load(b.gep(column, [b.mul(j, i64(depth))], source_etype=F32), typ=F32)
                b.store(value, b.gep(row, [j], source_etype=F32))
    b.ret_void()
    units, result, _ = new_kernel(module, pool, inst, name, noalias_output, extra)
    filter_, begin, end = units.function.args[-3:]
    with units.loop(end, name="unit", start=begin) as unit:
        _emit_unit(units, inst, plan, result, unit, filter_)
    units.builder.ret_void()
    launcher, output, inputs = new_kernel(module, pool, inst, name + ".launch", noalias_output)
    b = launcher.builder
    size = i64(plan.taps * depth * outputs * 4)
    scratch = b.call(declare(module, "malloc", ir.FunctionType(PTR, [I64])), [size],
                     name="conv.filter")
    parallel.emit_launch(launcher, transpose.function, [output, *inputs, scratch], plan.taps,
                         threads if conv.flops >= TRANSPOSE_PARALLEL_FLOPS else 1)
    parallel.emit_launch(launcher, units.function, [output, *inputs, scratch], plan.units,
                         threads)
    b.call(declare(module, "free", ir.FunctionType(ir.VoidType(), [PTR])), [scratch])
    b.ret_void()
    return launcher.function


def _emit_unit(ctx: KernelContext, inst: Instruction, plan: DirectPlan, output: ir.Value,
               unit: ir.Value, rhs: ir.Value) -> None:
    """One unit over a `01io` filter `rhs` (the operand, or a backprop-input's transposed
    copy)."""
    b = ctx.builder
    conv = plan.conv
    lhs = ctx.buffers[id(inst.operand(0))]
    block = b.urem(unit, i64(plan.pixel_blocks))
    rest = b.udiv(unit, i64(plan.pixel_blocks))
    chunk = b.urem(rest, i64(plan.chunks))
    group = b.udiv(rest, i64(plan.chunks))
    pixel0 = b.mul(block, i64(plan.block_pixels))
    pixel1 = minimum(b, b.add(pixel0, i64(plan.block_pixels)), i64(conv.rows))
    slivers = b.udiv(b.add(b.sub(pixel1, pixel0), i64(plan.rows - 1)), i64(plan.rows))
    zeros = zeroed_row(ctx, conv.group_inputs)
    pointers = ctx.alloca(PTR, name="conv.rows", count=plan.block_pixels * plan.taps)
    _emit_pointers(ctx, plan, lhs, zeros, pointers, pixel0, pixel1,
                   b.mul(group, i64(conv.group_inputs)))
    kernel = micro_kernel(ctx.module, plan.rows, plan.vectors)
    outputs = conv.output_dims[-1]
    strip0 = b.mul(chunk, i64(plan.chunk))
    strip1 = minimum(b, b.add(strip0, i64(plan.chunk)), i64(plan.strips))
    with ctx.loop(strip1, name="strip", start=strip0) as strip:
        column = b.add(b.mul(group, i64(conv.group_outputs)), b.mul(strip, i64(plan.width)))
        filter_slice = b.gep(rhs, [column], source_etype=F32)
        with ctx.loop(slivers, name="sliver") as sliver:
            rows = b.gep(pointers, [b.mul(sliver, i64(plan.rows * plan.taps))],
                         source_etype=PTR)
            first = b.add(pixel0, b.mul(sliver, i64(plan.rows)))
            present = minimum(b, i64(plan.rows), b.sub(pixel1, first))
            target = b.gep(output, [b.add(b.mul(first, i64(outputs)), column)],
                           source_etype=F32)
            b.call(kernel, [rows, i64(plan.taps), i64(conv.group_inputs), filter_slice,
                            i64(conv.group_inputs * outputs), i64(outputs), target,
                            i64(outputs), present, ir.Constant(I1, 0)])


def _emit_pointers(ctx: KernelContext, plan: DirectPlan, lhs: ir.Value, zeros: ir.Value,
                   pointers: ir.Value, pixel0: ir.Value, pixel1: ir.Value,
                   input_offset: ir.Value) -> None:
    """pointers[(sliver · taps + tap) · MR + r]: where pixel pixel0 + sliver·MR + r reads
    its group's input features at window position `tap` (the zeroed row in the padding;
    pixels past pixel1 repeat the last one, whose results are not stored)."""
    b = ctx.builder
    conv = plan.conv
    input_strides = row_major_strides(conv.input_dims)
    sizes = tuple(d.size for d in conv.window)
    tap_strides = row_major_strides(sizes)
    count = b.mul(b.udiv(b.add(b.sub(pixel1, pixel0), i64(plan.rows - 1)), i64(plan.rows)),
                  i64(plan.rows))
    with ctx.loop(count, name="pixel") as slot:
        row = minimum(b, b.add(pixel0, slot), b.sub(pixel1, i64(1)))
        pixel = row_major_index(b, row, conv.output_dims[:-1])
        base = b.add(b.mul(b.udiv(slot, i64(plan.rows)), i64(plan.rows * plan.taps)),
                     b.urem(slot, i64(plan.rows)))
        with ctx.loop_nest(sizes, name="tap") as taps:
            inside, source, tap = window_read(b, conv, pixel, taps, input_strides, tap_strides,
                                              input_offset)
            address = b.select(inside, b.gep(lhs, [source], source_etype=F32), zeros)
            b.store(address, b.gep(pointers, [b.add(base, b.mul(tap, i64(plan.rows)))],
                                   source_etype=PTR))


def window_read(b: ir.IRBuilder, conv: ConvolutionPlan, pixel: list[ir.Value],
                taps: list[ir.Value], input_strides: list[int], tap_strides: list[int],
                input_offset: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(inside, source, tap) of output `pixel` (batch, spatial...) at window position
    `taps`: whether it reads the input rather than the padding, the offset of the input
    features it reads (plus `input_offset`), and the position's row-major number."""
    inside: ir.Value = ir.Constant(I1, 1)
    source = b.add(b.mul(pixel[0], i64(input_strides[0])), input_offset)
    tap = i64(0)
    for i, d in enumerate(conv.window):
        at = b.sub(b.add(b.mul(pixel[1 + i], i64(d.stride)),
                         b.mul(taps[i], i64(d.window_dilation))), i64(d.padding_low))
        inside = b.and_(inside, b.icmp_unsigned("<", at, i64(conv.input_dims[1 + i])))
        source = b.add(source, b.mul(at, i64(input_strides[1 + i])))
        tap = b.add(tap, b.mul(taps[i], i64(tap_strides[i])))
    return inside, source, tap


def micro_kernel(module: ir.Module, rows: int, vectors: int) -> ir.Function:
    """`void kernel(a, taps, depth, w, tap_step, ldw, c, ldc, present, accumulate)`:
    C[0:present, 0:NR] (row stride ldc) = (accumulate ? C : 0) + Σ_{t < taps} Σ_{k <
    depth} a[t·MR + r][k] · w[t·tap_step + k·ldw + j], where a holds MR row pointers per
    window position; each sum one fma chain, t then k ascending, in a vector register."""
    name = f"conv_direct.kernel.f32.{rows}x{vectors}"
    function, existing = internal_function(
        module, name, [PTR, I64, I64, PTR, I64, I64, PTR, I64, I64, I1],
        ["a", "taps", "depth", "w", "tap_step", "ldw", "c", "ldc", "present", "accumulate"])
    if function is None:
        return existing
    function.attributes.add("noinline")
    vector = ir.VectorType(F32, LANES)
    a, taps, depth, w, tap_step, ldw, c, ldc, present, accumulate = function.args
    fma = declare(module, "llvm.fma.v16f32", ir.FunctionType(vector, [vector] * 3))
    entry = function.append_basic_block("entry")
    load_block = function.append_basic_block("load_c")
    header = function.append_basic_block("tap.header")
    body = function.append_basic_block("tap.body")
    done = function.append_basic_block("tap.exit")
    b = ir.IRBuilder(entry)
    b.cbranch(accumulate, load_block, header)
    b.position_at_end(load_block)
    # Rows past `present` load the last present row (in bounds) and are not stored.
    loaded = [[b.load(b.gep(c, [b.add(b.mul(minimum(b, i64(r), b.sub(present, i64(1))), ldc),
                                      i64(v * LANES))], source_etype=F32), typ=vector, align=4)
               for v in range(vectors)] for r in range(rows)]
    b.branch(header)
    b.position_at_end(header)
    tap = b.phi(I64, name="tap")
    tap.add_incoming(i64(0), entry)
    tap.add_incoming(i64(0), load_block)
    sums = [[b.phi(vector, name=f"tap.sum.{r}.{v}") for v in range(vectors)]
            for r in range(rows)]
    for r, line in enumerate(sums):
        for v, phi in enumerate(line):
            phi.add_incoming(ir.Constant(vector, None), entry)
            phi.add_incoming(loaded[r][v], load_block)
    b.cbranch(b.icmp_signed("<", tap, taps), body, done)
    b.position_at_end(body)
    pointers = [b.load(b.gep(a, [b.add(b.mul(tap, i64(rows)), i64(r))], source_etype=PTR),
                       typ=PTR) for r in range(rows)]
    w_tap = b.gep(w, [b.mul(tap, tap_step)], source_etype=F32)

    def operands(k: ir.Value):
        row = b.gep(w_tap, [b.mul(k, ldw)], source_etype=F32)
        columns = [b.load(b.gep(row, [i64(v * LANES)], source_etype=F32), typ=vector, align=4)
                   for v in range(vectors)]
        return columns, lambda r: splat(b, b.load(
            b.gep(pointers[r], [k], source_etype=F32), typ=F32), vector)

    final = register_sums(b, depth, sums, operands, fma, "k")
    for line, values in zip(sums, final):
        for phi, value in zip(line, values):
            phi.add_incoming(value, b.block)
    tap.add_incoming(b.add(tap, i64(1), flags=["nuw", "nsw"]), b.block)
    b.branch(header)
    b.position_at_end(done)
    store_present_rows(b, sums, c, ldc, present)
    b.ret_void()
    return function
