"""CPU code for filter gradients as direct register blocks (f32, AVX-512).

Where it sits: `convolution_filter.emit_filter_gradient_kernel` hands a filter gradient
its `plan` accepts (dW[taps, Cin, Cout] = Pᵀ·dY, XLA's `f01b_i01o->01bf`) to this module
when `direct_plan` takes it; the patches and library GEMMs serve the rest. A micro-kernel
keeps an MR × NR block of dW (MR input features of one window position by NR = V·16
output features) in vector registers and walks the pixels: per pixel it broadcasts the
MR input features the position reads (through a pointer per pixel, computed once per
block of pixels; a zeroed row where the position falls in the padding) and multiplies
them by the pixel's NR output gradients, read in place. Neither operand is copied, where
the GEMM path copied each block's patch columns and the library packed both again.

Units are (group, window position, block of input features, block of output features):
each owns its part of dW and walks all pixels, in blocks, continuing each sum from the
value stored after the block before (the same float a register would hold). Every
element is one chain of fused multiply-adds over the pixels in ascending order, so the
result does not depend on the thread count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llvmlite import ir

from tfxla_lite.codegen.cpu import gemm_packed, parallel
from tfxla_lite.codegen.cpu.dot import NewKernel
from tfxla_lite.codegen.cpu.dot_blocks import (
    initial_sums,
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
    from tfxla_lite.codegen.cpu.convolution_filter import FilterGradientPlan

F32 = ir.FloatType()
LANES = 16
# Candidate rows (input features) of the register block for V vectors of output
# features, widest first: each keeps at most 24 sums in the 32 zmm registers.
ROWS_FOR_VECTORS = {4: (6, 5, 4), 3: (8, 7, 6), 2: (12, 10, 8), 1: (12, 10, 8)}
# Fewer input features fill too little of a register block (the first layer's colours:
# 1 of 8 rows, 0.5x the GEMM path on small_cnn's 28×28×1 filter gradient).
MIN_INPUTS = 8
# A row count is taken when padding the input features to its multiple wastes at most
# this share of the products.
MAX_WASTE = 1 / 8
# Pixels per block: their input rows and output gradients (block × NR floats) stay in
# L1 while the unit's register blocks pass over them (128 pixels spilled to L2).
BLOCK_PIXELS = 32
# At least this many units when the result allows; fixed by the shape, never by the
# thread count.
MIN_UNITS = 4


@dataclass(frozen=True)
class FilterDirectPlan:
    """A filter gradient as register blocks of input × output features per position."""

    conv: FilterGradientPlan
    vectors: int  # V
    rows: int  # MR: input features per register block
    input_block: int  # input features per unit, a multiple of MR (or all of them)
    chunk: int  # NR-wide strips of output features per unit

    @property
    def width(self) -> int:
        return self.vectors * LANES

    @property
    def strips(self) -> int:
        return self.conv.group_outputs // self.width

    @property
    def unit_counts(self) -> tuple[int, int, int, int]:
        """Groups, window positions, input-feature blocks and strip chunks."""
        return (self.conv.groups, self.conv.taps, -(-self.conv.group_inputs // self.input_block),
                -(-self.strips // self.chunk))

    @property
    def units(self) -> int:
        groups, taps, inputs, chunks = self.unit_counts
        return groups * taps * inputs * chunks


def direct_plan(conv: FilterGradientPlan) -> FilterDirectPlan | None:
    """The register-block plan of `conv`, or None where the GEMM path keeps it: not f32,
    no AVX-512, fewer than MIN_INPUTS input features, output features not a multiple of
    16 per group."""
    if conv.element_type != "f32" or not gemm_packed.available() \
            or conv.group_outputs % LANES or conv.pixels == 0 \
            or conv.group_inputs < MIN_INPUTS:
        return None
    vectors = next(v for v in (4, 3, 2, 1) if conv.group_outputs % (v * LANES) == 0)
    inputs = conv.group_inputs
    candidates = ROWS_FOR_VECTORS[vectors]
    rows = next((r for r in candidates if -(-inputs // r) * r - inputs <= MAX_WASTE * inputs),
                min(candidates, key=lambda r: -(-inputs // r) * r))
    slivers = -(-inputs // rows)
    strips = conv.group_outputs // (vectors * LANES)
    input_blocks, chunks = 1, 1
    # Split the input features first (each unit then reads fewer input rows per pixel,
    # the same output gradients), then the output features.
    while conv.groups * conv.taps * input_blocks * chunks < MIN_UNITS:
        if input_blocks < slivers:
            input_blocks += 1
        elif chunks < strips:
            chunks += 1
        else:
            break
    input_block = -(-slivers // input_blocks) * rows
    return FilterDirectPlan(conv, vectors, rows, input_block, -(-strips // chunks))


def emit_direct_kernel(module: ir.Module, pool: object, inst: Instruction, name: str,
                       noalias_output: bool, threads: int, new_kernel: NewKernel,
                       plan: FilterDirectPlan) -> ir.Function:
    """The kernel of `plan`: its units on `threads` threads."""
    return parallel.emit_unit_kernel(
        module, pool, inst, name, noalias_output, new_kernel, plan.units, threads,
        lambda ctx, output, unit: _emit_unit(ctx, inst, plan, output, unit))


def _emit_unit(ctx: KernelContext, inst: Instruction, plan: FilterDirectPlan,
               output: ir.Value, unit: ir.Value) -> None:
    b = ctx.builder
    conv = plan.conv
    x = ctx.buffers[id(inst.operand(0))]
    dy = ctx.buffers[id(inst.operand(1))]
    _, taps, input_blocks, chunks = plan.unit_counts
    chunk = b.urem(unit, i64(chunks))
    rest = b.udiv(unit, i64(chunks))
    input_index = b.urem(rest, i64(input_blocks))
    rest = b.udiv(rest, i64(input_blocks))
    tap = b.urem(rest, i64(taps))
    group = b.udiv(rest, i64(taps))
    input0 = b.mul(input_index, i64(plan.input_block))
    input1 = minimum(b, b.add(input0, i64(plan.input_block)), i64(conv.group_inputs))
    strip0 = b.mul(chunk, i64(plan.chunk))
    strip1 = minimum(b, b.add(strip0, i64(plan.chunk)), i64(plan.strips))
    outputs = conv.grad_dims[-1]
    channel0 = b.mul(group, i64(conv.group_inputs))
    zeros = zeroed_row(ctx, conv.group_inputs)
    pointers = ctx.alloca(PTR, name="conv.pixels", count=BLOCK_PIXELS)
    kernel = micro_kernel(ctx.module, plan.rows, plan.vectors)
    # dW[tap, input, column]: row (tap · Cg + input) of the result, row stride O.
    result_row = b.mul(tap, i64(conv.group_inputs))
    blocks = -(-conv.pixels // BLOCK_PIXELS)
    with ctx.loop(blocks, name="pixel.block") as block:
        pixel0 = b.mul(block, i64(BLOCK_PIXELS))
        pixel1 = minimum(b, b.add(pixel0, i64(BLOCK_PIXELS)), i64(conv.pixels))
        _emit_pointers(ctx, conv, x, zeros, pointers, pixel0, pixel1, tap, channel0)
        count = b.sub(pixel1, pixel0)
        accumulate = b.icmp_unsigned("!=", block, i64(0))
        with ctx.loop(strip1, name="strip", start=strip0) as strip:
            column = b.add(b.mul(group, i64(conv.group_outputs)),
                           b.mul(strip, i64(plan.width)))
            gradient = b.gep(dy, [b.add(b.mul(pixel0, i64(outputs)), column)],
                             source_etype=F32)
            slivers = b.udiv(b.add(b.sub(input1, input0), i64(plan.rows - 1)),
                             i64(plan.rows))
            with ctx.loop(slivers, name="sliver") as sliver:
                first = b.add(input0, b.mul(sliver, i64(plan.rows)))
                present = minimum(b, i64(plan.rows), b.sub(input1, first))
                target = b.gep(output, [b.add(b.mul(b.add(result_row, first), i64(outputs)),
                                              column)], source_etype=F32)
                b.call(kernel, [pointers, count, first, gradient, i64(outputs), target,
                                i64(outputs), present, accumulate])


def _emit_pointers(ctx: KernelContext, conv: FilterGradientPlan, x: ir.Value,
                   zeros: ir.Value, pointers: ir.Value, pixel0: ir.Value, pixel1: ir.Value,
                   tap: ir.Value, channel0: ir.Value) -> None:
    """pointers[p - pixel0]: the group's input features that output pixel p reads at
    window position `tap` (the zeroed row in the padding)."""
    b = ctx.builder
    input_strides = row_major_strides(conv.input_dims)
    positions = row_major_index(b, tap, conv.taps_dims)
    with ctx.loop(pixel1, name="pixel", start=pixel0) as row:
        pixel = row_major_index(b, row, conv.grad_dims[:-1])
        inside: ir.Value = ir.Constant(I1, 1)
        source = b.add(b.mul(pixel[0], i64(input_strides[0])), channel0)
        for i, d in enumerate(conv.window):
            # The forward's stride is this window's dilation, its dilation the stride.
            at = b.sub(b.add(b.mul(pixel[1 + i], i64(d.window_dilation)),
                             b.mul(positions[i], i64(d.stride))), i64(d.padding_low))
            inside = b.and_(inside, b.icmp_unsigned("<", at, i64(conv.input_dims[1 + i])))
            source = b.add(source, b.mul(at, i64(input_strides[1 + i])))
        address = b.select(inside, b.gep(x, [source], source_etype=F32), zeros)
        b.store(address, b.gep(pointers, [b.sub(row, pixel0)], source_etype=PTR))


def micro_kernel(module: ir.Module, rows: int, vectors: int) -> ir.Function:
    """`void kernel(a, count, first, g, ldg, c, ldc, present, accumulate)`: C[0:present,
    0:NR] (row stride ldc) = (accumulate ? C : 0) + Σ_{p < count} a[p][first + r] ·
    g[p·ldg + j], a holding a row pointer per pixel; each sum one fma chain over p
    ascending in a vector register. Rows past `present` read row present - 1 and are
    not stored."""
    name = f"conv_filter_direct.kernel.f32.{rows}x{vectors}"
    function, existing = internal_function(
        module, name, [PTR, I64, I64, PTR, I64, PTR, I64, I64, I1],
        ["a", "count", "first", "g", "ldg", "c", "ldc", "present", "accumulate"])
    if function is None:
        return existing
    function.attributes.add("noinline")
    vector = ir.VectorType(F32, LANES)
    a, count, first, g, ldg, c, ldc, present, accumulate = function.args
    fma = declare(module, "llvm.fma.v16f32", ir.FunctionType(vector, [vector] * 3))
    b = ir.IRBuilder(function.append_basic_block("entry"))
    last = b.sub(present, i64(1))
    lines = [minimum(b, i64(r), last) for r in range(rows)]
    offsets = [b.add(first, line) for line in lines]
    sums = initial_sums(b, accumulate, rows, vectors, lambda r, v: b.load(
        b.gep(c, [b.add(b.mul(lines[r], ldc), i64(v * LANES))], source_etype=F32),
        typ=vector, align=4))

    def operands(p: ir.Value):
        pointer = b.load(b.gep(a, [p], source_etype=PTR), typ=PTR)
        row = b.gep(g, [b.mul(p, ldg)], source_etype=F32)
        columns = [b.load(b.gep(row, [i64(v * LANES)], source_etype=F32), typ=vector, align=4)
                   for v in range(vectors)]
        return columns, lambda r: splat(b, b.load(
            b.gep(pointer, [offsets[r]], source_etype=F32), typ=F32), vector)

    final = register_sums(b, count, sums, operands, fma, "p")
    store_present_rows(b, final, c, ldc, present)
    b.ret_void()
    return function
