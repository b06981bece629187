"""CPU code for `reduce`: an element generator and the kernel of a reduction root.

The element generator loops over the reduced dimensions (row reductions, contiguous;
float rows fold interleaved partials, `fold_row`). A root whose kept minor dimensions
follow the reduced block is a column reduction (`column_reduction.py`); other layouts
walk the input row-major into the output (`emit_reduction_kernel`). Sums and products
of f16/bf16 accumulate in f32 and round once (`Accumulation`), as TF's lowering does
and XLA's excess precision allows; the evaluator does the same.
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
    round_bf16,
    value_type,
)
from tfxla_lite.hlo.ir import Instruction, widened_reduce_op


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
    return _LANES.get("f32" if widened_reduce_op(inst) else inst.shape.element_type, 0)




class Accumulation:
    """How reduce `inst` folds: through its reducer in its own type, or
    (`widened_reduce_op`) in f32, each element widened on the way in and the result
    rounded once on the way out."""

    def __init__(self, ctx: KernelContext, inst: Instruction) -> None:
        self.ctx = ctx
        self.reducer = inst.called_computations[0]
        self.source_type = inst.shape.element_type
        self.op = widened_reduce_op(inst)
        self.element_type = "f32" if self.op else self.source_type

    def widen(self, x: ir.Value) -> ir.Value:
        # bf16 values already sit in f32 registers (emitter.value_type).
        if self.op and self.source_type == "f16":
            return self.ctx.builder.fpext(x, value_type("f32"))
        return x

    def combine(self, accumulated: ir.Value, x: ir.Value) -> ir.Value:
        if self.op == "add":
            return self.ctx.builder.fadd(accumulated, x)
        if self.op == "multiply":
            return self.ctx.builder.fmul(accumulated, x)
        return self.ctx.apply_computation(self.reducer, [accumulated, x])

    def narrow(self, x: ir.Value) -> ir.Value:
        if not self.op:
            return x
        if self.source_type == "f16":
            return self.ctx.builder.fptrunc(x, value_type("f16"))
        return round_bf16(self.ctx.builder, x)


@register("reduce")
def emit_reduce(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    if len(inst.operands) != 2 or inst.shape.is_tuple:
        return variadic_reduce.emit_variadic_reduce(ctx, inst, index)  # a struct of results
    operand, init = inst.operands
    b = ctx.builder
    kept = index.get_multi(b)
    reduced = sorted(set(inst.dimensions))
    reduced_dims = tuple(operand.shape.dims[d] for d in reduced)
    fold = Accumulation(ctx, inst)
    accumulator = ctx.alloca(value_type(fold.element_type), name="accumulator")
    b.store(fold.widen(ctx.value(init, Index.scalar())), accumulator)
    lanes = _lanes(inst)
    innermost_reduced = bool(reduced) and reduced[-1] == operand.shape.rank - 1
    if lanes and innermost_reduced and reduced_dims[-1] >= 2 * lanes:
        # A float row: fold it in `lanes` interleaved partial sums, then combine them.
        with ctx.loop_nest(reduced_dims[:-1], name="reduce") as outer:
            def element_at(position: ir.Value, outer: list[ir.Value] = outer) -> ir.Value:
                return ctx.value(operand, _full_index(inst, kept, [*outer, position]))

            row = _fold_lanes(fold, element_at, reduced_dims[-1], lanes)
            b.store(fold.combine(b.load(accumulator), row), accumulator)
        return fold.narrow(b.load(accumulator))
    with ctx.loop_nest(reduced_dims, name="reduce") as reduced_index:
        x = fold.widen(ctx.value(operand, _full_index(inst, kept, reduced_index)))
        b.store(fold.combine(b.load(accumulator), x), accumulator)
    return fold.narrow(b.load(accumulator))


def fold_row(ctx: KernelContext, inst: Instruction, element_at: Callable[[ir.Value], ir.Value],
             length: int, lanes: int) -> ir.Value:
    """The fold by `inst`'s reducer of `element_at(0 .. length-1)`, `length` >= 2*lanes.

    Lane l folds elements l, l+lanes, l+2*lanes, ... (starting from element l itself,
    so no identity value is needed); the lanes then combine pairwise and the tail
    (length % lanes elements) folds in last. XLA's reducers are associative by
    contract, and its CPU backend reorders float reductions the same way; the
    independent lanes are one vector register (`_fold_lanes`). A sum or product of
    2-byte floats folds in f32 lanes and rounds once (`Accumulation`).
    """
    fold = Accumulation(ctx, inst)
    return fold.narrow(_fold_lanes(fold, element_at, length, lanes))


def _fold_lanes(fold: Accumulation, element_at: Callable[[ir.Value], ir.Value], length: int,
                lanes: int) -> ir.Value:
    """`fold_row` before the final rounding: the result in `fold.element_type`.

    The lanes are an array on the stack and each step over them is a loop of `lanes`
    iterations, so the element expression is emitted once for the steps (twice where
    the reducer has no identity to start the lanes from: the first step is then its
    own) and once for the tail, if there is one, where it was emitted once per lane and
    step (2 * lanes + 1 copies). LLVM's loop vectorizer turns each lane loop into one
    vector operation (its trip count is the vector width) and SROA keeps the lanes in
    a vector register: the code the SLP vectorizer made of the copies, in the same
    fold order, bit for bit the same results, from far less IR and LLVM time
    (docs/benchmarks.md)."""
    ctx = fold.ctx
    b = ctx.builder
    element = value_type(fold.element_type)
    slots = ctx.alloca(element, name="lanes", count=lanes)

    def lane(n: ir.Value) -> ir.Value:
        return b.gep(slots, [n], inbounds=True, source_etype=element)

    start = identity(fold)
    if start is None:
        with ctx.loop(lanes, name="lane.first") as n:
            b.store(fold.widen(element_at(n)), lane(n))
    else:
        with ctx.loop(lanes, name="lane.first") as n:
            b.store(start, lane(n))
    chunks = length // lanes
    with ctx.loop(chunks, name="chunk", start=0 if start is not None else 1) as chunk:
        base = b.mul(chunk, i64(lanes), flags=["nuw", "nsw"])
        with ctx.loop(lanes, name="lane") as n:
            value = fold.widen(element_at(b.add(base, n, flags=["nuw", "nsw"])))
            slot = lane(n)
            b.store(fold.combine(b.load(slot), value), slot)
    partial = [b.load(lane(i64(n))) for n in range(lanes)]
    while len(partial) > 1:
        partial = [fold.combine(partial[n], partial[n + 1]) for n in range(0, len(partial), 2)]
    if length == chunks * lanes:  # no tail: emit no copy of the element expression for it
        return partial[0]
    result = ctx.alloca(element, name="row")
    b.store(partial[0], result)
    with ctx.loop(length, name="tail", start=chunks * lanes) as position:
        b.store(fold.combine(b.load(result), fold.widen(element_at(position))), result)
    return b.load(result)


# Values x with `op(identity, x) == x` bit for bit, NaNs aside (quieted, as the first
# fold of a lane quiets them anyway): -0.0 + +0.0 is +0.0, 1.0 * x is x.
_IDENTITIES = {"add": -0.0, "multiply": 1.0}


def identity(fold: Accumulation) -> ir.Constant | None:
    """The identity of `fold`'s reducer when it is a float add or multiply of its two
    parameters, else None (then the first chunk starts the lanes)."""
    opcode = fold.op
    if opcode is None:
        root = fold.reducer.root
        if root is None or root.opcode not in _IDENTITIES or \
                any(o.opcode != "parameter" for o in root.operands) or \
                root.operand(0) is root.operand(1) or len(fold.reducer.instructions) != 3:
            return None
        opcode = root.opcode
    if fold.element_type not in _LANES:
        return None
    return ir.Constant(value_type(fold.element_type), _IDENTITIES[opcode])


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
    with no init value: in interleaved lanes (`fold_row`) where they apply; a sum or
    product of 2-byte floats in f32, rounded once (`Accumulation`)."""
    b = ctx.builder
    lanes = _lanes(inst)
    if lanes and length >= 2 * lanes:
        return fold_row(ctx, inst, element_at, length, lanes)
    fold = Accumulation(ctx, inst)
    accumulator = ctx.alloca(value_type(fold.element_type), name="partial")
    b.store(fold.widen(element_at(i64(0))), accumulator)
    with ctx.loop(length, name="fold", start=1) as position:
        combined = fold.combine(b.load(accumulator), fold.widen(element_at(position)))
        b.store(combined, accumulator)
    return fold.narrow(b.load(accumulator))


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
    if widened_reduce_op(root):
        _emit_widened_columns(ctx, root, output, output_restrict)
        return
    with ctx.loop_nest(shape.dims, name="init", restrict=output_restrict) as multi:
        ctx.store(ctx.value(init, Index.scalar()), output, shape, Index(shape.dims, multi))
    with ctx.loop_nest(operand.shape.dims, name="i", restrict=restrict) as multi:
        x = ctx.value(operand, Index(operand.shape.dims, multi))
        out_index = Index(shape.dims, [v for d, v in enumerate(multi) if d not in reduced])
        current = ctx.load(output, shape, out_index)
        combined = ctx.apply_computation(root.called_computations[0], [current, x])
        ctx.store(combined, output, shape, out_index)


# Outputs a widened column reduction folds at once (one vector of f32 accumulators).
_COLUMN_BLOCK = 16


def _emit_widened_columns(ctx: KernelContext, root: Instruction, output: ir.Value,
                          restrict: Restriction | None) -> None:
    """A column reduction that is a 2-byte sum or product (`widened_reduce_op`), into `output`.

    The output buffer holds 2-byte floats, which cannot carry f32 partial results, so
    the row-major walk of `emit_reduction_kernel` does not apply. Instead blocks of
    `_COLUMN_BLOCK` neighbouring outputs (along the innermost kept dimension) fold
    their inputs in as many f32 accumulators, walking the reduced dimensions once per
    block: each step reads neighbouring inputs, as the row-major walk does. The outputs
    left over after the last whole block fold one at a time (`emit_reduce`).
    `restrict` applies to the output's dimensions.
    """
    b = ctx.builder
    operand, init = root.operands
    shape = root.shape
    dims = shape.dims
    last = len(dims) - 1
    fold = Accumulation(ctx, root)
    reduced = sorted(set(root.dimensions))
    reduced_dims = tuple(operand.shape.dims[d] for d in reduced)
    begin, end = i64(0), i64(dims[last])
    outer_restrict = restrict
    if restrict is not None and restrict[0] == last:
        begin, end, outer_restrict = restrict[1], restrict[2], None
    start = fold.widen(ctx.value(init, Index.scalar()))
    slots = [ctx.alloca(value_type(fold.element_type), name=f"column{n}")
             for n in range(_COLUMN_BLOCK)]
    with ctx.loop_nest(dims[:-1], name="o", restrict=outer_restrict) as outer:
        blocks = b.udiv(b.sub(end, begin), i64(_COLUMN_BLOCK))
        with ctx.loop(blocks, name="block") as block:
            base = b.add(begin, b.mul(block, i64(_COLUMN_BLOCK), flags=["nuw", "nsw"]),
                         flags=["nuw", "nsw"])
            columns = [b.add(base, i64(n), flags=["nuw", "nsw"]) for n in range(_COLUMN_BLOCK)]
            for slot in slots:
                b.store(start, slot)
            with ctx.loop_nest(reduced_dims, name="r") as reduced_index:
                for slot, column in zip(slots, columns):
                    x = ctx.value(operand, _full_index(root, [*outer, column], reduced_index))
                    b.store(fold.combine(b.load(slot), fold.widen(x)), slot)
            for slot, column in zip(slots, columns):
                ctx.store(fold.narrow(b.load(slot)), output, shape,
                          Index(dims, [*outer, column]))
        tail = b.add(begin, b.mul(blocks, i64(_COLUMN_BLOCK), flags=["nuw", "nsw"]),
                     flags=["nuw", "nsw"])
        with ctx.loop(end, name="tail", start=tail) as column:
            index = Index(dims, [*outer, column])
            ctx.store(ctx.value(root, index), output, shape, index)
