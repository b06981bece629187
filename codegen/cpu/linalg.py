"""CPU kernels of `cholesky` and `triangular-solve`: whole kernels, one matrix at a time.

The semantics are `tfxla_lite/hlo/linalg.py`'s; both work in the output buffer, with
contiguous row updates LLVM vectorizes, each element's terms subtracted in the
reference's order. From `BLOCKED_FROM` rows (cholesky) or `SOLVE_BLOCKED_FROM` unknowns
and `SOLVE_BLOCKED_COLUMNS` right-hand sides (left-side solve) they are blocked, one
library GEMM per `BLOCK` pivot rows taking their terms from the rest. Matrices of a
batch split across threads, each whole on one; `clustering/rules_linalg.py` leaves to
TF the shapes where TF's kernels are faster. docs/architecture.md, section 4.
"""
from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tfxla_lite.codegen.cpu import engine
from tfxla_lite.codegen.cpu.dot import library_gemm
from tfxla_lite.codegen.cpu.emitter import (
    I1,
    I64,
    PTR,
    VOID,
    ConstantPool,
    Index,
    KernelContext,
    declare,
    i64,
    minimum,
    register_own_kernel,
    storage_type,
    value_type,
)
from tfxla_lite.codegen.cpu.sort import STACK_ELEMENTS, row_kernel
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.linalg import transpose_kind


@register_own_kernel("cholesky", "triangular-solve")
def emit_linalg_kernel(module: ir.Module, pool: ConstantPool, inst: Instruction,
                       threads: int) -> ir.Function:
    """The launcher `void kernel(out, a[, b])` of the entry cholesky or triangular-solve
    `inst`: matrices of the batch split across up to `threads` threads."""
    dims = inst.shape.dims
    matrices = 1
    for size in dims[:-2]:
        matrices *= size
    if inst.opcode == "cholesky":
        n = dims[-1]
        work = matrices * (n**3 // 3 + n)  # multiply-adds and square roots
        return row_kernel(module, pool, inst, threads, matrices if n else 0, work,
                          lambda ctx, outputs, inputs, begin, end: _cholesky(
                              ctx, inst, outputs[0], begin, end))
    k = inst.operand(0).shape.dims[-1]
    work = inst.shape.num_elements * max(k, 1)
    return row_kernel(module, pool, inst, threads, matrices if inst.shape.num_elements else 0,
                      work, lambda ctx, outputs, inputs, begin, end: _triangular_solve(
                          ctx, inst, outputs[0], inputs[0], begin, end))


# Cholesky of order BLOCKED_FROM and up is blocked: BLOCK pivot rows at a time, the rest
# of the matrix updated by one library GEMM per block (engine.gemm, as dot.py's).
BLOCK = 32
BLOCKED_FROM = 64


# A left-side triangular-solve of SOLVE_BLOCKED_FROM unknowns and SOLVE_BLOCKED_COLUMNS
# right-hand sides or more is blocked alike: BLOCK unknowns at a time, then one GEMM
# takes them from the later ones (its product at most SOLVE_PRODUCT_BYTES).
SOLVE_BLOCKED_FROM = 128
SOLVE_BLOCKED_COLUMNS = 32
SOLVE_PRODUCT_BYTES = 1 << 26


def blocked(element_type: str, n: int) -> bool:
    """Whether the cholesky of `n`×`n` matrices of `element_type` is blocked."""
    return n >= BLOCKED_FROM and engine.gemm(element_type) is not None


def solve_blocked(element_type: str, unknowns: int, columns: int) -> bool:
    """Whether a left-side triangular-solve of `unknowns` rows of `columns` right-hand
    sides is blocked."""
    size = (unknowns - BLOCK) * columns * (8 if element_type == "f64" else 4)
    return (unknowns >= SOLVE_BLOCKED_FROM and columns >= SOLVE_BLOCKED_COLUMNS
            and size <= SOLVE_PRODUCT_BYTES and engine.gemm(element_type) is not None)


def _scratch_row(ctx: KernelContext, typ: ir.Type, length: int) -> ir.Value | None:
    """A stack row for the row every update of a step reads (the pivot's row, the row of
    unknowns): apart from the output, so LLVM vectorizes the updates without checking
    for overlap. None when too long for the stack (the updates then read the output)."""
    return ctx.alloca(typ, name="row", count=length) if length <= STACK_ELEMENTS else None


def _cholesky(ctx: KernelContext, inst: Instruction, output: ir.Value, begin: ir.Value,
              end: ir.Value) -> None:
    b = ctx.builder
    shape = inst.shape
    operand = inst.operand(0)
    n = shape.dims[-1]
    lower = bool(inst.attributes.get("lower", False))
    typ = value_type(shape.element_type)
    zero = ir.Constant(typ, 0.0)

    product = None  # the blocks' GEMM results, (n - BLOCK)² elements
    if blocked(shape.element_type, n):
        size = (n - BLOCK) ** 2 * (8 if shape.element_type == "f64" else 4)
        product = b.call(declare(ctx.module, "malloc", ir.FunctionType(PTR, [I64])), [i64(size)],
                         name="cholesky.product")
        with b.if_then(b.icmp_unsigned("==", product, ir.Constant(PTR, None)), likely=False):
            b.call(declare(ctx.module, "llvm.trap", ir.FunctionType(VOID, [])), [])

    with ctx.loop(end, name="matrix", start=begin) as matrix:
        base = b.mul(matrix, i64(n * n))

        def at(row: ir.Value, column: ir.Value) -> Index:
            return Index(shape.dims, linear=b.add(base, b.add(b.mul(row, i64(n)), column)))

        def get(row: ir.Value, column: ir.Value) -> ir.Value:
            return ctx.load(output, shape, at(row, column))

        def put(value: ir.Value, row: ir.Value, column: ir.Value) -> None:
            ctx.store(value, output, shape, at(row, column))

        # U = Lᵀ is factored in the upper triangle, where its rows are contiguous: U[r, c]
        # (c >= r) starts as a's (c, r) when lower, its (r, c) when upper.
        with ctx.loop(n, name="copy.r") as r, ctx.loop(n, name="copy.c") as c:
            value = ctx.value(operand, at(c, r) if lower else at(r, c))
            put(b.select(b.icmp_signed(">=", c, r), value, zero), r, c)
        failed = ctx.alloca(I1, name="failed")
        b.store(ir.Constant(I1, 0), failed)
        scratch = _scratch_row(ctx, typ, n)

        def steps(first: ir.Value, last: ir.Value, rows_end: ir.Value) -> None:
            """Pivot rows [first, last), each taken from the rows before `rows_end`."""
            with ctx.loop(last, name="step", start=first) as j:
                step(j, rows_end)

        def step(j: ir.Value, rows_end: ir.Value) -> None:
            pivot = ctx.call_intrinsic("sqrt", [get(j, j)])
            b.store(b.or_(b.load(failed), b.fcmp_unordered("uno", pivot, pivot)), failed)
            put(pivot, j, j)
            following = b.add(j, i64(1))

            def pivot_row(c: ir.Value) -> ir.Value:
                if scratch is None:
                    return get(j, c)
                return b.load(b.gep(scratch, [c], inbounds=True, source_etype=typ), typ=typ)

            with ctx.loop(n, name="scale", start=following) as c:
                scaled = b.fdiv(get(j, c), pivot)
                put(scaled, j, c)
                if scratch is not None:
                    b.store(scaled, b.gep(scratch, [c], inbounds=True, source_etype=typ))
            # Right-looking: row j's terms leave every later row, one contiguous row
            # update each; every element still subtracts its terms in order of j.
            with ctx.loop(rows_end, name="row", start=following) as i:
                factor = pivot_row(i)
                with ctx.loop(n, name="update", start=i) as c:
                    put(b.fsub(get(i, c), b.fmul(factor, pivot_row(c))), i, c)

        if product is None:
            steps(i64(0), i64(n), i64(n))
        else:
            with ctx.loop((n + BLOCK - 1) // BLOCK, name="block") as block:
                first = b.mul(block, i64(BLOCK))
                last = minimum(b, b.add(first, i64(BLOCK)), i64(n))
                steps(first, last, last)
                _take_block(ctx, inst, output, base, product, first, last)
        if lower:  # L = Uᵀ to the lower triangle, zeros above
            with ctx.loop(n, name="flip.r") as r, \
                    ctx.loop(n, name="flip.c", start=b.add(r, i64(1))) as c:
                put(get(r, c), c, r)
                put(zero, r, c)
        # A pivot that is NaN (not positive definite) makes the whole matrix NaN, as XLA.
        with b.if_then(b.load(failed), likely=False):
            nan = ir.Constant(typ, float("nan"))
            with ctx.loop(n * n, name="nan") as k:
                ctx.store(nan, output, shape, Index(shape.dims, linear=b.add(base, k)))
    if product is not None:
        b.call(declare(ctx.module, "free", ir.FunctionType(VOID, [PTR])), [product])


def _take_block(ctx: KernelContext, inst: Instruction, output: ir.Value, base: ir.Value,
                product: ir.Value, first: ir.Value, last: ir.Value) -> None:
    """The rest of U's upper triangle less the finished block rows' terms: with P their
    rows [first, last) from column `last` on, W[last:, last:] -= Pᵀ·P (one GEMM into
    `product`, then the upper triangle subtracted)."""
    b = ctx.builder
    shape = inst.shape
    n = shape.dims[-1]
    etype = storage_type(shape.element_type)
    rest = b.sub(i64(n), last)
    with b.if_then(b.icmp_signed(">", rest, i64(0))):
        panel = b.gep(output, [b.add(base, b.add(b.mul(first, i64(n)), last))], inbounds=True,
                      source_etype=etype)
        library_gemm(ctx, shape.element_type, True, False, rest, rest, b.sub(last, first),
                     panel, n, panel, n, product, rest)
        with ctx.loop(rest, name="take.r") as r, ctx.loop(rest, name="take.c", start=r) as c:
            row = b.add(last, r)
            target = Index(shape.dims, linear=b.add(base, b.add(b.mul(row, i64(n)),
                                                                b.add(last, c))))
            term = b.load(b.gep(product, [b.add(b.mul(r, rest), c)], inbounds=True,
                                source_etype=etype), typ=etype)
            ctx.store(b.fsub(ctx.load(output, shape, target), term), output, shape, target)


def _triangular_solve(ctx: KernelContext, inst: Instruction, output: ir.Value,
                      a_buffer: ir.Value, begin: ir.Value, end: ir.Value) -> None:
    b = ctx.builder
    a, rhs = inst.operands
    shape = inst.shape
    attributes = inst.attributes
    left = bool(attributes.get("left_side", False))
    lower = bool(attributes.get("lower", False))
    unit = bool(attributes.get("unit_diagonal", False))
    transposed = transpose_kind(attributes) != "NO_TRANSPOSE"
    m, n = shape.dims[-2:]
    k = m if left else n  # unknowns: rows (left side) or columns
    others = n if left else m
    # op(a) is lower triangular when a's triangle is the lower one, untransposed; on the
    # right side the unknowns depend the other way, so the order of solving flips.
    t_lower = lower != transposed
    ascending = t_lower if left else not t_lower
    product = None  # the blocks' GEMM results, (k - BLOCK) × n elements
    if left and solve_blocked(shape.element_type, k, others):
        size = (k - BLOCK) * others * (8 if shape.element_type == "f64" else 4)
        product = b.call(declare(ctx.module, "malloc", ir.FunctionType(PTR, [I64])), [i64(size)],
                         name="solve.product")
        with b.if_then(b.icmp_unsigned("==", product, ir.Constant(PTR, None)), likely=False):
            b.call(declare(ctx.module, "llvm.trap", ir.FunctionType(VOID, [])), [])

    with ctx.loop(end, name="matrix", start=begin) as matrix:
        a_base = b.mul(matrix, i64(k * k))
        x_base = b.mul(matrix, i64(m * n))

        def t(row: ir.Value, column: ir.Value) -> ir.Value:
            """op(a)[row, column], read from a's triangle."""
            r, c = (column, row) if transposed else (row, column)
            linear = b.add(a_base, b.add(b.mul(r, i64(k)), c))
            return ctx.value(a, Index(a.shape.dims, linear=linear))

        def x_at(row: ir.Value, column: ir.Value) -> Index:
            return Index(shape.dims, linear=b.add(x_base, b.add(b.mul(row, i64(n)), column)))

        def get(row: ir.Value, column: ir.Value) -> ir.Value:
            return ctx.load(output, shape, x_at(row, column))

        def put(value: ir.Value, row: ir.Value, column: ir.Value) -> None:
            ctx.store(value, output, shape, x_at(row, column))

        with ctx.loop(m * n, name="copy") as e:
            index = Index(shape.dims, linear=b.add(x_base, e))
            ctx.store(ctx.value(rhs, index), output, shape, index)

        def nth(p: ir.Value) -> ir.Value:
            return p if ascending else b.sub(i64(k - 1), p)

        if left:
            # Row i of x takes each solved row's multiple, in the order they were solved:
            # contiguous row updates over the right-hand sides, summed in a stack row.
            typ = value_type(shape.element_type)
            scratch = _scratch_row(ctx, typ, others)

            def row(o: ir.Value) -> ir.Value:
                return b.gep(scratch, [o], inbounds=True, source_etype=typ)

            def substitute(first: ir.Value, last: ir.Value) -> None:
                """Unknowns [first, last) in solve order, from the ones since `first`."""
                with ctx.loop(last, name="unknown", start=first) as p:
                    i = nth(p)
                    if scratch is not None:
                        with ctx.loop(others, name="load") as o:
                            b.store(get(i, o), row(o))
                    with ctx.loop(p, name="solved", start=first) as q:
                        j = nth(q)
                        coefficient = t(i, j)
                        with ctx.loop(others, name="update") as o:
                            if scratch is None:
                                put(b.fsub(get(i, o), b.fmul(coefficient, get(j, o))), i, o)
                            else:
                                term = b.fmul(coefficient, get(j, o))
                                b.store(b.fsub(b.load(row(o), typ=typ), term), row(o))
                    diagonal = None if unit else t(i, i)
                    if scratch is not None or diagonal is not None:
                        with ctx.loop(others, name="finish") as o:
                            value = get(i, o) if scratch is None else b.load(row(o), typ=typ)
                            put(value if diagonal is None else b.fdiv(value, diagonal), i, o)

            if product is None:
                substitute(i64(0), i64(k))
            else:
                with ctx.loop((k + BLOCK - 1) // BLOCK, name="block") as block:
                    first = b.mul(block, i64(BLOCK))
                    last = minimum(b, b.add(first, i64(BLOCK)), i64(k))
                    substitute(first, last)
                    _take_unknowns(ctx, inst, output, a_buffer, product, a_base, x_base,
                                   first, last, ascending, transposed)
        else:
            _right_side(ctx, inst, t, get, put, nth, ascending)
    if product is not None:
        b.call(declare(ctx.module, "free", ir.FunctionType(VOID, [PTR])), [product])


def _right_side(ctx: KernelContext, inst: Instruction, t: Callable[..., ir.Value],
                get: Callable[..., ir.Value], put: Callable[..., None],
                nth: Callable[[ir.Value], ir.Value], ascending: bool) -> None:
    """Right side: each row of x alone; an unknown, once solved, leaves the later ones
    (a contiguous stretch of the row), in the order they were solved."""
    b = ctx.builder
    others, k = inst.shape.dims[-2:]
    unit = bool(inst.attributes.get("unit_diagonal", False))
    with ctx.loop(others, name="row") as o:
        with ctx.loop(k, name="unknown") as p:
            i = nth(p)
            value = get(o, i)
            if not unit:
                value = b.fdiv(value, t(i, i))
                put(value, o, i)
            start, stop = (b.add(i, i64(1)), i64(k)) if ascending else (i64(0), i)
            with ctx.loop(stop, name="update", start=start) as c:
                put(b.fsub(get(o, c), b.fmul(t(i, c), value)), o, c)


def _take_unknowns(ctx: KernelContext, inst: Instruction, output: ir.Value, a: ir.Value,
                   product: ir.Value, a_base: ir.Value, x_base: ir.Value, first: ir.Value,
                   last: ir.Value, ascending: bool, transposed: bool) -> None:
    """The later unknowns (left side) less the terms of the solved ones [first, last) in
    solve order: x[later] -= op(a)[later, solved]·x[solved], one GEMM into `product`."""
    b = ctx.builder
    shape = inst.shape
    k, n = shape.dims[-2:]
    etype = storage_type(shape.element_type)
    rest = b.sub(i64(k), last)
    # Rows of the solved block and of the later unknowns, in index order.
    solved = first if ascending else b.sub(i64(k), last)
    later = last if ascending else i64(0)
    with b.if_then(b.icmp_signed(">", rest, i64(0))):
        if transposed:  # op(a)[r, c] is a[c, r]
            corner = b.add(b.mul(solved, i64(k)), later)
        else:
            corner = b.add(b.mul(later, i64(k)), solved)
        matrix = b.gep(a, [b.add(a_base, corner)], inbounds=True, source_etype=etype)
        rows = b.gep(output, [b.add(x_base, b.mul(solved, i64(n)))], inbounds=True,
                     source_etype=etype)
        library_gemm(ctx, shape.element_type, transposed, False, rest, n, b.sub(last, first),
                     matrix, k, rows, n, product, n)
        with ctx.loop(b.mul(rest, i64(n)), name="take") as e:
            target = Index(shape.dims, linear=b.add(b.add(x_base, b.mul(later, i64(n))), e))
            term = b.load(b.gep(product, [e], inbounds=True, source_etype=etype), typ=etype)
            ctx.store(b.fsub(ctx.load(output, shape, target), term), output, shape, target)
