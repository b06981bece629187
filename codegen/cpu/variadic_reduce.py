"""CPU code for variadic `reduce` (N inputs, N init values, a tuple of N results) and
for the tuples that flow through kernels.

`reduction.py` hands a reduce of several inputs here (TF's XLA lowers ArgMax/ArgMin
that way, over values and iota indices). Inside a kernel a tuple is an LLVM literal
struct, so `tuple`, `get-tuple-element` and a reducer returning a tuple need no special
case; `multi_output.py` stores each field to its own buffer. Every fold visits the
reduced elements in an order fixed by the shapes (`fold_lanes`), never by the threads.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import Index, KernelContext, i64, register, value_type
from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.shape import Shape


def reduce_inputs(inst: Instruction) -> tuple[list[Instruction], list[Instruction]]:
    """The N inputs and the N init values of a (variadic) reduce."""
    count = len(inst.operands) // 2
    return list(inst.operands[:count]), list(inst.operands[count:])


def result_shapes(inst: Instruction) -> list[Shape]:
    """The shapes of a reduce's N results (one for a single-input reduce)."""
    return list(inst.shape.tuple_shapes) if inst.shape.tuple_shapes is not None else [inst.shape]


def make_struct(ctx: KernelContext, values: list[ir.Value]) -> ir.Value:
    """A literal struct of `values`, as a tuple-shaped value inside a kernel."""
    struct: ir.Value = ir.Constant(ir.LiteralStructType([v.type for v in values]), ir.Undefined)
    for n, value in enumerate(values):
        struct = ctx.builder.insert_value(struct, value, n)
    return struct


def fields(ctx: KernelContext, value: ir.Value, count: int) -> list[ir.Value]:
    """The fields of a struct made by `make_struct`; a lone value for `count` 1."""
    if not isinstance(value.type, ir.LiteralStructType):
        assert count == 1
        return [value]
    return [ctx.builder.extract_value(value, n) for n in range(count)]


def apply_reducer(ctx: KernelContext, reducer: Computation, accumulators: list[ir.Value],
                  elements: list[ir.Value]) -> list[ir.Value]:
    """`reducer(acc_0, ..., acc_{N-1}, x_0, ..., x_{N-1})` as a list of N values."""
    result = ctx.apply_computation(reducer, [*accumulators, *elements])
    return fields(ctx, result, len(accumulators))


@register("tuple")
def emit_tuple(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    return make_struct(ctx, [ctx.value(operand, index) for operand in inst.operands])


@register("get-tuple-element")
def emit_get_tuple_element(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    whole = ctx.value(inst.operand(0), index)
    return ctx.builder.extract_value(whole, int(inst.attributes["index"]))


def full_index(inst: Instruction, kept: list[ir.Value], reduced: list[ir.Value]) -> Index:
    """The index into a reduce's inputs from its kept and reduced positions."""
    dims = set(inst.dimensions)
    operand = inst.operand(0)
    kept_iter, reduced_iter = iter(kept), iter(reduced)
    multi = [next(reduced_iter) if d in dims else next(kept_iter)
             for d in range(operand.shape.rank)]
    return Index(operand.shape.dims, multi)


# Interleaved partial results per row: reducers are associative and commutative by
# XLA's contract, and independent lanes let the SLP vectorizer run the comparator
# (argmax's compare-and-select) on vector registers.
LANES = 16


def emit_variadic_reduce(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    """The struct of the N results of `inst` at output `index`: the fold, from the init
    values, of the reduced elements in row-major order (a contiguous innermost row of
    at least 2*LANES elements folds in interleaved lanes, see `fold_lanes`)."""
    inputs, inits = reduce_inputs(inst)
    shapes = result_shapes(inst)
    if len(shapes) != len(inputs) or any(s.dims != shapes[0].dims for s in shapes):
        raise NotImplementedError(f"CPU backend: reduce %{inst.name} with results {inst.shape}")
    b = ctx.builder
    kept = index.get_multi(b)
    reduced_order = sorted(set(inst.dimensions))
    reduced_dims = tuple(inputs[0].shape.dims[d] for d in reduced_order)
    slots = [ctx.alloca(value_type(s.element_type), name=f"accumulator{n}")
             for n, s in enumerate(shapes)]
    for slot, init in zip(slots, inits):
        b.store(ctx.value(init, Index.scalar()), slot)
    reducer = inst.called_computations[0]
    innermost = bool(reduced_order) and reduced_order[-1] == inputs[0].shape.rank - 1
    if innermost and reduced_dims[-1] >= 2 * LANES:
        with ctx.loop_nest(reduced_dims[:-1], name="reduce") as outer:
            def elements_at(position: ir.Value, outer: list[ir.Value] = outer
                            ) -> list[ir.Value]:
                at = full_index(inst, kept, [*outer, position])
                return [ctx.value(x, at) for x in inputs]

            row = fold_lanes(ctx, reducer, elements_at, reduced_dims[-1])
            combined = apply_reducer(ctx, reducer, [b.load(s) for s in slots], row)
            for slot, value in zip(slots, combined):
                b.store(value, slot)
        return make_struct(ctx, [b.load(s) for s in slots])
    with ctx.loop_nest(reduced_dims, name="reduce") as reduced:
        position = full_index(inst, kept, reduced)
        elements = [ctx.value(x, position) for x in inputs]
        combined = apply_reducer(ctx, reducer, [b.load(s) for s in slots], elements)
        for slot, value in zip(slots, combined):
            b.store(value, slot)
    return make_struct(ctx, [b.load(s) for s in slots])


def fold_lanes(ctx: KernelContext, reducer: Computation,
               elements_at: Callable[[ir.Value], list[ir.Value]], length: int
               ) -> list[ir.Value]:
    """The fold by `reducer` of `elements_at(0 .. length-1)`, length >= 2*LANES: lane l
    folds elements l, l+LANES, ... (from element l itself, so no init value), the lanes
    then combine pairwise, and the tail (length % LANES elements) folds in last."""
    b = ctx.builder
    first = [elements_at(i64(n)) for n in range(LANES)]
    slots = [[ctx.alloca(v.type, name=f"lane{n}.{k}") for k, v in enumerate(values)]
             for n, values in enumerate(first)]
    for lane, values in zip(slots, first):
        for slot, value in zip(lane, values):
            b.store(value, slot)
    chunks = length // LANES
    with ctx.loop(chunks, name="chunk", start=1) as chunk:
        base = b.mul(chunk, i64(LANES), flags=["nuw", "nsw"])
        elements = [elements_at(b.add(base, i64(n), flags=["nuw", "nsw"]))
                    for n in range(LANES)]
        for lane, values in zip(slots, elements):
            combined = apply_reducer(ctx, reducer, [b.load(s) for s in lane], values)
            for slot, value in zip(lane, combined):
                b.store(value, slot)
    partial = [[b.load(s) for s in lane] for lane in slots]
    while len(partial) > 1:
        partial = [apply_reducer(ctx, reducer, partial[n], partial[n + 1])
                   for n in range(0, len(partial), 2)]
    result = [ctx.alloca(v.type, name=f"row{k}") for k, v in enumerate(partial[0])]
    for slot, value in zip(result, partial[0]):
        b.store(value, slot)
    with ctx.loop(length, name="tail", start=chunks * LANES) as position:
        combined = apply_reducer(ctx, reducer, [b.load(s) for s in result],
                                 elements_at(position))
        for slot, value in zip(result, combined):
            b.store(value, slot)
    return [b.load(s) for s in result]


def fold_range(ctx: KernelContext, inst: Instruction, start: ir.Value, length: int
               ) -> list[ir.Value]:
    """The fold of input elements start .. start+length-1 (row-major) of reduce `inst`,
    from the first of them (no init value): a chunk of a split full reduction."""
    b = ctx.builder
    inputs, _ = reduce_inputs(inst)
    dims = inputs[0].shape.dims
    reducer = inst.called_computations[0]

    def elements_at(position: ir.Value) -> list[ir.Value]:
        linear = b.add(start, position, flags=["nuw", "nsw"])
        at = Index(dims, linear=linear)
        return [ctx.value(x, at) for x in inputs]

    if length >= 2 * LANES:
        return fold_lanes(ctx, reducer, elements_at, length)
    first = elements_at(i64(0))
    slots = [ctx.alloca(v.type, name=f"partial{n}") for n, v in enumerate(first)]
    for slot, value in zip(slots, first):
        b.store(value, slot)
    with ctx.loop(length, name="fold", start=1) as position:
        combined = apply_reducer(ctx, reducer, [b.load(s) for s in slots],
                                 elements_at(position))
        for slot, value in zip(slots, combined):
            b.store(value, slot)
    return [b.load(s) for s in slots]
