"""CPU code for HLO `sort`: a stable merge sort of each row, with the comparator inlined.

`compiler.py` hands every entry-level `sort` here (fusion never takes one). Rows split
across threads, each sorted whole by one thread. Per row the kernel sorts a permutation
(index arrays on the stack, or from `malloc` for long rows) with the bottom-up merge of
`tfxla_lite.hlo.sort.merge_sort_order`, so kernel and evaluator agree comparison for
comparison even under a comparator that is not a strict weak order; the permutation
then gathers each operand's row bit for bit. docs/architecture.md, section 4.
"""

from __future__ import annotations

from llvmlite import ir

from tfxla_lite.codegen.cpu import parallel
from tfxla_lite.codegen.cpu.emitter import (
    I64,
    PTR,
    VOID,
    ConstantPool,
    Index,
    KernelContext,
    declare,
    i64,
    minimum,
    new_kernel_function,
    register_own_kernel,
    storage_type,
    value_type,
)
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.sort import sort_dimension

# Rows of up to this many elements keep their index arrays on the stack (2 × 4 bytes
# an element: 128 KiB), longer ones take them from malloc, once per range call.
STACK_ELEMENTS = 1 << 14


@register_own_kernel("sort", "topk")
def emit_sort_kernel(module: ir.Module, pool: ConstantPool, inst: Instruction,
                     threads: int) -> ir.Function:
    """The launcher `void kernel(out..., in...)` of the entry `sort` or `topk` `inst`."""
    dims = inst.operand(0).shape.dims
    if inst.opcode == "topk":
        n = dims[-1]
        rows = inst.operand(0).shape.num_elements // n if n else 0
        k = int(inst.attributes["k"])
        return row_kernel(module, pool, inst, threads, rows, rows * n,
                           lambda ctx, outputs, inputs, begin, end: _emit_topk_rows(
                               ctx, inst, outputs, inputs, begin, end) if k else None)
    dimension = sort_dimension(inst.attributes, len(dims))
    n = dims[dimension]
    rows = (inst.operand(0).shape.num_elements // n) if n else 0
    return row_kernel(module, pool, inst, threads, rows, rows * n * max(1, n.bit_length()),
                       lambda ctx, outputs, inputs, begin, end: _emit_rows(
                           ctx, inst, outputs, inputs, dimension, begin, end))


def row_kernel(module: ir.Module, pool: ConstantPool, inst: Instruction, threads: int,
                rows: int, work: int, emit_rows) -> ir.Function:
    """A range function over rows [begin, end) made by `emit_rows(ctx, outputs, inputs,
    begin, end)`, and its launcher, which splits the rows across `threads` when `work`
    (in element steps) is big enough: each row whole on one thread, so results never
    depend on the thread count (sort's and topk's rows, linalg.py's matrices)."""

    count = len(inst.shape.tuple_shapes) if inst.shape.is_tuple else 1
    name = "kernel." + "".join(c if c.isalnum() or c in "_." else "_" for c in inst.name)
    ctx, outputs, inputs = new_kernel_function(module, pool, inst, name + ".rows", count,
                                               [I64, I64])
    begin, end = ctx.function.args[-2:]
    begin.name, end.name = "begin", "end"
    if rows and work:
        emit_rows(ctx, outputs, inputs, begin, end)
    ctx.builder.ret_void()
    launcher, launch_outputs, launch_inputs = new_kernel_function(module, pool, inst, name,
                                                                  count, [])
    team = threads if rows > 1 and work >= parallel.PARALLEL_MIN_WORK else 1
    parallel.emit_launch(launcher, ctx.function, [*launch_outputs, *launch_inputs], rows, team)
    launcher.builder.ret_void()
    return launcher.function


def _emit_rows(ctx: KernelContext, inst: Instruction, outputs: list[ir.Value],
               inputs: list[ir.Value], dimension: int, begin: ir.Value, end: ir.Value) -> None:
    b = ctx.builder
    shapes = [o.shape for o in inst.operands]
    dims = shapes[0].dims
    n = dims[dimension]
    inner = 1
    for size in dims[dimension + 1:]:
        inner *= size
    index_type = ir.IntType(32) if n < (1 << 31) else I64
    on_heap = n > STACK_ELEMENTS
    if on_heap:
        malloc = declare(ctx.module, "malloc", ir.FunctionType(PTR, [I64]))
        free = declare(ctx.module, "free", ir.FunctionType(VOID, [PTR]))
        bytes_each = index_type.width // 8
        block = b.call(malloc, [i64(2 * n * bytes_each)], name="sort.scratch")
        with b.if_then(b.icmp_unsigned("==", block, ir.Constant(PTR, None)), likely=False):
            b.call(declare(ctx.module, "llvm.trap", ir.FunctionType(VOID, [])), [])
        first = block
        second = b.gep(block, [i64(n)], inbounds=True, source_etype=index_type)
    else:
        first = ctx.alloca(index_type, name="sort.order", count=n)
        second = ctx.alloca(index_type, name="sort.merged", count=n)

    with ctx.loop(end, name="row", start=begin) as row:
        # Element k of the row sits at base + k * inner.
        outer = b.udiv(row, i64(inner))
        base = b.add(b.mul(outer, i64(n * inner)), b.urem(row, i64(inner)), name="base")
        with ctx.loop(n, name="init") as k:
            b.store(b.trunc(k, index_type) if index_type != I64 else k,
                    b.gep(first, [k], inbounds=True, source_etype=index_type))
        source = _merge_passes(ctx, inst, inputs, shapes, base, inner, n, index_type,
                               first, second)
        with ctx.loop(n, name="gather") as p:
            picked = b.load(b.gep(source, [p], inbounds=True, source_etype=index_type),
                            typ=index_type)
            picked = b.zext(picked, I64) if index_type != I64 else picked
            to = _position(b, base, p, inner)
            at = _position(b, base, picked, inner)
            for shape, output, input_ in zip(shapes, outputs, inputs):
                typ = storage_type(shape.element_type)
                value = b.load(b.gep(input_, [at], inbounds=True, source_etype=typ), typ=typ)
                b.store(value, b.gep(output, [to], inbounds=True, source_etype=typ))
    if on_heap:
        b.call(free, [block])


def _merge_passes(ctx: KernelContext, inst: Instruction, inputs: list[ir.Value],
                  shapes: list, base: ir.Value, inner: int, n: int, index_type: ir.Type,
                  first: ir.Value, second: ir.Value) -> ir.Value:
    """Merge runs of 1, 2, 4... from one index array into the other, alternating; returns
    the array that holds the sorted permutation (known at compile time: the pass count
    depends on `n` alone)."""
    b = ctx.builder
    comparator = inst.called_computations[0]

    def load_index(array: ir.Value, at: ir.Value) -> ir.Value:
        value = b.load(b.gep(array, [at], inbounds=True, source_etype=index_type),
                       typ=index_type)
        return b.zext(value, I64) if index_type != I64 else value

    def before(right: ir.Value, left: ir.Value) -> ir.Value:
        """Whether element `right` belongs before element `left` (the comparator)."""
        args = []
        for shape, input_ in zip(shapes, inputs):
            for element in (right, left):
                position = _position(b, base, element, inner)
                args.append(ctx.load(input_, shape, Index(shape.dims, linear=position)))
        with ctx.scope():
            return ctx.apply_computation(comparator, args)

    source, target = first, second
    width = 1
    while width < n:
        pairs = -(-n // (2 * width))
        with ctx.loop(pairs, name=f"merge{width}") as pair:
            low = b.mul(pair, i64(2 * width))
            middle = minimum(b, b.add(low, i64(width)), i64(n))
            high = minimum(b, b.add(low, i64(2 * width)), i64(n))
            _merge(ctx, source, target, low, middle, high, load_index, before, index_type)
        source, target = target, source
        width *= 2
    return source


def _merge(ctx: KernelContext, source: ir.Value, target: ir.Value, low: ir.Value,
           middle: ir.Value, high: ir.Value, load_index, before, index_type: ir.Type) -> None:
    """target[low:high] = the merge of source[low:middle] and source[middle:high]."""
    b = ctx.builder
    function = ctx.function
    header = function.append_basic_block("merge.header")
    body = function.append_basic_block("merge.body")
    tail = function.append_basic_block("merge.tail")
    preheader = b.block
    b.branch(header)

    b.position_at_end(header)
    i = b.phi(I64, name="i")
    j = b.phi(I64, name="j")
    i.add_incoming(low, preheader)
    j.add_incoming(middle, preheader)
    both = b.and_(b.icmp_signed("<", i, middle), b.icmp_signed("<", j, high))
    b.cbranch(both, body, tail)

    b.position_at_end(body)
    left = load_index(source, i)
    right = load_index(source, j)
    take_right = before(right, left)
    picked = b.select(take_right, right, left)
    k = b.sub(b.add(i, j), middle)  # elements placed so far, from low
    stored = b.trunc(picked, index_type) if index_type != I64 else picked
    b.store(stored, b.gep(target, [k], inbounds=True, source_etype=index_type))
    one = b.zext(take_right, I64)
    next_i = b.add(i, b.sub(i64(1), one))
    next_j = b.add(j, one)
    i.add_incoming(next_i, b.block)
    j.add_incoming(next_j, b.block)
    b.branch(header)

    # What is left of either run is already in order: copy it.
    b.position_at_end(tail)
    placed = b.sub(b.add(i, j), middle)
    left_rest = b.sub(middle, i)
    _copy(ctx, source, target, i, placed, left_rest, index_type)
    _copy(ctx, source, target, j, b.add(placed, left_rest), b.sub(high, j), index_type)


def _copy(ctx: KernelContext, source: ir.Value, target: ir.Value, start: ir.Value,
          to: ir.Value, length: ir.Value, index_type: ir.Type) -> None:
    b = ctx.builder
    memcpy = ctx.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    size = b.mul(length, i64(index_type.width // 8))
    b.call(memcpy, [b.gep(target, [to], inbounds=True, source_etype=index_type),
                    b.gep(source, [start], inbounds=True, source_etype=index_type),
                    size, ir.IntType(1)(0)])


def _position(b: ir.IRBuilder, base: ir.Value, element: ir.Value, inner: int) -> ir.Value:
    return b.add(base, b.mul(element, i64(inner)) if inner != 1 else element)


def _emit_topk_rows(ctx: KernelContext, inst: Instruction, outputs: list[ir.Value],
                    inputs: list[ir.Value], begin: ir.Value, end: ir.Value) -> None:
    """Each row streams once through a buffer of its k best so far, best first: an element
    enters only when it beats the last (one compare for most elements), shifting the
    worse ones down; equal elements never beat those already in (lower indices), which
    gives topk's index order among equals."""
    b = ctx.builder
    x = inst.operand(0)
    etype = x.shape.element_type
    n = x.shape.dims[-1]
    k = int(inst.attributes["k"])
    largest = bool(inst.attributes.get("largest", True))
    values_buffer = ctx.alloca(value_type(etype), name="topk.values", count=k)
    index_buffer = ctx.alloca(I64, name="topk.indices", count=k)
    filled = ctx.alloca(I64, name="topk.filled")
    values_shape, indices_shape = inst.shape.tuple_shapes
    (input_,) = inputs

    def better(a: ir.Value, c: ir.Value) -> ir.Value:
        if etype in ("f16", "bf16", "f32", "f64"):
            ahead = b.fcmp_ordered(">" if largest else "<", a, c)
            nan_a = b.fcmp_unordered("uno", a, a)
            nan_c = b.fcmp_unordered("uno", c, c)
            nan_wins = b.and_(nan_a, b.not_(nan_c)) if largest else \
                b.and_(nan_c, b.not_(nan_a))
            return b.or_(ahead, nan_wins)
        compare = b.icmp_signed if etype.startswith("s") else b.icmp_unsigned
        return compare(">" if largest else "<", a, c)

    def slot(buffer: ir.Value, typ: ir.Type, at: ir.Value) -> ir.Value:
        return b.gep(buffer, [at], inbounds=True, source_etype=typ)

    vtype = value_type(etype)
    with ctx.loop(end, name="row", start=begin) as row:
        b.store(i64(0), filled)
        with ctx.loop(n, name="element") as j:
            linear = b.add(b.mul(row, i64(n)), j)
            v = ctx.load(input_, x.shape, Index(x.shape.dims, linear=linear))
            count = b.load(filled, typ=I64)
            full = b.icmp_signed("==", count, i64(k))
            last = b.load(slot(values_buffer, vtype, i64(k - 1)), typ=vtype)
            enters = b.or_(b.not_(full), better(v, last))
            with b.if_then(enters):
                start = b.select(full, i64(k - 1), count)
                # Shift the worse ones down from `start` while v beats the one above.
                header = ctx.function.append_basic_block("topk.shift")
                body = ctx.function.append_basic_block("topk.move")
                done = ctx.function.append_basic_block("topk.place")
                before = b.block
                b.branch(header)
                b.position_at_end(header)
                at = b.phi(I64, name="at")
                at.add_incoming(start, before)
                above = b.sub(at, i64(1))
                has_above = b.icmp_signed(">", at, i64(0))
                above_value = b.load(slot(values_buffer, vtype,
                                          b.select(has_above, above, i64(0))), typ=vtype)
                b.cbranch(b.and_(has_above, better(v, above_value)), body, done)
                b.position_at_end(body)
                b.store(above_value, slot(values_buffer, vtype, at))
                b.store(b.load(slot(index_buffer, I64, above), typ=I64),
                        slot(index_buffer, I64, at))
                at.add_incoming(above, body)
                b.branch(header)
                b.position_at_end(done)
                b.store(v, slot(values_buffer, vtype, at))
                b.store(j, slot(index_buffer, I64, at))
                b.store(b.select(full, count, b.add(count, i64(1))), filled)
        with ctx.loop(k, name="write") as p:
            linear = b.add(b.mul(row, i64(k)), p)
            ctx.store(b.load(slot(values_buffer, vtype, p), typ=vtype), outputs[0],
                      values_shape, Index(values_shape.dims, linear=linear))
            ctx.store(b.trunc(b.load(slot(index_buffer, I64, p), typ=I64), ir.IntType(32)),
                      outputs[1], indices_shape, Index(indices_shape.dims, linear=linear))
