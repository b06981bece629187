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

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import Index, KernelContext, i64, register, value_type
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


@register("reduce")
def emit_reduce(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    _check_reduce(inst)
    operand, init = inst.operands
    b = ctx.builder
    kept = index.get_multi(b)
    reduced = sorted(set(inst.dimensions))
    reduced_dims = tuple(operand.shape.dims[d] for d in reduced)
    accumulator = ctx.alloca(value_type(inst.shape.element_type), name="accumulator")
    b.store(ctx.value(init, Index.scalar()), accumulator)
    lanes = _LANES.get(inst.shape.element_type, 0)
    innermost_reduced = bool(reduced) and reduced[-1] == operand.shape.rank - 1
    if lanes and innermost_reduced and reduced_dims[-1] >= 2 * lanes:
        # A float row: fold it in `lanes` interleaved partial sums, then combine them.
        with ctx.loop_nest(reduced_dims[:-1], name="reduce") as outer:
            row = _reduce_row(ctx, inst, kept, outer, reduced_dims[-1], lanes)
            current = b.load(accumulator)
            b.store(ctx.apply_computation(inst.called_computations[0], [current, row]),
                    accumulator)
        return b.load(accumulator)
    with ctx.loop_nest(reduced_dims, name="reduce") as reduced_index:
        x = ctx.value(operand, _full_index(inst, kept, reduced_index))
        current = b.load(accumulator)
        b.store(ctx.apply_computation(inst.called_computations[0], [current, x]), accumulator)
    return b.load(accumulator)


def _reduce_row(ctx: KernelContext, inst: Instruction, kept: list[ir.Value],
                outer: list[ir.Value], length: int, lanes: int) -> ir.Value:
    """The reduction of one contiguous row of `length` >= 2*lanes elements.

    Lane l folds elements l, l+lanes, l+2*lanes, ... (starting from element l itself,
    so no identity value is needed); the lanes then combine pairwise and the tail
    (length % lanes elements) folds in last. XLA's reducers are associative by
    contract, and its CPU backend reorders float reductions the same way; the
    independent lanes let the SLP vectorizer use vector registers.
    """
    b = ctx.builder
    reducer = inst.called_computations[0]
    operand = inst.operand(0)
    element = value_type(inst.shape.element_type)

    def element_at(position: ir.Value) -> ir.Value:
        return ctx.value(operand, _full_index(inst, kept, [*outer, position]))

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


def is_row_reduction(inst: Instruction) -> bool:
    """Whether every reduced dimension lies inside (after) every kept one."""
    reduced = set(inst.dimensions)
    kept = [d for d in range(inst.operand(0).shape.rank) if d not in reduced]
    return not kept or not reduced or max(kept) < min(reduced)


def emit_reduction_kernel(ctx: KernelContext, root: Instruction, output: ir.Value) -> None:
    """Store `root` (a reduce) into `output`, walking its input in row-major order."""
    _check_reduce(root)
    shape = root.shape
    if is_row_reduction(root):
        with ctx.loop_nest(shape.dims, name="i") as multi:
            index = Index(shape.dims, multi)
            ctx.store(ctx.value(root, index), output, shape, index)
        return
    operand, init = root.operands
    with ctx.loop(shape.num_elements, name="init") as linear:
        ctx.store(ctx.value(init, Index.scalar()), output, shape, Index(shape.dims, linear=linear))
    reduced = set(root.dimensions)
    with ctx.loop_nest(operand.shape.dims, name="i") as multi:
        x = ctx.value(operand, Index(operand.shape.dims, multi))
        out_index = Index(shape.dims, [v for d, v in enumerate(multi) if d not in reduced])
        current = ctx.load(output, shape, out_index)
        combined = ctx.apply_computation(root.called_computations[0], [current, x])
        ctx.store(combined, output, shape, out_index)
