"""Packed GEMM for large f32 dots (`dot.py`'s "packed" strategy): emitted code that packs
both operands the way BLIS does and runs an AVX-512 micro-kernel over the packed panels.

Where it sits: `dot.emit_dot_kernel` builds, for a dot that `fits`, a launcher of
parallel phases over the K blocks (about KC rows of K each; `k_block`) of every batch
element. A first phase packs block 0 of B into strips of NR columns (each strip the
block's rows of NR contiguous floats), strips claimed by the team's threads. Phase q
then computes block q's share of C's row panels (`dot._packed_schedule`), each unit
packing its own rows of A (up to MAX_A_ROWS rows of the block at a time, in slivers of MR rows: one
MR-float column per k) into its own scratch slot and running the micro-kernel over each
MR × NR tile (MR × NR/16 sums in vector registers, one broadcast of packed A and NR/16
vector loads of packed B per k), and its last units pack block q + 1 of B into the other
of two buffers. B is packed once for all units (the library path packed it once per
unit), row panels partition A, so no element is packed twice, and both threads read
the same block of B at a time, which stays in the shared L3.

Every element of C is one chain of fused multiply-adds (`llvm.fma`, never split into a
multiply and an add at any optimization level) over k ascending from 0: a K block
continues from the partial sum its predecessor stored in C, which is the same float a
register would have held. So the result's bits depend on K alone, not on the units,
the blocking (MR, NR, MC, KC), the thread count or the edges (edge tiles run the same
kernel on a copy; tests/codegen/test_gemm_packed.py). The scratch is one `aligned_alloc`
per call, freed at the end: no buffer of the plan's arena is that large, and glibc
serves the same block again (its mmap threshold rises to that size after the first free).

The tile shape and block sizes are those that ran fastest against OpenBLAS on one
thread (docs/benchmarks.md, "Packed GEMM").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import llvmlite.binding as llvm
from llvmlite import ir

from tfxla_lite.codegen.cpu.dot_blocks import (
    initial_sums,
    internal_function,
    masked_intrinsic,
    register_sums,
    splat,
)
from tfxla_lite.codegen.cpu.emitter import (
    I1,
    I32,
    I64,
    PTR,
    KernelContext,
    declare,
    i64,
    minimum,
)

if TYPE_CHECKING:
    from tfxla_lite.codegen.cpu.dot import GemmPlan, Tile

F32 = ir.FloatType()
LANES = 16  # floats per zmm register
MR = 8  # rows of a micro-tile
VECTORS = 3  # zmm vectors of columns per micro-tile: NR = VECTORS * LANES
KC = 512  # K block: a micro-panel of B (KC × NR floats, 96 KiB) is read from L2
MC = 64  # rows of a row panel at least (`dot._packed_schedule`)
# Rows of A packed at a time: a whole panel up to this (the panel's rows × KC floats, at
# most 640 KiB, stay in L2 beside B's micro-panel), so that each strip of B's block is
# read once per panel: 3072³ (192-row panels) on two threads ran at 102.9 GFLOP per CPU
# second against 99.0 when packing 64 rows at a time (2048³'s 128-row panels level).
MAX_A_ROWS = 256
# The micro-kernel steps k by one: unrolled by 4 it ran no faster (2048³ and 3072³, one
# thread) and doubled its LLVM time (47 against 25 ms).
ALIGN = 64
# The scratch (header, two packed K blocks of B, packed A per panel) comes from the C
# library's allocator on each call; where it answers null, the launcher runs the
# library's tiles instead (`dot._emit_packed_kernel`).
ALLOCATOR = "aligned_alloc"
# Below this many flops per GEMM the library (or register blocks) serve the dot: one
# thread, thread CPU (load 2.7), 640³ ran level with OpenBLAS (103.6 against 102.0 GFLOP
# per CPU second, best), 768³ 2-4% ahead, 1024³ 8% ahead; the packed GEMM's functions
# cost about 140 ms more of compile (process CPU) than a library call, which a dot of a
# GFLOP or more (5 ms a call on two cores) repays sooner. Through TF on two threads
# (quiet machine, load 1.3-1.8, `benchmarks/matmul.py 1024 1536 --strategy library`,
# three runs) the library's tiles led at 1024³ (107-110% of tf.matmul against 98-99%)
# and the packed GEMM at 1536³ (95-98% against 91-95%), so the threshold sits between
# them (1 << 32: about 1290³). The benchmark workloads' dots (at most 0.27 GFLOP) stay
# below it.
MIN_FLOPS = 1 << 32


def nr() -> int:
    return VECTORS * LANES


@functools.cache
def available() -> bool:
    """Whether the host has AVX-512 (the micro-kernel's 32 vector registers and 16
    lanes; elsewhere `llvm.fma` on 16 lanes would be split or called)."""
    features = llvm.get_host_cpu_features().flatten().split(",")
    return "+avx512f" in features


def fits(plan: GemmPlan) -> bool:
    """Whether the packed GEMM should compute `plan`: f32, AVX-512, at least MIN_FLOPS per
    GEMM (smaller dots keep the library or the register blocks: see docs/benchmarks.md,
    "Packed GEMM")."""
    return (plan.element_bytes == 4 and available() and plan.k >= 1 and plan.m >= MR
            and plan.n >= nr() and 2 * plan.m * plan.n * plan.k >= MIN_FLOPS)


def strips(n: int) -> int:
    return -(-n // nr())


def k_block(plan: GemmPlan) -> int:
    """The K block of `plan`: K cut in equal blocks of about KC (up to a quarter more),
    so that no block is a sliver of a few k (2051 = 4 × 513, not 4 × 512 + 3: each block
    costs a pass over C and a parallel phase). The bits do not depend on it."""
    blocks = -(-plan.k // (KC + KC // 4))
    return -(-plan.k // blocks)


def packed_b_floats(plan: GemmPlan) -> int:
    """Floats of one packed K block of B (k_block rows of every strip)."""
    return strips(plan.n) * nr() * k_block(plan)


# The scratch opens with a header (one cache line) where the launcher stores the blocks
# that the next phase computes and packs, for the units to read (`set_blocks`).
HEADER_FLOATS = ALIGN // 4


def a_rows(panel_rows: int) -> int:
    """Rows of A packed at a time for panels of `panel_rows` rows (whole slivers)."""
    return -(-min(panel_rows, MAX_A_ROWS) // MR) * MR


def packed_a_floats(plan: GemmPlan, panel_rows: int) -> int:
    """Floats of one unit's packed A block (a_rows × k_block)."""
    return a_rows(panel_rows) * k_block(plan)


# -- small IR helpers ------------------------------------------------------------------------

@contextmanager
def _loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int = 1, name: str = "i"
          ) -> Iterator[ir.Value]:
    """for i in range(start, stop, step): an i64 phi loop (stop - start a multiple of step
    or the last step overshooting stop is excluded: i < stop is tested)."""
    function = b.function
    preheader = b.block
    header = function.append_basic_block(f"{name}.header")
    body = function.append_basic_block(f"{name}.body")
    after = function.append_basic_block(f"{name}.after")
    b.branch(header)
    b.position_at_end(header)
    index = b.phi(I64, name=name)
    index.add_incoming(start, preheader)
    b.cbranch(b.icmp_signed("<", index, stop), body, after)
    b.position_at_end(body)
    yield index
    index.add_incoming(b.add(index, i64(step), flags=["nsw"]), b.block)
    b.branch(header)
    b.position_at_end(after)


def _at(b: ir.IRBuilder, base: ir.Value, offset: ir.Value) -> ir.Value:
    return b.gep(base, [offset], inbounds=True, source_etype=F32)


def _vector() -> ir.VectorType:
    return ir.VectorType(F32, LANES)


# -- the micro-kernel ------------------------------------------------------------------------

def micro_kernel(module: ir.Module) -> ir.Function:
    """`void kernel(pa, pb, kc, c, ldc, accumulate)`: C[0:MR, 0:NR] (row stride ldc) =
    (accumulate ? C : 0) + Σ_{k < kc} pa[k·MR + r] · pb[k·NR + j], each sum one fma chain
    over k ascending in a vector register."""
    name = f"gemm_packed.kernel.f32.{MR}x{VECTORS}"
    function, existing = internal_function(module, name, [PTR, PTR, I64, PTR, I64, I1],
                                   ["pa", "pb", "kc", "c", "ldc", "accumulate"])
    if function is None:
        return existing
    function.attributes.add("noinline")
    pa, pb, kc, c, ldc, accumulate = function.args
    vector = _vector()
    fma = declare(module, "llvm.fma.v16f32", ir.FunctionType(vector, [vector] * 3))
    b = ir.IRBuilder(function.append_basic_block("entry"))
    sums = initial_sums(b, accumulate, MR, VECTORS, lambda r, v: b.load(
        _at(b, c, b.add(b.mul(i64(r), ldc), i64(v * LANES))), typ=vector, align=4))

    def operands(k: ir.Value) -> tuple[list[ir.Value], Callable[[int], ir.Value]]:
        columns = [b.load(_at(b, pb, b.add(b.mul(k, i64(nr())), i64(v * LANES))),
                          typ=vector, align=ALIGN) for v in range(VECTORS)]
        a_base = b.mul(k, i64(MR))
        return columns, lambda r: splat(b, b.load(_at(b, pa, b.add(a_base, i64(r))), typ=F32),
                                        vector)

    current = register_sums(b, kc, sums, operands, fma, "k")
    for r in range(MR):
        for v in range(VECTORS):
            b.store(current[r][v], _at(b, c, b.add(b.mul(i64(r), ldc), i64(v * LANES))),
                    align=4)
    b.ret_void()
    return function


# -- packing ---------------------------------------------------------------------------------

def _lane_mask(b: ir.IRBuilder, first: int, count: ir.Value) -> ir.Value:
    """Lanes first + (0..LANES) < count, as a <LANES x i1>."""
    lanes = ir.Constant(ir.VectorType(I64, LANES), [first + j for j in range(LANES)])
    return b.icmp_signed("<", lanes, splat(b, count, ir.VectorType(I64, LANES)))


def _gathered(b: ir.IRBuilder, width: int, load: Callable[[int], ir.Value]) -> ir.Value:
    """A <width x float> of load(0), ..., load(width - 1): vector-typed, so that LLVM's
    loop vectorizer leaves the loop alone (it spent 40-60 ms of compile on each packing
    loop written with scalar stores, for packing that is a few percent of the work)."""
    vector = ir.Constant(ir.VectorType(F32, width), ir.Undefined)
    for j in range(width):
        vector = b.insert_element(vector, load(j), ir.Constant(I32, j))
    return vector


def pack_b(module: ir.Module, transposed: bool) -> ir.Function:
    """`void pack_b(b, ldb, kc, n, dest, s0, s1)`: strips [s0, s1) of B's kc × N block
    (element (kk, j) at b[kk·ldb + j], or b[j·ldb + kk] when `transposed`) into dest:
    strip s at dest + s·kc·NR, row kk of it NR contiguous floats (past N: zeros, or the
    last column again when transposed; only edge tiles read them, which store none)."""
    name = f"gemm_packed.pack_b.f32.{nr()}{'.t' if transposed else ''}"
    function, existing = internal_function(module, name, [PTR, I64, I64, I64, PTR, I64, I64],
                                   ["b", "ldb", "kc", "n", "dest", "s0", "s1"])
    if function is None:
        return existing
    source, ldb, kc, n, dest, s0, s1 = function.args
    b = ir.IRBuilder(function.append_basic_block("entry"))
    width = nr()
    with _loop(b, s0, s1, name="strip") as strip:
        col0 = b.mul(strip, i64(width))
        columns = minimum(b, i64(width), b.sub(n, col0))
        strip_dest = b.mul(b.mul(strip, kc), i64(width))
        if transposed:
            # Column j of the strip is a contiguous row of B^T. Columns past N repeat the
            # last one (every load in bounds): the tiles they feed are edge tiles, whose
            # columns past N are never stored.
            with _loop(b, i64(0), i64(VECTORS), name="vector") as v:
                first = b.mul(v, i64(LANES))
                starts = [b.mul(b.add(col0, minimum(b, b.add(first, i64(j)),
                                                     b.sub(columns, i64(1)))), ldb)
                          for j in range(LANES)]
                with _loop(b, i64(0), kc, name="k") as kk:
                    vector = _gathered(b, LANES, lambda j, kk=kk: b.load(
                        _at(b, source, b.add(starts[j], kk)), typ=F32))
                    b.store(vector, _at(b, dest, b.add(strip_dest, b.add(
                        b.mul(kk, i64(width)), first))), align=ALIGN)
        else:
            masks = [_lane_mask(b, v * LANES, columns) for v in range(VECTORS)]
            with _loop(b, i64(0), kc, name="k") as kk:
                for v in range(VECTORS):
                    at = b.add(b.mul(kk, ldb), b.add(col0, i64(v * LANES)))
                    value = b.call(masked_intrinsic(module, "load", _vector()), [
                        _at(b, source, at), ir.Constant(I32, 4), masks[v],
                        ir.Constant(_vector(), None)])
                    b.store(value, _at(b, dest, b.add(strip_dest, b.add(
                        b.mul(kk, i64(width)), i64(v * LANES)))), align=ALIGN)
    b.ret_void()
    return function


def pack_a(module: ir.Module, transposed: bool) -> ir.Function:
    """`void pack_a(a, lda, rows, kc, dest)`: rows × kc of A (element (i, kk) at
    a[i·lda + kk], or a[kk·lda + i] when `transposed`) into slivers of MR rows: sliver t
    at dest + t·kc·MR, its k-th MR floats contiguous (past `rows` the last row again:
    only edge tiles read them, which store none)."""
    name = f"gemm_packed.pack_a.f32.{MR}{'.t' if transposed else ''}"
    function, existing = internal_function(module, name, [PTR, I64, I64, I64, PTR],
                                   ["a", "lda", "rows", "kc", "dest"])
    if function is None:
        return existing
    source, lda, rows, kc, dest = function.args
    b = ir.IRBuilder(function.append_basic_block("entry"))
    slivers = b.sdiv(b.add(rows, i64(MR - 1)), i64(MR))
    with _loop(b, i64(0), slivers, name="sliver") as sliver:
        row0 = b.mul(sliver, i64(MR))
        sliver_dest = b.mul(b.mul(sliver, kc), i64(MR))
        present = b.sub(rows, row0)
        # Rows past the end repeat the last present row (every load in bounds): the
        # tiles they feed are edge tiles, whose rows past `rows` are never stored.
        lines = [b.add(row0, minimum(b, i64(r), b.sub(present, i64(1)))) for r in range(MR)]
        starts = lines if transposed else [b.mul(line, lda) for line in lines]
        with _loop(b, i64(0), kc, name="k") as kk:
            step = b.mul(kk, lda) if transposed else kk

            def load(r: int, step: ir.Value = step) -> ir.Value:
                return b.load(_at(b, source, b.add(starts[r], step)), typ=F32)
            b.store(_gathered(b, MR, load),
                    _at(b, dest, b.add(sliver_dest, b.mul(kk, i64(MR)))), align=4 * (MR & -MR))
    b.ret_void()
    return function


# -- a panel of C ----------------------------------------------------------------------------

def panel(module: ir.Module, transpose_a: bool, packed_rows: int) -> ir.Function:
    """`void panel(a, lda, pb, pc, kc, n, c, ldc, rows, pa)`: C[0:rows, 0:N] (+)= A[0:rows,
    pc:pc+kc] @ B[pc:pc+kc] (accumulating unless pc = 0) for rows of A from `a` (A's first
    row of the panel; `transpose_a` as in GemmPlan), the K block of B packed at `pb`
    (`pack_b`), C from `c` (row stride ldc), `pa` this unit's scratch of
    packed_a_floats(). `packed_rows` rows of A packed at a time, then every strip of B against
    every sliver of A (the strip's kc × NR floats stay in L2 across the slivers). Edge
    tiles (fewer than MR rows or NR columns) run the kernel on a zeroed MR × NR copy and
    copy the present part back."""
    name = f"gemm_packed.panel.f32.{MR}x{VECTORS}.{packed_rows}{'.t' if transpose_a else ''}"
    function, existing = internal_function(module, name,
                                   [PTR, I64, PTR, I64, I64, I64, PTR, I64, I64, PTR],
                                   ["a", "lda", "pb", "pc", "kc", "n", "c", "ldc", "rows", "pa"])
    if function is None:
        return existing
    a, lda, pb, pc, kc, n, c, ldc, rows, pa = function.args
    function.attributes.add("noinline")  # called once per unit: inlining it only costs LLVM time
    kernel = micro_kernel(module)
    packer = pack_a(module, transpose_a)
    width = nr()
    b = ir.IRBuilder(function.append_basic_block("entry"))
    edge = b.alloca(_vector(), size=i64(MR * VECTORS), name="edge")  # MR × NR floats
    edge.align = ALIGN
    strip_count = b.sdiv(b.add(n, i64(width - 1)), i64(width))
    accumulate = b.icmp_signed(">", pc, i64(0))
    with _loop(b, i64(0), rows, step=packed_rows, name="ic") as ic:
        mc = minimum(b, i64(packed_rows), b.sub(rows, ic))
        a_start = b.add(b.mul(pc, lda), ic) if transpose_a else b.add(b.mul(ic, lda), pc)
        b.call(packer, [_at(b, a, a_start), lda, mc, kc, pa])
        slivers = b.sdiv(b.add(mc, i64(MR - 1)), i64(MR))
        with _loop(b, i64(0), strip_count, name="strip") as strip:
            col0 = b.mul(strip, i64(width))
            columns = minimum(b, i64(width), b.sub(n, col0))
            strip_b = _at(b, pb, b.mul(b.mul(strip, kc), i64(width)))
            with _loop(b, i64(0), slivers, name="sliver") as sliver:
                row0 = b.add(ic, b.mul(sliver, i64(MR)))
                present = minimum(b, i64(MR), b.sub(mc, b.mul(sliver, i64(MR))))
                sliver_a = _at(b, pa, b.mul(b.mul(sliver, kc), i64(MR)))
                c_tile = _at(b, c, b.add(b.mul(row0, ldc), col0))
                whole = b.and_(b.icmp_signed("==", present, i64(MR)),
                               b.icmp_signed("==", columns, i64(width)))
                with b.if_else(whole) as (then, otherwise):
                    with then:
                        b.call(kernel, [sliver_a, strip_b, kc, c_tile, ldc, accumulate])
                    with otherwise:
                        _edge_tile(b, kernel, edge, sliver_a, strip_b, kc, c_tile, ldc,
                                   accumulate, present, columns)
    b.ret_void()
    return function


def _edge_vector(b: ir.IRBuilder, edge: ir.Value, row: ir.Value, v: int) -> ir.Value:
    index = b.add(b.mul(row, i64(VECTORS)), i64(v))
    return b.gep(edge, [index], inbounds=True, source_etype=_vector())


def _edge_tile(b: ir.IRBuilder, kernel: ir.Function, edge: ir.Value, sliver_a: ir.Value,
               strip_b: ir.Value, kc: ir.Value, c_tile: ir.Value, ldc: ir.Value,
               accumulate: ir.Value, present: ir.Value, columns: ir.Value) -> None:
    """An edge tile through the MR × NR copy `edge`: masked loads of the present part of C
    (zeros elsewhere, and everywhere unless `accumulate`), the kernel, masked stores.
    Masked-off lanes touch no memory, so rows past `present` read nothing."""
    module = b.module
    none = ir.Constant(_vector(), None)
    masks = [_lane_mask(b, v * LANES, columns) for v in range(VECTORS)]
    off = ir.Constant(masks[0].type, None)
    with _loop(b, i64(0), i64(MR), name="edge.in") as r:
        load = b.and_(b.icmp_signed("<", r, present), accumulate)
        for v in range(VECTORS):
            value = b.call(masked_intrinsic(module, "load", _vector()), [
                _at(b, c_tile, b.add(b.mul(r, ldc), i64(v * LANES))), ir.Constant(I32, 4),
                b.select(load, masks[v], off), none])
            b.store(value, _edge_vector(b, edge, r, v), align=ALIGN)
    b.call(kernel, [sliver_a, strip_b, kc, edge, i64(nr()), ir.Constant(I1, 1)])
    with _loop(b, i64(0), present, name="edge.out") as r:
        for v in range(VECTORS):
            value = b.load(_edge_vector(b, edge, r, v), typ=_vector(), align=ALIGN)
            b.call(masked_intrinsic(module, "store", _vector()), [
                value, _at(b, c_tile, b.add(b.mul(r, ldc), i64(v * LANES))),
                ir.Constant(I32, 4), masks[v]])


# -- a unit of `dot.py`'s schedule -----------------------------------------------------------

def k_blocks(plan: GemmPlan) -> int:
    return -(-plan.k // k_block(plan))


def block_of(b: ir.IRBuilder, scratch: ir.Value, plan: GemmPlan, which: int
             ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value]:
    """(batch element, pc, kc, packed B, whether there is such a block) of the block that
    the current phase computes (`which` 0) or packs (1), from the scratch's header:
    blocks are numbered over (batch element, K block), and block q's B is packed in
    buffer q mod 2, so that a phase packs the next block while it computes this one."""
    block = b.load(b.gep(scratch, [i64(which)], source_etype=I64), typ=I64)
    present = b.icmp_signed(">=", block, i64(0))
    block = b.select(present, block, i64(0))
    count = k_blocks(plan)
    element = b.sdiv(block, i64(count))
    pc = b.mul(b.srem(block, i64(count)), i64(k_block(plan)))
    kc = minimum(b, i64(k_block(plan)), b.sub(i64(plan.k), pc))
    buffer = b.add(i64(HEADER_FLOATS), b.mul(b.srem(block, i64(2)), i64(packed_b_floats(plan))))
    return element, pc, kc, _at(b, scratch, buffer), present


def set_blocks(b: ir.IRBuilder, scratch: ir.Value, compute: ir.Value, pack: ir.Value) -> None:
    """The header: the block the next phase computes and the one it packs (-1: none)."""
    b.store(compute, b.gep(scratch, [i64(0)], source_etype=I64))
    b.store(pack, b.gep(scratch, [i64(1)], source_etype=I64))


def scratch_floats(plan: GemmPlan, panels: int, panel_rows: int) -> int:
    """The header, two packed K blocks of B, one packed-A slot per row panel."""
    return (HEADER_FLOATS + 2 * packed_b_floats(plan)
            + panels * packed_a_floats(plan, panel_rows))


def emit_tile(ctx: KernelContext, tile: Tile, scratch: ir.Value, unit: ir.Value,
              panel_rows: int) -> None:
    """The current K block's share of C[tile] by the panel function: the tile is a row
    panel of the whole width (`dot._packed_schedule`); the K block of B packed by the
    phase before, this unit's packed A after both B buffers."""
    plan, b = tile.plan, ctx.builder
    _, pc, kc, packed_b, _ = block_of(b, scratch, plan, 0)
    a_start = tile.row0 if plan.transpose_a else b.mul(tile.row0, i64(plan.lda))
    slot = i64(HEADER_FLOATS + 2 * packed_b_floats(plan))
    slot = b.add(slot, b.mul(unit, i64(packed_a_floats(plan, panel_rows))))
    function = panel(ctx.module, plan.transpose_a, a_rows(panel_rows))
    b.call(function, [
        _at(b, tile.lhs, b.add(tile.lhs_offset, a_start)), i64(plan.lda), packed_b, pc, kc,
        i64(plan.n), _at(b, tile.out, b.add(tile.out_offset, b.mul(tile.row0, i64(plan.n)))),
        i64(plan.n), b.sub(tile.row1, tile.row0), _at(b, scratch, slot)])
