"""CPU code for `reduce`: an element generator and the kernel of a reduction root.

The element generator (used when a reduce is computed at a consumer's index) loops
over the reduced dimensions with an accumulator, applying the `to_apply`
computation inline; it serves row reductions, whose reduced dimensions are
innermost and so contiguous. When a reduce is a kernel's root and some kept
dimension lies inside a reduced one (a column reduction), the kernel instead walks
the input in row-major order and accumulates into the output buffer, so both
streams stay contiguous and the innermost loop vectorizes without reassociating.
Column reductions fold each output element's inputs in row-major order from the init
value; float rows of at least 2*lanes elements fold in interleaved partial results
(see `_reduce_row`), as XLA's vectorized reductions do.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tfxla_lite.codegen.cpu import variadic_reduce
from tfxla_lite.codegen.cpu.emitter import (
    Index,
    KernelContext,
    Restriction,
    i64,
    register,
    value_type,
)
from tfxla_lite.hlo.ir import Instruction


def _check_reduce(inst: Instruction) -> None:
    if len(inst.operands) != 2 or inst.shape.is_tuple:
        raise NotImplementedError(
            f"CPU backend: variadic reduce (%{inst.name}, {len(inst.operands) // 2} inputs)")


def _full_index(inst: Instruction, kept: list[ir.Value], reduced: list[ir.Value]) -> Index:
    operand = inst.operand(0)
    dims = set(inst.dimensions)
    kept_iter, reduced_iter = iter(kept), iter(reduced)
    multi = [next(reduced_iter) if d in dims else next(kept_iter)
             for d in range(operand.shape.rank)]
    return Index(operand.shape.dims, multi)


# Partial accumulators per float reduction row (vector-register wide for f32 on AVX-512).
_LANES = {"f16": 16, "f32": 16, "f64": 8}
# Reducers whose result does not depend on the order of folding (NaN-propagating max
# and min): LLVM's loop vectorizer reorders them itself, with contiguous vector
# loads; interleaved lanes would make it vectorize across lanes instead, with gathers.
_ORDER_FREE = frozenset({"maximum", "minimum"})


def _lanes(inst: Instruction) -> int:
    """Interleaved accumulators for `inst`'s rows: 0 for one accumulator."""
    root = inst.called_computations[0].root
    if root is not None and root.opcode in _ORDER_FREE and all(
            o.opcode == "parameter" for o in root.operands):
        return 0
    return _LANES.get(inst.shape.element_type, 0)


@register("reduce")
def emit_reduce(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    if len(inst.operands) != 2 or inst.shape.is_tuple:
        return variadic_reduce.emit_variadic_reduce(ctx, inst, index)  # a struct of results
    operand, init = inst.operands
    b = ctx.builder
    kept = index.get_multi(b)
    reduced = sorted(set(inst.dimensions))
    reduced_dims = tuple(operand.shape.dims[d] for d in reduced)
    accumulator = ctx.alloca(value_type(inst.shape.element_type), name="accumulator")
    b.store(ctx.value(init, Index.scalar()), accumulator)
    lanes = _lanes(inst)
    innermost_reduced = bool(reduced) and reduced[-1] == operand.shape.rank - 1
    if lanes and innermost_reduced and reduced_dims[-1] >= 2 * lanes:
        # A float row: fold it in `lanes` interleaved partial sums, then combine them.
        with ctx.loop_nest(reduced_dims[:-1], name="reduce") as outer:
            def element_at(position: ir.Value, outer: list[ir.Value] = outer) -> ir.Value:
                return ctx.value(operand, _full_index(inst, kept, [*outer, position]))

            row = fold_row(ctx, inst, element_at, reduced_dims[-1], lanes)
            current = b.load(accumulator)
            b.store(ctx.apply_computation(inst.called_computations[0], [current, row]),
                    accumulator)
        return b.load(accumulator)
    with ctx.loop_nest(reduced_dims, name="reduce") as reduced_index:
        x = ctx.value(operand, _full_index(inst, kept, reduced_index))
        current = b.load(accumulator)
        b.store(ctx.apply_computation(inst.called_computations[0], [current, x]), accumulator)
    return b.load(accumulator)


def fold_row(ctx: KernelContext, inst: Instruction, element_at: Callable[[ir.Value], ir.Value],
             length: int, lanes: int) -> ir.Value:
    """The fold by `inst`'s reducer of `element_at(0 .. length-1)`, `length` >= 2*lanes.

    Lane l folds elements l, l+lanes, l+2*lanes, ... (starting from element l itself,
    so no identity value is needed); the lanes then combine pairwise and the tail
    (length % lanes elements) folds in last. XLA's reducers are associative by
    contract, and its CPU backend reorders float reductions the same way; the
    independent lanes let the SLP vectorizer use vector registers.
    """
    b = ctx.builder
    reducer = inst.called_computations[0]
    element = value_type(inst.shape.element_type)
    slots = [ctx.alloca(element, name=f"lane{n}") for n in range(lanes)]
    for n, slot in enumerate(slots):
        b.store(element_at(i64(n)), slot)
    chunks = length // lanes
    with ctx.loop(chunks, name="chunk", start=1) as chunk:
        base = b.mul(chunk, i64(lanes), flags=["nuw", "nsw"])
        values = [element_at(b.add(base, i64(n), flags=["nuw", "nsw"])) for n in range(lanes)]
        for slot, value in zip(slots, values):
            b.store(ctx.apply_computation(reducer, [b.load(slot), value]), slot)
    partial = [b.load(slot) for slot in slots]
    while len(partial) > 1:
        partial = [ctx.apply_computation(reducer, [partial[n], partial[n + 1]])
                   for n in range(0, len(partial), 2)]
    result = ctx.alloca(element, name="row")
    b.store(partial[0], result)
    with ctx.loop(length, name="tail", start=chunks * lanes) as position:
        b.store(ctx.apply_computation(reducer, [b.load(result), element_at(position)]), result)
    return b.load(result)


def fold_range(ctx: KernelContext, inst: Instruction, start: ir.Value, length: int) -> ir.Value:
    """The fold of elements start .. start+length-1 of reduce `inst`'s operand, taken in
    row-major order (a chunk of a full reduction), with no init value."""
    b = ctx.builder
    operand = inst.operand(0)
    dims = operand.shape.dims

    def element_at(position: ir.Value) -> ir.Value:
        linear = b.add(start, position, flags=["nuw", "nsw"])
        return ctx.value(operand, Index(dims, linear=linear))

    return fold_elements(ctx, inst, element_at, length)


def fold_elements(ctx: KernelContext, inst: Instruction,
                  element_at: Callable[[ir.Value], ir.Value], length: int) -> ir.Value:
    """The fold by reduce `inst`'s reducer of `element_at(0 .. length-1)`, length >= 1,
    with no init value: in interleaved lanes (`fold_row`) where they apply."""
    b = ctx.builder
    lanes = _lanes(inst)
    if lanes and length >= 2 * lanes:
        return fold_row(ctx, inst, element_at, length, lanes)
    accumulator = ctx.alloca(value_type(inst.shape.element_type), name="partial")
    b.store(element_at(i64(0)), accumulator)
    with ctx.loop(length, name="fold", start=1) as position:
        combined = ctx.apply_computation(inst.called_computations[0],
                                         [b.load(accumulator), element_at(position)])
        b.store(combined, accumulator)
    return b.load(accumulator)


def is_row_reduction(inst: Instruction) -> bool:
    """Whether every reduced dimension lies inside (after) every kept one."""
    reduced = set(inst.dimensions)
    kept = [d for d in range(inst.operand(0).shape.rank) if d not in reduced]
    return not kept or not reduced or max(kept) < min(reduced)


def column_partition_dimension(inst: Instruction) -> int | None:
    """The operand dimension a column reduction's kernel splits between threads: the
    first kept one longer than 1 (each output element then belongs to one part)."""
    reduced = set(inst.dimensions)
    for d, size in enumerate(inst.operand(0).shape.dims):
        if d not in reduced and size > 1:
            return d
    return None


def emit_reduction_kernel(ctx: KernelContext, root: Instruction, output: ir.Value,
                          restrict: Restriction | None = None) -> None:
    """Store `root` (a reduce) into `output`, walking its input in row-major order.

    `restrict` limits the work to part of one dimension: of the output for a row
    reduction, of the operand (`column_partition_dimension`) for a column reduction.
    """
    _check_reduce(root)
    shape = root.shape
    if is_row_reduction(root):
        with ctx.loop_nest(shape.dims, name="i", restrict=restrict) as multi:
            index = Index(shape.dims, multi)
            ctx.store(ctx.value(root, index), output, shape, index)
        return
    operand, init = root.operands
    reduced = set(root.dimensions)
    kept = [d for d in range(operand.shape.rank) if d not in reduced]
    output_restrict = None
    if restrict is not None:
        output_restrict = (kept.index(restrict[0]), restrict[1], restrict[2])
    with ctx.loop_nest(shape.dims, name="init", restrict=output_restrict) as multi:
        ctx.store(ctx.value(init, Index.scalar()), output, shape, Index(shape.dims, multi))
    with ctx.loop_nest(operand.shape.dims, name="i", restrict=restrict) as multi:
        x = ctx.value(operand, Index(operand.shape.dims, multi))
        out_index = Index(shape.dims, [v for d, v in enumerate(multi) if d not in reduced])
        current = ctx.load(output, shape, out_index)
        combined = ctx.apply_computation(root.called_computations[0], [current, x])
        ctx.store(combined, output, shape, out_index)
