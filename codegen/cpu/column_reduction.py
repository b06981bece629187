"""CPU kernels of column reductions: reduces that keep the input's minor dimensions.

`compiler.plan_partition` (a reduce at a kernel's root) and `multi_output.plan` (several
reduces of one input shape) ask `plan` whether a reduction is [lead..., rows...,
width...] with the reduced rows in the middle, then emit its range function with
`emit_units` and the launcher's fold with `emit_combine`. Each unit accumulates whole
rows into one accumulator per column, in a loop LLVM vectorizes; the chunks of rows are
fixed by the shape and folded in order, so every thread count gives the same bits
(docs/architecture.md, "column reduction").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from math import prod

from llvmlite import ir

from tfxla_lite.codegen.cpu import data_movement, reduction, row_kernel
from tfxla_lite.codegen.cpu.emitter import Index, KernelContext, i64, value_type
from tfxla_lite.hlo.ir import Instruction, widened_reduce_op
from tfxla_lite.hlo.shape import Shape

# Columns one unit accumulates at once: the accumulators stay in L1 (4 KiB of f32).
_BLOCK = 1024
# Elements of input per chunk of rows, and the most chunks a lead index is split into:
# enough units for a team of threads, few enough partials to combine serially.
_CHUNK_ELEMENTS = 1 << 14
_MAX_CHUNKS = 64
# Bytes of partial results the launcher keeps on its stack (all reduces), at most.
_MAX_PARTIAL_BYTES = 128 << 10
# Units worth starting a parallel region for; more lead indices need no chunks.
_TARGET_UNITS = 64
# Rows a sum folds into accumulators of their own before adding them to the chunk's.
_GROUP_ROWS = 16
# Blocks narrower than this, and not a multiple of `_VECTOR` elements, fold unrolled.
_SCALAR_BELOW = 32
_VECTOR = 8
_FALSE = ir.Constant(ir.IntType(1), 0)
# Reducers whose folds may be regrouped (associative and commutative), so that a chunk
# starts from its first row and chunks combine among themselves before the init.
_REGROUPABLE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})


def _regroupable(reduce: Instruction) -> bool:
    """Whether `reduce`'s reducer is one op of `_REGROUPABLE` of its two parameters: any
    other computation (`x + y * y`) is folded from the init value in row-major order
    by the generic kernel, as the evaluator folds it."""
    computation = reduce.called_computations[0]
    root = computation.root
    return root is not None and root.opcode in _REGROUPABLE and \
        len(computation.instructions) == 3 and len(set(map(id, root.operands))) == 2 and \
        all(o.opcode == "parameter" for o in root.operands)


@dataclass(frozen=True)
class ColumnPlan:
    """How a column reduction of an input [lead..., rows..., width...] is cut into units."""

    input_dims: tuple[int, ...]
    lead: tuple[int, ...]
    rows: tuple[int, ...]
    width: tuple[int, ...]
    chunks: int  # chunks of rows per lead index
    chunk_rows: int  # rows per chunk (the last may have fewer)

    @property
    def lead_size(self) -> int:
        return prod(self.lead)

    @property
    def row_count(self) -> int:
        return prod(self.rows)

    @property
    def width_size(self) -> int:
        return prod(self.width)

    @property
    def block(self) -> int:
        return min(self.width_size, _BLOCK)

    @property
    def blocks(self) -> int:
        return -(-self.width_size // self.block)

    @property
    def scalar_columns(self) -> bool:
        """Whether loops over a block's columns are unrolled rather than vectorized: a
        narrow block that is not whole vectors, whose masked vector loads and stores of
        the accumulators would never forward from store to load."""
        return self.block < _SCALAR_BELOW and self.block % _VECTOR != 0

    @property
    def units(self) -> int:
        return self.lead_size * self.blocks * self.chunks

    @property
    def partial_count(self) -> int:
        """Elements of each reduce's partials buffer (0: units store the results)."""
        return self.lead_size * self.chunks * self.width_size if self.chunks > 1 else 0


def plan(reduces: Sequence[Instruction]) -> ColumnPlan | None:
    """The plan of reduces of one input shape and reduced dimensions, or None where this
    kernel does not apply: a variadic reduce, a reducer that is not one associative op
    (`_regroupable`), reduced dimensions that are not one block
    (size-1 kept dimensions aside), no kept dimension after them, or nothing to fold."""
    if not reduces or any(len(r.operands) != 2 or r.shape.is_tuple or not _regroupable(r)
                          for r in reduces):
        return None
    first = reduces[0]
    dims = first.operand(0).shape.dims
    reduced = set(first.dimensions)
    if not reduced or any(r.operand(0).shape.dims != dims or set(r.dimensions) != reduced
                          for r in reduces):
        return None
    low, high = min(reduced), max(reduced)
    if high == len(dims) - 1 or any(d not in reduced and dims[d] != 1
                                    for d in range(low, high + 1)):
        return None
    lead, rows, width = dims[:low], dims[low:high + 1], dims[high + 1:]
    row_count, lead_size, width_size = prod(rows), prod(lead), prod(width)
    if row_count == 0 or lead_size * width_size == 0:
        return None  # an empty input or output: the generic kernel stores the init values
    chunks = -(-row_count * width_size // _CHUNK_ELEMENTS)
    blocks = -(-width_size // min(width_size, _BLOCK))
    partial_bytes = lead_size * width_size * sum(
        Shape("f32" if widened_reduce_op(r) else r.shape.element_type, ()).byte_size
        for r in reduces)
    chunks = min(chunks, _MAX_CHUNKS, row_count,
                 max(1, -(-_TARGET_UNITS // (lead_size * blocks))),
                 max(1, _MAX_PARTIAL_BYTES // partial_bytes))
    chunk_rows = -(-row_count // chunks)
    return ColumnPlan(dims, lead, rows, width, -(-row_count // chunk_rows), chunk_rows)


@dataclass
class Target:
    """Where one reduce's results go: its output buffers (every leaf holding it) and,
    with several chunks, its partials buffer."""

    reduce: Instruction
    outputs: list[ir.Value]
    partials: ir.Value | None = None


@dataclass
class Extra:
    """An input-shaped value the kernel also stores (a multi-output fusion's leaf)."""

    producer: Instruction
    output: ir.Value
    shape: Shape


def _urem(ctx: KernelContext, value: ir.Value, divisor: int) -> ir.Value:
    return ctx.builder.urem(value, i64(divisor)) if divisor > 1 else i64(0)


def _udiv(ctx: KernelContext, value: ir.Value, divisor: int) -> ir.Value:
    return ctx.builder.udiv(value, i64(divisor)) if divisor > 1 else value


def _min(ctx: KernelContext, a: ir.Value, b: ir.Value) -> ir.Value:
    return ctx.builder.select(ctx.builder.icmp_signed("<", a, b), a, b)


@contextmanager
def _column_loop(ctx: KernelContext, stop: int | ir.Value, name: str, scalar: bool,
                 start: int | ir.Value = 0) -> Iterator[ir.Value]:
    """A loop over a block's columns; with `scalar` unrolled, not vectorized (its
    accumulators then live in registers across rows)."""
    with ctx.loop(stop, name=name, start=start) as column:
        yield column
    if scalar:
        row_kernel.loop_hint(ctx, column, ("llvm.loop.vectorize.enable", _FALSE),
                             ("llvm.loop.unroll.full", None))


def emit_units(ctx: KernelContext, column_plan: ColumnPlan, targets: list[Target],
               extras: list[Extra], begin: ir.Value, end: ir.Value) -> None:
    """Units [begin, end) of `column_plan`: each folds its rows into one accumulator per
    column and reduce, then stores them (one chunk: the results, init folded in; several:
    the partial results into `Target.partials`). `extras` are stored at every element."""
    b = ctx.builder
    p = column_plan
    nuw = ["nuw", "nsw"]
    folds = [reduction.Accumulation(ctx, t.reduce) for t in targets]
    types = [value_type(f.element_type) for f in folds]
    slots = [ctx.alloca(t, name="columns", count=p.block) for t in types]
    identities = [reduction.identity(f) for f in folds]
    # Reducers without an identity (max, a computation) start from the chunk's first row;
    # sums and products fold groups of rows from their identity, then add the group to
    # the chunk's accumulators (a sequential f32 sum of a long chunk loses more).
    first_row_starts = any(i is None for i in identities)
    group_slots = [] if first_row_starts else \
        [ctx.alloca(t, name="group", count=p.block) for t in types]
    width_size = p.width_size
    scalar = p.scalar_columns
    # One block of all the columns: the column loop splits where a concatenate's
    # operands meet (data_movement.last_dimension_pieces), each piece without its branch.
    pieces = data_movement.last_dimension_pieces(
        [t.reduce.operand(0) for t in targets] + [e.producer for e in extras]) \
        if p.blocks == 1 and len(p.width) == 1 and not scalar else None
    with ctx.loop(end, name="unit", start=begin) as unit:
        chunk = _urem(ctx, unit, p.chunks)
        rest = _udiv(ctx, unit, p.chunks)
        block = _urem(ctx, rest, p.blocks)
        lead = _udiv(ctx, rest, p.blocks)
        column0 = b.mul(block, i64(p.block), flags=nuw)
        width = i64(p.block) if p.blocks == 1 else \
            _min(ctx, i64(p.block), b.sub(i64(width_size), column0, flags=nuw))
        row0 = b.mul(chunk, i64(p.chunk_rows), flags=nuw)
        row_end = _min(ctx, b.add(row0, i64(p.chunk_rows), flags=nuw), i64(p.row_count))
        lead_multi = Index(p.lead, linear=lead).get_multi(b) if p.lead else []
        lead_rows = b.mul(lead, i64(p.row_count), flags=nuw)

        def fill_identities(*arrays: list[ir.Value]) -> None:
            with _column_loop(ctx, width, "identity", scalar) as j:
                for into in arrays:
                    for slot, element, value in zip(into, types, identities):
                        b.store(value, b.gep(slot, [j], inbounds=True, source_etype=element))

        def fold_row(row: ir.Value, start: bool, into: list[ir.Value]) -> None:
            for begin, stop in pieces or [(0, width)]:
                with ctx.scope():
                    fold_columns(row, start, into, begin, stop)

        def fold_columns(row: ir.Value, start: bool, into: list[ir.Value],
                         begin: int | ir.Value, stop: int | ir.Value) -> None:
            row_multi = Index(p.rows, linear=row).get_multi(b)
            base = b.mul(b.add(lead_rows, row, flags=nuw), i64(width_size), flags=nuw)
            with _column_loop(ctx, stop, "column", scalar, begin) as j:
                column = b.add(column0, j, flags=nuw)
                width_multi = [column] if len(p.width) == 1 else \
                    Index(p.width, linear=column).get_multi(b)
                at = Index(p.input_dims, [*lead_multi, *row_multi, *width_multi],
                           b.add(base, column, flags=nuw))
                for target, fold, slot, element in zip(targets, folds, into, types):
                    x = fold.widen(ctx.value(target.reduce.operand(0), at))
                    pointer = b.gep(slot, [j], inbounds=True, source_etype=element)
                    b.store(x if start else fold.combine(b.load(pointer), x), pointer)
                for extra in extras:
                    ctx.store(ctx.value(extra.producer, at), extra.output, extra.shape, at)

        if first_row_starts:
            with ctx.scope():
                fold_row(row0, True, slots)
            with ctx.loop(row_end, name="row", start=b.add(row0, i64(1), flags=nuw)) as row:
                fold_row(row, False, slots)
        else:
            fill_identities(slots, group_slots)
            rows = b.sub(row_end, row0, flags=nuw)
            groups = b.udiv(b.add(rows, i64(_GROUP_ROWS - 1), flags=nuw), i64(_GROUP_ROWS))
            with ctx.loop(groups, name="group") as group:
                group0 = b.add(row0, b.mul(group, i64(_GROUP_ROWS), flags=nuw), flags=nuw)
                group_end = _min(ctx, b.add(group0, i64(_GROUP_ROWS), flags=nuw), row_end)
                with ctx.loop(group_end, name="row", start=group0) as row:
                    fold_row(row, False, group_slots)
                # The group into the chunk's accumulators, and its own back to the identity.
                with _column_loop(ctx, width, "add_group", scalar) as j:
                    for fold, slot, group_slot, element, value in zip(
                            folds, slots, group_slots, types, identities):
                        into = b.gep(slot, [j], inbounds=True, source_etype=element)
                        group_pointer = b.gep(group_slot, [j], inbounds=True,
                                              source_etype=element)
                        b.store(fold.combine(b.load(into), b.load(group_pointer)), into)
                        b.store(value, group_pointer)

        out_base = b.add(b.mul(lead, i64(width_size), flags=nuw), column0, flags=nuw)
        partial_base = b.add(b.mul(b.add(b.mul(lead, i64(p.chunks), flags=nuw), chunk,
                                         flags=nuw), i64(width_size), flags=nuw),
                             column0, flags=nuw)
        inits = [None if p.chunks > 1 else fold.widen(
            ctx.value(target.reduce.operand(1), Index.scalar()))
            for target, fold in zip(targets, folds)]
        with _column_loop(ctx, width, "store", scalar) as j:
            for target, fold, slot, element, init in zip(targets, folds, slots, types, inits):
                value = b.load(b.gep(slot, [j], inbounds=True, source_etype=element))
                if target.partials is not None:
                    position = b.add(partial_base, j, flags=nuw)
                    b.store(value, b.gep(target.partials, [position], inbounds=True,
                                         source_etype=element))
                    continue
                assert init is not None
                result = fold.narrow(fold.combine(init, value))
                shape = target.reduce.shape
                index = Index(shape.dims, linear=b.add(out_base, j, flags=nuw))
                for output in target.outputs:
                    ctx.store(result, output, shape, index)


def emit_combine(ctx: KernelContext, column_plan: ColumnPlan, targets: list[Target]) -> None:
    """After the units (several chunks): each result = init folded with chunk 0's partial,
    then chunk 1's, ... in order, stored to its outputs; the running values are an array
    of their own, so no loop reads and writes one array at two offsets."""
    b = ctx.builder
    p = column_plan
    nuw = ["nuw", "nsw"]
    width_size = p.width_size
    scalar = p.scalar_columns
    folds = [reduction.Accumulation(ctx, t.reduce) for t in targets]
    types = [value_type(f.element_type) for f in folds]
    running = [ctx.alloca(t, name="combined", count=width_size) for t in types]
    inits = [fold.widen(ctx.value(t.reduce.operand(1), Index.scalar()))
             for t, fold in zip(targets, folds)]

    def at(array: ir.Value | None, position: ir.Value, element: ir.Type) -> ir.Value:
        return b.gep(array, [position], inbounds=True, source_etype=element)

    with ctx.loop(p.lead_size, name="lead") as lead:
        base = b.mul(lead, i64(p.chunks * width_size), flags=nuw)
        with _column_loop(ctx, width_size, "first", scalar) as j:
            for target, values, element in zip(targets, running, types):
                first = b.load(at(target.partials, b.add(base, j, flags=nuw), element),
                               typ=element)
                b.store(first, at(values, j, element))
        with ctx.loop(p.chunks, name="chunk", start=1) as chunk:
            offset = b.add(base, b.mul(chunk, i64(width_size), flags=nuw), flags=nuw)
            with _column_loop(ctx, width_size, "column", scalar) as j:
                for target, fold, values, element in zip(targets, folds, running, types):
                    partial = b.load(at(target.partials, b.add(offset, j, flags=nuw),
                                        element), typ=element)
                    into = at(values, j, element)
                    b.store(fold.combine(b.load(into, typ=element), partial), into)
        out_base = b.mul(lead, i64(width_size), flags=nuw)
        with _column_loop(ctx, width_size, "result", scalar) as j:
            for target, fold, values, element, init in zip(targets, folds, running, types,
                                                           inits):
                value = b.load(at(values, j, element), typ=element)
                result = fold.narrow(fold.combine(init, value))
                shape = target.reduce.shape
                index = Index(shape.dims, linear=b.add(out_base, j, flags=nuw))
                for output in target.outputs:
                    ctx.store(result, output, shape, index)
