"""Register blocks of a GEMM-shaped dot (`dot.py`'s "blocked" strategy): a unit's tile
of C computed by emitted code, BLOCK_ROWS rows × BLOCK_VECTORS vectors of columns at a
time, each sum held in a vector register over the whole K (k ascending, one fused
multiply-add per term) and read straight from A's and B's buffers: no packing and no
library call. A transposed B is read by dot-product blocks over a long K, and over a
short K from a transposed copy of the tile's columns on the stack (`fits_copy`).

Where it sits: `dot.emit_dot_kernel` cuts a dot into units (`dot.schedule`) and calls
`emit_tile` per unit and batch element when `dot.choose_strategy` picked "blocked"
(`fits`); the kOutput epilogue then runs over the tile as after a library call. Every
element is summed in one order, fixed by K alone, so results depend neither on the
units nor on the thread count.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import llvmlite.binding as llvm
from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import (
    I32,
    I64,
    PTR,
    VOID,
    KernelContext,
    declare,
    i64,
    minimum,
    value_type,
)

if TYPE_CHECKING:
    from tfxla_lite.codegen.cpu.dot import GemmPlan, Tile

# Where the library packs B's panel for few rows of A (M = 64: each packed element
# serves 64 rows), its packing is a large share of the work; these blocks read B's rows
# where they lie (a block's columns of B, K × 32 floats, stay in L2 for the tile's other
# row blocks), A's elements broadcast one at a time. 8 rows × 2 vectors keep 16 sums
# (16 of AVX-512's 32 registers) and issue 16 multiply-adds per 10 loads. From about
# 1024³ the library is level and then ahead (A's rows come from L3 and nothing is
# blocked for the caches), hence MAX_MACS. Splitting such a dot costs no packing, so
# `dot.schedule` cuts its units down to MIN_UNIT_FLOPS.
BLOCK_ROWS = 8
BLOCK_VECTORS = 2
MAX_MACS = 1 << 27
# Rows of A (M) at most: where each packed element of B serves few rows, the library's
# packing is the largest share and blocks gain most; with more rows the gain is smaller
# than the LLVM time a block function costs on the first call, at O3 even in the quick
# tier (`tiers.O3_EVEN_WHEN_QUICK`; docs/benchmarks.md, "Register blocks only for few
# rows", measured before blocks compiled on a thread of their own).
MAX_ROWS = 64
MAX_K = 2048  # B's block of columns (K × 32 floats) stays within 256 KiB
# K at most, for any number of rows (up to MAX_MACS) of a row-major A: B's block of
# columns (K × 128 bytes) then stays in L1 while every row block of the unit reads it,
# and the library's packing and edge handling are a large share of so short a product.
# On the Transformer step's 1024×256×64, 1024×64×256 and 1024×64×64 (A not transposed)
# blocks beat the library; at K = 784 (the MLP's 128×512×784 layer) and with A
# transposed (256×64×1024, a weight gradient) they lost (docs/benchmarks.md, "Register
# blocks for short products").
SHORT_K = 256
# With A transposed (a weight gradient hᵀ·dy), blocks beat the library only over a K this
# short (a recurrent step's batch) and at most this many rows; more rows or a longer K
# lost to the library's packed panels (the commit that set them has the measurements).
TRANSPOSED_K = 64
TRANSPOSED_ROWS = 256
# Products narrower than a block but of whole vectors, A's rows contiguous, take blocks
# when a batch of at least this many repeats them (attention's probabilities times values
# over a head's 16 features, one AVX-512 vector): the block function's compile is paid
# once for the microsecond each batch element saves. With A transposed (the values'
# gradient) the library was level.
NARROW_BATCH = 8
# With B transposed over a short K (at most SHORT_K: attention's scores q·kᵀ over a head's
# features, a Dense layer's input gradient dy·Wᵀ), the dot-product blocks' lane sums do
# not pay for themselves (PRODUCT_MIN_K): the tile's columns of B, K × the tile's width of
# at most COPY_BYTES, are copied transposed to the stack and read as a row-major B. Each
# unit copies its columns again: at 64 KiB (a 256×64 weight) the copies cost what the
# blocks gained over the library.
COPY_BYTES = 16 << 10
COPY_STRIP = 64  # bytes: a cache line


def fits(plan: GemmPlan) -> bool:
    """Whether register blocks should compute `plan`: B's rows contiguous (vector loads),
    few rows (MAX_ROWS), a short K with A's rows contiguous (SHORT_K) or a very short K
    with A transposed (TRANSPOSED_K, TRANSPOSED_ROWS), a product small
    enough (MAX_MACS) and at least one full block wide (a narrower one, such as a
    10-class output layer, would compile a block function of its own, about 10 ms of
    LLVM, to save a microsecond a call). With B transposed, dot-product blocks
    (`fits_products`)."""
    if plan.transpose_b:
        return fits_products(plan) or fits_copy(plan)
    rows_fit = plan.m <= MAX_ROWS or (plan.k <= SHORT_K and not plan.transpose_a) or (
        plan.transpose_a and plan.m <= TRANSPOSED_ROWS and plan.k <= TRANSPOSED_K)
    lanes = _lanes(plan.element_bytes)
    wide = plan.n >= BLOCK_VECTORS * lanes or (
        math.prod(plan.batch_sizes) >= NARROW_BATCH and plan.n % lanes == 0
        and not plan.transpose_a)
    return (not plan.transpose_b and 1 <= plan.k <= MAX_K and 1 < plan.m and rows_fit
            and wide and plan.m * plan.n * plan.k <= MAX_MACS)


@functools.cache
def _vector_bits() -> int:
    features = llvm.get_host_cpu_features().flatten().split(",")
    return 512 if "+avx512f" in features else 256


def _lanes(element_bytes: int) -> int:
    return _vector_bits() // (8 * element_bytes)


def _rows() -> int:
    """Rows per block: BLOCK_ROWS with AVX-512's 32 vector registers, half as many with
    AVX2's 16 (8 × 2 sums, two vectors of B and a broadcast would not fit)."""
    return BLOCK_ROWS if _vector_bits() == 512 else BLOCK_ROWS // 2


def fits_copy(plan: GemmPlan) -> bool:
    """Whether `plan` (B transposed) takes register blocks over a transposed copy of B:
    a short K (SHORT_K), B small enough to copy (COPY_BYTES), and the copied plan one
    that `fits` gives blocks."""
    return (plan.transpose_b and plan.k <= SHORT_K
            and plan.k * plan.n * plan.element_bytes <= COPY_BYTES
            and fits(copied(plan, plan.n)))


def copied(plan: GemmPlan, width: int) -> GemmPlan:
    """`plan` reading B from a row-major copy `width` elements wide."""
    return dataclasses.replace(plan, transpose_b=False, ldb=width)


def emit_tile(ctx: KernelContext, tile: Tile, heights: Collection[int],
              widths: Collection[int]) -> None:
    """C[tile] = A[rows] @ B[:, columns] by register blocks: full blocks of
    BLOCK_VECTORS vectors, then single vectors, then one masked vector for the last
    columns; within each, blocks of `_rows()` rows, then single rows. `heights` and
    `widths`: the tiles' possible row and column counts (the schedule knows them), so
    that only the blocks some tile needs are emitted (each costs LLVM time: a 64×784×512
    dense kernel with all six took 59 ms of compile against the library call's 31)."""
    if tile.plan.transpose_b:
        if fits_copy(tile.plan) and not fits_products(tile.plan):
            _emit_copied_tile(ctx, tile, heights, widths)
        else:
            _emit_product_tile(ctx, tile, heights, widths)
        return
    _emit_row_major_tile(ctx, tile, heights, widths)


def _emit_row_major_tile(ctx: KernelContext, tile: Tile, heights: Collection[int],
                         widths: Collection[int]) -> None:
    """`emit_tile` for B's rows contiguous."""
    b = ctx.builder
    lanes = _lanes(tile.plan.element_bytes)
    width = BLOCK_VECTORS * lanes
    singles = any(h % _rows() for h in heights)
    columns = b.sub(tile.col1, tile.col0)
    wide = b.udiv(columns, i64(width))
    if any(w >= width for w in widths):
        with ctx.loop(wide, name="block.j") as strip:
            _emit_block_rows(ctx, tile, b.add(tile.col0, b.mul(strip, i64(width))),
                             BLOCK_VECTORS, None, singles)
    narrow_start = b.add(tile.col0, b.mul(wide, i64(width)))
    narrow = b.udiv(b.sub(tile.col1, narrow_start), i64(lanes))
    if any(w % width >= lanes for w in widths):
        with ctx.loop(narrow, name="vector.j") as vector:
            _emit_block_rows(ctx, tile, b.add(narrow_start, b.mul(vector, i64(lanes))), 1,
                             None, singles)
    if any(w % lanes for w in widths):
        last = b.add(narrow_start, b.mul(narrow, i64(lanes)))
        remainder = b.sub(tile.col1, last)
        with b.if_then(b.icmp_signed(">", remainder, i64(0))), ctx.scope():
            _emit_block_rows(ctx, tile, last, 1, remainder, singles)


def _emit_copied_tile(ctx: KernelContext, tile: Tile, heights: Collection[int],
                      widths: Collection[int]) -> None:
    """C[tile] = A[rows] · B[columns]ᵀ: the tile's rows of the stored B (K elements each)
    copied to a stack scratch as columns of a row-major K × width B, then the row blocks
    over it."""
    plan, b = tile.plan, ctx.builder
    width = max(widths)
    scalar = value_type(tile.element_type)
    scratch = ctx.alloca(scalar, name="dot.b_copy", count=max(1, plan.k * width))

    def at(base: ir.Value, offset: ir.Value) -> ir.Value:
        return b.gep(base, [offset], inbounds=True, source_etype=scalar)

    # Strips of a cache line's width of columns: each strip's rows of B (a line each) stay
    # in L1 over its k, and each k writes one line of the copy (a column at a time, or k
    # at a time, strode across lines that share a handful of L1's sets).
    columns = b.sub(tile.col1, tile.col0)
    strip = COPY_STRIP // plan.element_bytes
    with ctx.loop(b.udiv(b.add(columns, i64(strip - 1)), i64(strip)), name="copy.s") as s:
        first = b.mul(s, i64(strip))
        last = minimum(b, b.add(first, i64(strip)), columns)
        with ctx.loop(plan.k, name="copy.k") as k:
            row = b.mul(k, i64(width))
            with ctx.loop(last, name="copy.j", start=first) as column:
                source = b.mul(b.add(tile.col0, column), i64(plan.ldb))
                b.store(b.load(at(tile.rhs, b.add(tile.rhs_offset, b.add(source, k))),
                               typ=scalar), at(scratch, b.add(row, column)))
    # The blocks read B at rhs_offset + column, column from col0: the copy's column 0.
    _emit_row_major_tile(ctx, dataclasses.replace(
        tile, plan=copied(plan, width), rhs=scratch, rhs_offset=b.sub(i64(0), tile.col0)),
        heights, widths)


def _emit_block_rows(ctx: KernelContext, tile: Tile, col: ir.Value, vectors: int,
                     remainder: ir.Value | None, singles: bool) -> None:
    b, rows = ctx.builder, _rows()
    full = b.udiv(b.sub(tile.row1, tile.row0), i64(rows))
    with ctx.loop(full, name="block.i") as block:
        _emit_block(ctx, tile, b.add(tile.row0, b.mul(block, i64(rows))), rows, col,
                    vectors, remainder)
    if singles:
        with ctx.loop(tile.row1, name="single.i",
                      start=b.add(tile.row0, b.mul(full, i64(rows)))) as row:
            _emit_block(ctx, tile, row, 1, col, vectors, remainder)


def _emit_block(ctx: KernelContext, tile: Tile, row: ir.Value, rows: int, col: ir.Value,
                vectors: int, remainder: ir.Value | None) -> None:
    """C[row + r, col + v·lanes + (0..lanes)] for r < rows, v < vectors, by a call of the
    module's block function (`_block_function`)."""
    plan, b = tile.plan, ctx.builder
    scalar = value_type(tile.element_type)

    def at(base: ir.Value, offset: ir.Value) -> ir.Value:
        return b.gep(base, [offset], inbounds=True, source_etype=scalar)

    row_start = row if plan.transpose_a else b.mul(row, i64(plan.lda))
    arguments = [at(tile.lhs, b.add(tile.lhs_offset, row_start)),
                 i64(1 if plan.transpose_a else plan.lda),
                 i64(plan.lda if plan.transpose_a else 1),
                 at(tile.rhs, b.add(tile.rhs_offset, col)), i64(plan.ldb), i64(plan.k),
                 at(tile.out, b.add(tile.out_offset, b.add(b.mul(row, i64(plan.n)), col))),
                 i64(plan.n)]
    function = _block_function(ctx.module, tile.element_type, plan.element_bytes, rows,
                               vectors, remainder is not None)
    b.call(function, arguments + ([remainder] if remainder is not None else []))


def _block_function(module: ir.Module, element_type: str, element_bytes: int, rows: int,
                    vectors: int, masked: bool) -> ir.Function:
    """`void block(a, a_row_stride, a_k_stride, b, ldb, k, c, ldc[, lanes])`: rows ×
    vectors sums C[r, v·lanes + (0..lanes)] = Σ_k A[r, k]·B[k, v·lanes + ...] over k
    ascending, each in a register (a phi of the k loop), stored once at the end; masked:
    only the first `lanes` lanes of the one vector exist (masked loads and store).

    One function per module and shape of block, called by every tile that needs it:
    LLVM's O3 pipeline spent about 10 ms on each copy of the 8 × 2 loop (16 vector
    phis and multiply-adds), and a module has one copy however many dots it holds."""
    name = f"dot_block.{element_type}.{rows}x{vectors}{'.masked' if masked else ''}"
    parameters = [PTR, I64, I64, PTR, I64, I64, PTR, I64] + ([I64] if masked else [])
    function, existing = internal_function(module, name, parameters, (
        "a", "a_row_stride", "a_k_stride", "b", "ldb", "k", "c", "ldc", "lanes"))
    if function is None:
        return existing
    function.attributes.add("noinline")
    scalar = value_type(element_type)
    lanes = _lanes(element_bytes)
    vector = ir.VectorType(scalar, lanes)
    lhs, row_stride, k_stride, rhs, ldb, count, out, ldc = function.args[:8]
    b = ir.IRBuilder(function.append_basic_block("entry"))
    align = element_bytes
    mask = None
    if masked:
        limit = splat(b, b.trunc(function.args[8], I32), ir.VectorType(I32, lanes))
        mask = b.icmp_unsigned("<", ir.Constant(ir.VectorType(I32, lanes), list(range(lanes))),
                               limit)

    def at(base: ir.Value, offset: ir.Value) -> ir.Value:
        return b.gep(base, [offset], inbounds=True, source_etype=scalar)

    lhs_rows = [at(lhs, b.mul(i64(r), row_stride)) for r in range(rows)]

    def operands(k: ir.Value) -> tuple[list[ir.Value], Callable[[int], ir.Value]]:
        rhs_row = b.mul(k, ldb)
        columns = [_vector_load(module, b, at(rhs, b.add(rhs_row, i64(v * lanes))), vector,
                                align, mask) for v in range(vectors)]
        lhs_column = b.mul(k, k_stride)
        return columns, lambda r: splat(b, b.load(at(lhs_rows[r], lhs_column), typ=scalar),
                                        vector)

    fmuladd = declare(module, f"llvm.fmuladd.{_vector_name(vector)}",
                      ir.FunctionType(vector, [vector] * 3))
    zeros = [[ir.Constant(vector, None)] * vectors for _ in range(rows)]
    sums = register_sums(b, count, zeros, operands, fmuladd, "block.k")
    for r in range(rows):
        out_row = b.mul(i64(r), ldc)
        for v in range(vectors):
            pointer = at(out, b.add(out_row, i64(v * lanes)))
            if mask is None:
                b.store(sums[r][v], pointer, align=align)
            else:
                store = masked_intrinsic(module, "store", vector)
                b.call(store, [sums[r][v], pointer, ir.Constant(I32, align), mask])
    b.ret_void()
    return function


# -- dot-product blocks: B transposed ---------------------------------------------------

# With B transposed (C = A·Bᵀ, B stored n × k: the backward pass of x·W, `dx = dy·Wᵀ`)
# both operands are contiguous along K, so each sum C[i, j] is a dot product of two
# rows: PRODUCT_ROWS rows of A × PRODUCT_COLUMNS rows of B accumulate lane-wise in
# vector registers over K (lane l holds the terms k ≡ l mod lanes, k ascending, a
# masked vector for K's last lanes), then each register's lanes are added pairwise,
# halves first. 4 × 4 blocks keep 16 sums and issue 16 multiply-adds per 8 loads.
PRODUCT_ROWS = 4
PRODUCT_COLUMNS = 4
# K at least: each sum ends in a reduction of its register's lanes, which a short K does
# not pay for (attention's batched scores stay faster with the library).
PRODUCT_MIN_K = 256


def fits_products(plan: GemmPlan) -> bool:
    """Whether dot-product blocks should compute `plan` (B transposed): one product (no
    batch), A's rows contiguous too, few rows of A (MAX_ROWS: the library packs both
    operands, a large share of so small a product), a long K (PRODUCT_MIN_K) and at most
    MAX_K and MAX_MACS, as for the other blocks."""
    return (plan.transpose_b and not plan.transpose_a and not plan.batch_sizes
            and 1 < plan.m <= MAX_ROWS and PRODUCT_MIN_K <= plan.k <= MAX_K
            and plan.m * plan.n * plan.k <= MAX_MACS)


def _product_rows() -> int:
    """Rows per dot-product block: 4 with AVX-512's 32 registers (16 sums and 8
    operands), 2 with AVX2's 16."""
    return PRODUCT_ROWS if _vector_bits() == 512 else PRODUCT_ROWS // 2


def _emit_product_tile(ctx: KernelContext, tile: Tile, heights: Collection[int],
                       widths: Collection[int]) -> None:
    """C[tile] = A[rows] · B[columns]ᵀ by dot-product blocks: strips of `_product_rows()`
    rows (then single rows), each in blocks of PRODUCT_COLUMNS columns (then single
    columns); only the block shapes some tile needs are emitted."""
    b = ctx.builder
    rows, columns = _product_rows(), PRODUCT_COLUMNS
    single_rows = any(h % rows for h in heights)
    single_columns = any(w % columns for w in widths)

    def strip(row: ir.Value, height: int) -> None:
        blocks = b.udiv(b.sub(tile.col1, tile.col0), i64(columns))
        if any(w >= columns for w in widths):
            with ctx.loop(blocks, name="product.j") as block:
                _emit_product_block(ctx, tile, row, height,
                                    b.add(tile.col0, b.mul(block, i64(columns))), columns)
        if single_columns:
            with ctx.loop(tile.col1, name="product.single.j",
                          start=b.add(tile.col0, b.mul(blocks, i64(columns)))) as col:
                _emit_product_block(ctx, tile, row, height, col, 1)

    strips = b.udiv(b.sub(tile.row1, tile.row0), i64(rows))
    if any(h >= rows for h in heights):
        with ctx.loop(strips, name="product.i") as block:
            strip(b.add(tile.row0, b.mul(block, i64(rows))), rows)
    if single_rows:
        with ctx.loop(tile.row1, name="product.single.i",
                      start=b.add(tile.row0, b.mul(strips, i64(rows)))) as row:
            strip(row, 1)


def _emit_product_block(ctx: KernelContext, tile: Tile, row: ir.Value, rows: int,
                        col: ir.Value, columns: int) -> None:
    """C[row + r, col + c] for r < rows, c < columns, by a call of the module's
    dot-product block function of that shape (`_product_function`)."""
    plan, b = tile.plan, ctx.builder
    scalar = value_type(tile.element_type)

    def at(base: ir.Value, offset: ir.Value) -> ir.Value:
        return b.gep(base, [offset], inbounds=True, source_etype=scalar)

    arguments = [at(tile.lhs, b.add(tile.lhs_offset, b.mul(row, i64(plan.lda)))),
                 i64(plan.lda),
                 at(tile.rhs, b.add(tile.rhs_offset, b.mul(col, i64(plan.ldb)))),
                 i64(plan.ldb), i64(plan.k),
                 at(tile.out, b.add(tile.out_offset, b.add(b.mul(row, i64(plan.n)), col))),
                 i64(plan.n)]
    function = _product_function(ctx.module, tile.element_type, plan.element_bytes, rows,
                                 columns)
    b.call(function, arguments)


def _product_function(module: ir.Module, element_type: str, element_bytes: int, rows: int,
                      columns: int) -> ir.Function:
    """`void block(a, lda, b, ldb, k, c, ldc)`: C[r, c] = Σ_k A[r, k]·B[c, k] for r < rows,
    c < columns, A's and B's rows contiguous; one function per module and block shape
    (named `dot_block.` for the tiers, `tiers.O3_EVEN_WHEN_QUICK`)."""
    name = f"dot_block.{element_type}.product.{rows}x{columns}"
    function, existing = internal_function(module, name, [PTR, I64, PTR, I64, I64, PTR, I64],
                                           ("a", "lda", "b", "ldb", "k", "c", "ldc"))
    if function is None:
        return existing
    function.attributes.add("noinline")
    scalar = value_type(element_type)
    lanes = _lanes(element_bytes)
    vector = ir.VectorType(scalar, lanes)
    lhs, lda, rhs, ldb, count, out, ldc = function.args
    b = ir.IRBuilder(function.append_basic_block("entry"))

    def at(base: ir.Value, offset: ir.Value) -> ir.Value:
        return b.gep(base, [offset], inbounds=True, source_etype=scalar)

    lhs_rows = [at(lhs, b.mul(i64(r), lda)) for r in range(rows)]
    rhs_rows = [at(rhs, b.mul(i64(c), ldb)) for c in range(columns)]
    fmuladd = declare(module, f"llvm.fmuladd.{_vector_name(vector)}",
                      ir.FunctionType(vector, [vector] * 3))

    def step(mask: ir.Value | None) -> Callable[[ir.Value], tuple[list[ir.Value],
                                                                  Callable[[int], ir.Value]]]:
        # register_sums' operands, with the roles turned: the "columns" are B's rows,
        # each row of A a vector of its own.
        def operands(k: ir.Value) -> tuple[list[ir.Value], Callable[[int], ir.Value]]:
            offset = b.mul(k, i64(lanes))
            loaded = [_vector_load(module, b, at(pointer, offset), vector, element_bytes, mask)
                      for pointer in rhs_rows]
            return loaded, lambda r: _vector_load(module, b, at(lhs_rows[r], offset), vector,
                                                  element_bytes, mask)
        return operands

    zeros = [[ir.Constant(vector, None)] * columns for _ in range(rows)]
    whole = b.udiv(count, i64(lanes))
    sums = register_sums(b, whole, zeros, step(None), fmuladd, "product.k")
    # K's last lanes (k mod lanes of them): one masked step from the vectors' end.
    left = b.trunc(b.urem(count, i64(lanes)), I32)
    before = b.block
    tail = function.append_basic_block("product.tail")
    done = function.append_basic_block("product.done")
    b.cbranch(b.icmp_unsigned("!=", left, I32(0)), tail, done)
    b.position_at_end(tail)
    mask = b.icmp_unsigned("<", ir.Constant(ir.VectorType(I32, lanes), list(range(lanes))),
                           splat(b, left, ir.VectorType(I32, lanes)))
    loaded, row_of = step(mask)(whole)
    tails = []
    for r in range(rows):
        row_vector = row_of(r)
        tails.append([b.call(fmuladd, [row_vector, column, sums[r][c]])
                      for c, column in enumerate(loaded)])
    b.branch(done)
    b.position_at_end(done)
    totals = [[b.phi(vector, name=f"total.{r}.{c}") for c in range(columns)]
              for r in range(rows)]
    for r in range(rows):
        for c in range(columns):
            totals[r][c].add_incoming(sums[r][c], before)
            totals[r][c].add_incoming(tails[r][c], tail)
    for r in range(rows):
        for c in range(columns):
            b.store(_lanes_sum(b, totals[r][c]), at(out, b.add(b.mul(i64(r), ldc), i64(c))),
                    align=element_bytes)
    b.ret_void()
    return function


def _lanes_sum(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """The sum of a vector's lanes, halves added pairwise: a fixed order."""
    width = value.type.count
    while width > 1:
        width //= 2
        low = b.shuffle_vector(value, value, ir.Constant(ir.VectorType(I32, width),
                                                         list(range(width))))
        high = b.shuffle_vector(value, value, ir.Constant(ir.VectorType(I32, width),
                                                          list(range(width, 2 * width))))
        value = b.fadd(low, high)
    return b.extract_element(value, I32(0))


def register_sums(b: ir.IRBuilder, count: ir.Value, initial: list[list[ir.Value]],
                  operands: Callable[[ir.Value], tuple[list[ir.Value], Callable[[int], ir.Value]]],
                  multiply_add: ir.Function, name: str) -> list[list[ir.Value]]:
    """The k loop of a register block, k from 0 to `count`: sums[r][v] (from `initial`)
    held as phis of its header, each k adding coefficient(r) · columns[v] with
    `multiply_add` (one fused multiply-add: k ascending, one rounding a term), where
    `operands(k)` loads the columns and gives (columns, coefficient), coefficient(r)
    loading row r's, emitted just before that row's multiply-adds; the final sums."""
    function = b.function
    preheader = b.block
    header = function.append_basic_block(f"{name}.header")
    body = function.append_basic_block(f"{name}.body")
    done = function.append_basic_block(f"{name}.exit")
    b.branch(header)
    b.position_at_end(header)
    k = b.phi(I64, name=name)
    k.add_incoming(i64(0), preheader)
    sums = [[b.phi(value.type, name=f"sum.{r}.{v}") for v, value in enumerate(line)]
            for r, line in enumerate(initial)]
    for line, start in zip(sums, initial):
        for phi, value in zip(line, start):
            phi.add_incoming(value, preheader)
    b.cbranch(b.icmp_signed("<", k, count), body, done)
    b.position_at_end(body)
    columns, coefficient_of = operands(k)
    for r, line in enumerate(sums):
        coefficient = coefficient_of(r)
        for phi, column in zip(line, columns):
            phi.add_incoming(b.call(multiply_add, [coefficient, column, phi]), b.block)
    k.add_incoming(b.add(k, i64(1), flags=["nuw", "nsw"]), b.block)
    b.branch(header)
    b.position_at_end(done)
    return sums


def internal_function(module: ir.Module, name: str, parameters: list[ir.Type],
                      names: Collection[str]) -> tuple[ir.Function | None, ir.Function]:
    """(None, the module's function `name`) where it exists, else (the new internal,
    nounwind `void name(parameters)` with its arguments named `names`, itself) to fill:
    one function per module and name, called by every kernel that needs it."""
    existing = module.globals.get(name)
    if isinstance(existing, ir.Function):
        return None, existing
    function = ir.Function(module, ir.FunctionType(VOID, parameters), name=name)
    function.linkage = "internal"
    function.attributes.add("nounwind")
    for argument, text in zip(function.args, names):
        argument.name = text
    return function, function


def initial_sums(b: ir.IRBuilder, accumulate: ir.Value, rows: int, vectors: int,
                 load: Callable[[int, int], ir.Value]) -> list[list[ir.Value]]:
    """From a micro-kernel's entry block (b's): the rows × vectors phis init.r.v of a new
    block "start", each zero or, where `accumulate`, load(r, v) (C's block, read in a
    block "load_c"); b is left at the end of "start"."""
    entry = b.block
    load_block = b.function.append_basic_block("load_c")
    start = b.function.append_basic_block("start")
    b.cbranch(accumulate, load_block, start)
    b.position_at_end(load_block)
    loaded = [[load(r, v) for v in range(vectors)] for r in range(rows)]
    b.branch(start)
    b.position_at_end(start)
    sums = []
    for r in range(rows):
        line = []
        for v in range(vectors):
            phi = b.phi(loaded[r][v].type, name=f"init.{r}.{v}")
            phi.add_incoming(ir.Constant(loaded[r][v].type, None), entry)
            phi.add_incoming(loaded[r][v], load_block)
            line.append(phi)
        sums.append(line)
    return sums


def store_present_rows(b: ir.IRBuilder, sums: list[list[ir.Value]], c: ir.Value,
                       ldc: ir.Value, present: ir.Value) -> None:
    """sums[r][v] into C[r, v·lanes + (0..lanes)] (row stride ldc) for r < present."""
    for r, line in enumerate(sums):
        with b.if_then(b.icmp_signed("<", i64(r), present)):
            for v, value in enumerate(line):
                b.store(value, b.gep(c, [b.add(b.mul(i64(r), ldc), i64(v * value.type.count))],
                                     source_etype=value.type.element), align=4)


def splat(b: ir.IRBuilder, value: ir.Value, vector: ir.VectorType) -> ir.Value:
    one = b.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(vector, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, vector.count), [0] * vector.count))


def _vector_load(module: ir.Module, b: ir.IRBuilder, pointer: ir.Value,
                 vector: ir.VectorType, align: int, mask: ir.Value | None) -> ir.Value:
    if mask is None:
        return b.load(pointer, typ=vector, align=align)
    load = masked_intrinsic(module, "load", vector)
    return b.call(load, [pointer, ir.Constant(I32, align), mask, ir.Constant(vector, None)])


def _vector_name(vector: ir.VectorType) -> str:
    element = {"float": "f32", "double": "f64"}[str(vector.element)]
    return f"v{vector.count}{element}"


def masked_intrinsic(module: ir.Module, name: str, vector: ir.VectorType) -> ir.Function:
    mask = ir.VectorType(ir.IntType(1), vector.count)
    if name == "load":
        signature = ir.FunctionType(vector, [PTR, I32, mask, vector])
    else:
        signature = ir.FunctionType(VOID, [vector, PTR, I32, mask])
    return declare(module, f"llvm.masked.{name}.{_vector_name(vector)}.p0", signature)

