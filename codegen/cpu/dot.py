"""CPU code for `dot`: a GEMM call where the layout allows, emitted loops otherwise.

An f32/f64 dot whose operands sit in buffers is a batch of row-major GEMMs: the
lhs's free dimensions flatten to M and its contracting ones to K, the rhs's to K
and N, and each flattened group must have one stride in memory (then the
transpose flag and leading dimension express it, as `cpu/dot_op_emitter.cc`
does). Batch dimensions, with any strides, become an outer loop of GEMM calls.
Anything else (integer dots, layouts GEMM cannot express, dots fed by fused
producers) uses the element generator: a loop over the contracting dimensions.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from llvmlite import ir

from tfxla_lite.codegen.cpu import engine
from tfxla_lite.codegen.cpu.elementwise import binary_op, convert
from tfxla_lite.codegen.cpu.emitter import (
    I32,
    PTR,
    VOID,
    Index,
    KernelContext,
    constant,
    i64,
    register,
    row_major_strides,
    storage_type,
    value_type,
)
from tfxla_lite.hlo.ir import Instruction

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


@dataclass(frozen=True)
class DotDims:
    """A dot's dimension numbers, with each operand's free dimensions spelled out."""

    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contracting: tuple[int, ...]
    rhs_contracting: tuple[int, ...]
    lhs_free: tuple[int, ...]
    rhs_free: tuple[int, ...]

    @staticmethod
    def of(inst: Instruction) -> DotDims:
        attrs = inst.attributes
        lb = tuple(attrs.get("lhs_batch_dims", ()))
        rb = tuple(attrs.get("rhs_batch_dims", ()))
        lc = tuple(attrs.get("lhs_contracting_dims", ()))
        rc = tuple(attrs.get("rhs_contracting_dims", ()))
        lhs_rank, rhs_rank = inst.operand(0).shape.rank, inst.operand(1).shape.rank
        lf = tuple(d for d in range(lhs_rank) if d not in lb and d not in lc)
        rf = tuple(d for d in range(rhs_rank) if d not in rb and d not in rc)
        return DotDims(lb, rb, lc, rc, lf, rf)


def _accumulator_type(element_type: str) -> str:
    return "f32" if element_type == "f16" else element_type


@register("dot")
def emit_dot(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    lhs, rhs = inst.operands
    element_type = inst.shape.element_type
    if element_type == "pred":
        raise NotImplementedError(f"CPU backend: dot of pred (%{inst.name})")
    dims = DotDims.of(inst)
    b = ctx.builder
    multi = index.get_multi(b)
    n_batch, n_lhs_free = len(dims.lhs_batch), len(dims.lhs_free)
    batch, lhs_free, rhs_free = (multi[:n_batch], multi[n_batch:n_batch + n_lhs_free],
                                 multi[n_batch + n_lhs_free:])
    accumulate = _accumulator_type(element_type)
    accumulator = ctx.alloca(value_type(accumulate), name="dot.accumulator")
    b.store(constant(accumulate, 0), accumulator)
    contracting = tuple(lhs.shape.dims[d] for d in dims.lhs_contracting)
    with ctx.loop_nest(contracting, name="k") as k:
        lhs_multi = _operand_multi(lhs.shape.rank, [(dims.lhs_batch, batch),
                                                    (dims.lhs_contracting, k),
                                                    (dims.lhs_free, lhs_free)])
        rhs_multi = _operand_multi(rhs.shape.rank, [(dims.rhs_batch, batch),
                                                    (dims.rhs_contracting, k),
                                                    (dims.rhs_free, rhs_free)])
        x = convert(ctx, ctx.value(lhs, Index(lhs.shape.dims, lhs_multi)), element_type,
                    accumulate)
        y = convert(ctx, ctx.value(rhs, Index(rhs.shape.dims, rhs_multi)), element_type,
                    accumulate)
        product = binary_op(ctx, "multiply", accumulate, x, y, inst)
        b.store(binary_op(ctx, "add", accumulate, b.load(accumulator), product, inst),
                accumulator)
    return convert(ctx, b.load(accumulator), accumulate, element_type)


def _operand_multi(rank: int, parts: list[tuple[tuple[int, ...], list[ir.Value]]]
                   ) -> list[ir.Value]:
    multi: list[ir.Value] = [i64(0)] * rank
    for dimensions, values in parts:
        for d, value in zip(dimensions, values):
            multi[d] = value
    return multi


# -- GEMM ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmPlan:
    """One GEMM per batch element: C[M,N] = op(A)[M,K] @ op(B)[K,N], row-major."""

    m: int
    n: int
    k: int
    transpose_a: bool
    lda: int
    transpose_b: bool
    ldb: int
    batch_sizes: tuple[int, ...]
    lhs_batch_strides: tuple[int, ...]
    rhs_batch_strides: tuple[int, ...]


def _group_stride(dims: tuple[int, ...], strides: list[int], group: tuple[int, ...]
                  ) -> int | None | str:
    """The element stride of `group` flattened in order; 'any' when it has one element."""
    nontrivial = [d for d in group if dims[d] != 1]
    if not nontrivial:
        return "any"
    for outer, inner in itertools.pairwise(nontrivial):
        if strides[outer] != strides[inner] * dims[inner]:
            return None
    return strides[nontrivial[-1]]


def _matrix(dims: tuple[int, ...], rows: tuple[int, ...], cols: tuple[int, ...]
            ) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a row-major rows×cols view, if one exists."""
    strides = row_major_strides(dims)
    n_rows = math.prod(dims[d] for d in rows)
    n_cols = math.prod(dims[d] for d in cols)
    row_stride = _group_stride(dims, strides, rows)
    col_stride = _group_stride(dims, strides, cols)
    if row_stride is None or col_stride is None:
        return None
    if col_stride in ("any", 1):
        lead = row_stride if isinstance(row_stride, int) else max(1, n_cols)
        if lead >= max(1, n_cols):
            return False, lead
    if row_stride in ("any", 1):
        lead = col_stride if isinstance(col_stride, int) else max(1, n_rows)
        if lead >= max(1, n_rows):
            return True, lead
    return None


def plan_gemm(inst: Instruction) -> GemmPlan | None:
    """How to run `inst` as GEMM calls, or None when GEMM cannot express it."""
    lhs, rhs = inst.operands
    if engine.gemm(inst.shape.element_type) is None:
        return None
    if lhs.shape.element_type != inst.shape.element_type:
        return None
    dims = DotDims.of(inst)
    a = _matrix(lhs.shape.dims, dims.lhs_free, dims.lhs_contracting)
    b = _matrix(rhs.shape.dims, dims.rhs_contracting, dims.rhs_free)
    if a is None or b is None:
        return None
    lhs_strides = row_major_strides(lhs.shape.dims)
    rhs_strides = row_major_strides(rhs.shape.dims)
    return GemmPlan(
        m=math.prod(lhs.shape.dims[d] for d in dims.lhs_free),
        n=math.prod(rhs.shape.dims[d] for d in dims.rhs_free),
        k=math.prod(lhs.shape.dims[d] for d in dims.lhs_contracting),
        transpose_a=a[0], lda=a[1], transpose_b=b[0], ldb=b[1],
        batch_sizes=tuple(lhs.shape.dims[d] for d in dims.lhs_batch),
        lhs_batch_strides=tuple(lhs_strides[d] for d in dims.lhs_batch),
        rhs_batch_strides=tuple(rhs_strides[d] for d in dims.rhs_batch),
    )


def emit_gemm_kernel(ctx: KernelContext, inst: Instruction, plan: GemmPlan, output: ir.Value,
                     lhs_pointer: ir.Value, rhs_pointer: ir.Value) -> None:
    """Call GEMM once per batch element, or fill zeros when K is 0."""
    shape = inst.shape
    element_type = shape.element_type
    if shape.num_elements == 0:
        return
    if plan.k == 0:  # an empty sum: BLAS implementations disagree on touching C then
        with ctx.loop(shape.num_elements, name="zero") as linear:
            ctx.store(constant(element_type, 0), output, shape, Index(shape.dims, linear=linear))
        return
    routine = engine.gemm(element_type)
    assert routine is not None
    blas_int = ir.IntType(routine.int_bits)
    scalar = value_type(element_type)
    function = ctx.module.globals.get(routine.symbol)
    if function is None:
        signature = ir.FunctionType(VOID, [I32, I32, I32, blas_int, blas_int, blas_int, scalar,
                                           PTR, blas_int, PTR, blas_int, scalar, PTR, blas_int])
        function = ir.Function(ctx.module, signature, name=routine.symbol)
    b = ctx.builder
    etype = storage_type(element_type)

    def integer(value: int) -> ir.Constant:
        return ir.Constant(blas_int, value)

    with ctx.loop_nest(plan.batch_sizes, name="batch") as batch:
        lhs_offset, rhs_offset, out_offset = i64(0), i64(0), i64(0)
        out_strides = row_major_strides(plan.batch_sizes)
        for value, ls, rs, os_ in zip(batch, plan.lhs_batch_strides, plan.rhs_batch_strides,
                                      out_strides):
            lhs_offset = b.add(lhs_offset, b.mul(value, i64(ls)))
            rhs_offset = b.add(rhs_offset, b.mul(value, i64(rs)))
            out_offset = b.add(out_offset, b.mul(value, i64(os_ * plan.m * plan.n)))
        b.call(function, [
            ir.Constant(I32, _ROW_MAJOR),
            ir.Constant(I32, _TRANS if plan.transpose_a else _NO_TRANS),
            ir.Constant(I32, _TRANS if plan.transpose_b else _NO_TRANS),
            integer(plan.m), integer(plan.n), integer(plan.k),
            ir.Constant(scalar, 1.0),
            b.gep(lhs_pointer, [lhs_offset], source_etype=etype), integer(plan.lda),
            b.gep(rhs_pointer, [rhs_offset], source_etype=etype), integer(plan.ldb),
            ir.Constant(scalar, 0.0),
            b.gep(output, [out_offset], source_etype=etype), integer(max(1, plan.n)),
        ])
