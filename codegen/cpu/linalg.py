"""CPU kernels of `cholesky` and `triangular-solve`: whole kernels, one matrix at a time.

The semantics are `tfxla_lite/hlo/linalg.py`'s, and so is the order of every sum, so the
kernels and the references agree to rounding. Both work in the output buffer: cholesky
copies the triangle it reads (zeros in the other) and factors it in place, column by
column; triangular-solve copies `b` and substitutes in place, one row (left side) or
column (right side) of unknowns after another. An element depends on everything solved
before it, so neither is an element generator: `compiler.py` hands every entry cholesky
and triangular-solve to `emit_linalg_kernel`, whose range function takes matrices
[begin, end) of the batch, split across threads (`sort.row_kernel`), each matrix whole on
one thread. Inside a matrix the loops are scalar (O(n³)): small-matrix kernels, not a
LAPACK.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import (
    I1,
    ConstantPool,
    Index,
    KernelContext,
    i64,
    value_type,
)
from tfxla_lite.codegen.cpu.sort import row_kernel
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.linalg import transpose_kind


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
                          ctx, inst, outputs[0], begin, end))


def _accumulate(ctx: KernelContext, start: ir.Value, count: ir.Value,
                term: Callable[[ir.Value], ir.Value], name: str) -> ir.Value:
    """`start - sum(term(k) for k in range(count))`, subtracting in order of k."""
    b = ctx.builder
    slot = ctx.alloca(start.type, name=name)
    b.store(start, slot)
    with ctx.loop(count, name=name) as k:
        b.store(b.fsub(b.load(slot), term(k)), slot)
    return b.load(slot)


def _cholesky(ctx: KernelContext, inst: Instruction, output: ir.Value, begin: ir.Value,
              end: ir.Value) -> None:
    b = ctx.builder
    shape = inst.shape
    operand = inst.operand(0)
    n = shape.dims[-1]
    lower = bool(inst.attributes.get("lower", False))
    typ = value_type(shape.element_type)
    zero = ir.Constant(typ, 0.0)

    with ctx.loop(end, name="matrix", start=begin) as matrix:
        base = b.mul(matrix, i64(n * n))

        def at(i: ir.Value, j: ir.Value) -> Index:
            """Element (i, j) of L: a's (i, j) when lower, its (j, i) when upper."""
            row, column = (i, j) if lower else (j, i)
            return Index(shape.dims, linear=b.add(base, b.add(b.mul(row, i64(n)), column)))

        def get(i: ir.Value, j: ir.Value) -> ir.Value:
            return ctx.load(output, shape, at(i, j))

        with ctx.loop(n, name="copy.i") as i, ctx.loop(n, name="copy.j") as j:
            inside = b.icmp_signed("<=", j, i)
            value = ctx.value(operand, at(i, j))
            ctx.store(b.select(inside, value, zero), output, shape, at(i, j))
        failed = ctx.alloca(I1, name="failed")
        b.store(ir.Constant(I1, 0), failed)
        with ctx.loop(n, name="column") as j:
            square = _accumulate(ctx, get(j, j), j, lambda k: b.fmul(get(j, k), get(j, k)),
                                 "pivot")
            pivot = ctx.call_intrinsic("sqrt", [square])
            b.store(b.or_(b.load(failed), b.fcmp_unordered("uno", pivot, pivot)), failed)
            ctx.store(pivot, output, shape, at(j, j))
            with ctx.loop(i64(n), name="below", start=b.add(j, i64(1))) as i:
                rest = _accumulate(ctx, get(i, j), j, lambda k: b.fmul(get(i, k), get(j, k)),
                                   "dot")
                ctx.store(b.fdiv(rest, pivot), output, shape, at(i, j))
        # A pivot that is NaN (not positive definite) makes the whole matrix NaN, as XLA.
        with b.if_then(b.load(failed), likely=False):
            nan = ir.Constant(typ, float("nan"))
            with ctx.loop(n * n, name="nan") as k:
                ctx.store(nan, output, shape, Index(shape.dims, linear=b.add(base, k)))


def _triangular_solve(ctx: KernelContext, inst: Instruction, output: ir.Value,
                      begin: ir.Value, end: ir.Value) -> None:
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

    with ctx.loop(end, name="matrix", start=begin) as matrix:
        a_base = b.mul(matrix, i64(k * k))
        x_base = b.mul(matrix, i64(m * n))

        def t(row: ir.Value, column: ir.Value) -> ir.Value:
            """op(a)[row, column], read from a's triangle."""
            r, c = (column, row) if transposed else (row, column)
            linear = b.add(a_base, b.add(b.mul(r, i64(k)), c))
            return ctx.value(a, Index(a.shape.dims, linear=linear))

        def x_at(unknown: ir.Value, other: ir.Value) -> Index:
            row, column = (unknown, other) if left else (other, unknown)
            return Index(shape.dims, linear=b.add(x_base, b.add(b.mul(row, i64(n)), column)))

        with ctx.loop(m * n, name="copy") as e:
            index = Index(shape.dims, linear=b.add(x_base, e))
            ctx.store(ctx.value(rhs, index), output, shape, index)

        def nth(p: ir.Value) -> ir.Value:
            return p if ascending else b.sub(i64(k - 1), p)

        with ctx.loop(k, name="unknown") as p:
            i = nth(p)
            with ctx.loop(others, name="other") as o:
                def term(q: ir.Value) -> ir.Value:
                    j = nth(q)  # solved before i
                    coefficient = t(i, j) if left else t(j, i)
                    return b.fmul(coefficient, ctx.load(output, shape, x_at(j, o)))

                rest = _accumulate(ctx, ctx.load(output, shape, x_at(i, o)), p, term, "rest")
                if not unit:
                    rest = b.fdiv(rest, t(i, i))
                ctx.store(rest, output, shape, x_at(i, o))

