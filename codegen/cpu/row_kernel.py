"""CPU code for row fusions (`passes/row_fusion.py`): every stage of a row, row by row.

The range function computes rows [begin, end), each with one *stage* per reduce (the
fold bound as a scalar later stages read from a register) and then the root's, so the
row is read from memory once and later stages find it in cache; an expensive wide value
several stages need (softmax's exponentials) is kept in a stack row while it fits
`ROW_SCRATCH_BYTES`. A divide by a per-row value multiplies by the reciprocal (within 2
ulp) unless the divisor is tiny or huge (`_keep_scalar`); max/min folds fall back to
the exact NaN-propagating result only when needed (`_fold_exactly`). Fold order depends
on the row width alone, never the thread count. docs/architecture.md, section 4.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tfxla_lite.codegen.cpu import math, reduction, streaming
from tfxla_lite.codegen.cpu.emitter import (
    I32,
    I64,
    Index,
    KernelContext,
    i64,
    storage_type,
    value_type,
)
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.opcodes import is_expensive
from tfxla_lite.passes.row_fusion import RowPlan, plan_row_fusion

# Stack bytes per thread for row buffers of values shared between stages.
ROW_SCRATCH_BYTES = 64 << 10


def is_row_fusion(inst: Instruction) -> bool:
    return plan_row_fusion(inst) is not None


def row_count(inst: Instruction) -> int:
    """The rows a row fusion's range function splits between threads."""
    plan = plan_row_fusion(inst)
    assert plan is not None
    return plan.spec.rows


def _reach(plan: RowPlan, target: Instruction, stop: set[int]) -> list[Instruction]:
    """Instructions computed for `target` (itself included), not looking past the plan's
    reduces (bound per row) or the instructions in `stop` (loaded from row buffers)."""
    reduce_ids = {id(r) for r in plan.reduces}
    seen: set[int] = set()
    order: list[Instruction] = []
    stack = [target]
    while stack:
        inst = stack.pop()
        if id(inst) in seen:
            continue
        seen.add(id(inst))
        order.append(inst)
        if (id(inst) in reduce_ids and inst is not target) or id(inst) in stop:
            continue
        stack.extend(inst.operands)
    return order


def _stages(plan: RowPlan) -> list[Instruction]:
    """The row's stages: its reduces, then a wide root (a per-row root is bound by then)."""
    wide_root = plan.classes[id(plan.root)] == "wide"
    return [*plan.reduces] + ([plan.root] if wide_root else [])


def _shared_values(plan: RowPlan, instructions: list[Instruction]) -> dict[int, int]:
    """Wide, expensive values that several stages need: id → the stage that computes them.

    Consumers are decided first, so that a value needed later only through a shared
    consumer (which later stages load) is not shared itself.
    """
    stages = _stages(plan)
    chosen: dict[int, int] = {}
    for inst in reversed(instructions):
        if plan.classes.get(id(inst)) != "wide" or not is_expensive(inst.opcode):
            continue
        users = [number for number, stage in enumerate(stages)
                 if inst in _reach(plan, stage, {k for k, f in chosen.items() if f < number})]
        if len(users) > 1:
            chosen[id(inst)] = users[0]
    return chosen


def _nonpositive_exponentials(plan: RowPlan, instructions: list[Instruction]
                              ) -> list[Instruction]:
    """The f32 and f16 exponentials whose argument is proven never above 0: x - max(x)
    with max(x) a maximum reduce of the same x over the row, broadcast back along it
    (softmax). max(x) >= every element, so the difference is <= 0 (x == max gives +0),
    or NaN (a NaN in the row, inf - inf, -inf - -inf), or -inf; whatever the reduce's
    init, which only raises max(x) or makes it NaN. `math.exp`'s `nonpositive` form
    gives the same bits as the general one for all of these."""
    spec = plan.spec
    row_axes = tuple(range(spec.kept, len(spec.dims)))
    found = []
    for inst in instructions:
        if inst.opcode != "exponential" or inst.shape.element_type not in ("f32", "f16") or \
                plan.classes.get(id(inst)) != "wide":
            continue
        difference = inst.operand(0)
        if difference.opcode != "subtract" or difference.operand(1).opcode != "broadcast":
            continue
        x, broadcast = difference.operands
        peak = broadcast.operand(0)
        if peak.opcode == "reduce" and peak.operand(0) is x and x.shape.dims == spec.dims \
                and tuple(sorted(peak.dimensions)) == row_axes \
                and tuple(broadcast.dimensions) == tuple(range(spec.kept)) \
                and _is_maximum(peak):
            found.append(inst)
    return found


def _is_maximum(reduce: Instruction) -> bool:
    """Whether `reduce`'s reducer is the maximum of its two parameters."""
    root = reduce.called_computations[0].root
    return root is not None and root.opcode == "maximum" and \
        all(o.opcode == "parameter" for o in root.operands) and \
        root.operand(0) is not root.operand(1)


def emit_row_kernel(ctx: KernelContext, inst: Instruction, output: ir.Value,
                    begin: ir.Value, end: ir.Value, stream: bool = False) -> None:
    """Store rows [begin, end) of row fusion `inst` into `output`; with `stream`, a wide
    root's rows go out through streaming stores (`streaming.py`)."""
    plan = plan_row_fusion(inst)
    assert plan is not None
    b = ctx.builder
    spec = plan.spec
    width = spec.width
    computation = inst.fused_computation
    by_id = {id(i): i for i in computation.instructions}
    stages = _stages(plan)
    shared = _shared_values(plan, computation.instructions)
    nonpositive = _nonpositive_exponentials(plan, computation.instructions)
    # A reduce whose operand is computed gets it stored into a row buffer by a plain
    # loop (which LLVM vectorizes whole) and folds the buffer: folding the computation
    # itself in interleaved lanes leaves the SLP vectorizer with narrow vectors.
    computed = {s.operand(0).shape.element_type for s in stages if s.opcode == "reduce"
                and s.operand(0).opcode != "parameter" and id(s.operand(0)) not in shared}
    element_bytes = {key: by_id[key].shape.byte_size // max(1, by_id[key].shape.num_elements)
                     for key in shared}
    scratch_bytes = width * (sum(element_bytes.values()) + 8 * len(computed))
    if scratch_bytes > ROW_SCRATCH_BYTES:
        shared, computed = {}, set()
    buffers = {key: ctx.alloca(value_type(by_id[key].shape.element_type), name="row.scratch",
                               count=width) for key in shared}
    for buffer in buffers.values():  # (`_stream_scaled_lines` loads them a line at a time)
        buffer.align = streaming.LINE_BYTES
    stage_buffers = {element: ctx.alloca(value_type(element), name="row.stage", count=width)
                     for element in sorted(computed)}
    row_values = [i for i in computation.instructions
                  if plan.classes.get(id(i)) == "row" and i.opcode != "reduce"]

    with ctx.loop(end, name="row", start=begin) as row:
        kept = Index(spec.kept_dims, linear=row).get_multi(b)
        row_axes = [v for v, size in zip(kept, spec.kept_dims) if size != 1]
        base = b.mul(row, i64(width), flags=["nuw", "nsw"])
        bound: list[int] = []

        def row_index(value: Instruction) -> Index:
            axes = iter(row_axes)
            multi = [i64(0) if size == 1 else next(axes) for size in value.shape.dims]
            return Index(value.shape.dims, multi, row)

        def wide_index(column: ir.Value) -> Index:
            if len(spec.row_dims) == 1:
                columns = [column]
            else:
                columns = Index(spec.row_dims, linear=column).get_multi(b)
            linear = b.add(base, column, flags=["nuw", "nsw"])
            return Index(spec.dims, kept + columns, linear)

        def element(target: Instruction, number: int, column: ir.Value) -> ir.Value:
            """`target` at (row, column) in stage `number`, storing and loading row buffers."""
            index = wide_index(column)
            loaded = [key for key, first in shared.items() if first < number]
            for key in loaded:
                element_type = value_type(by_id[key].shape.element_type)
                slot = b.gep(buffers[key], [column], inbounds=True, source_etype=element_type)
                ctx.scalars[key] = b.load(slot, typ=element_type)
            stored = [key for key, first in shared.items() if first == number]
            # Exponentials of a nonpositive argument (softmax's) skip exp's upper clamp.
            reached = {id(i) for wanted in [target, *(by_id[key] for key in stored)]
                       for i in _reach(plan, wanted, set(loaded))}
            exponentials = [e for e in nonpositive
                            if id(e) in reached and id(e) not in ctx.scalars]
            for exponential in list(exponentials):
                value = math.exp_of_nonpositive(ctx, ctx.value(exponential.operand(0), index))
                if value is None:  # (not an f32 or f16 value: the general emitter's)
                    exponentials.remove(exponential)
                    continue
                ctx.scalars[id(exponential)] = value
            for key in stored:
                element_type = value_type(by_id[key].shape.element_type)
                slot = b.gep(buffers[key], [column], inbounds=True, source_etype=element_type)
                b.store(ctx.value(by_id[key], index), slot)
            value = ctx.value(target, index)
            for key in [*loaded, *(id(e) for e in exponentials)]:
                del ctx.scalars[key]
            return value

        def bind_row_values() -> None:
            """Bind each per-row value whose dependent operands are all bound."""
            for value in row_values:
                if id(value) in bound:
                    continue
                if all(id(o) in ctx.scalars for o in value.operands if plan.is_dependent(o)):
                    ctx.scalars[id(value)] = ctx.value(value, row_index(value))
                    bound.append(id(value))

        def quotient(root: Instruction, number: int, column: ir.Value,
                     inverse: ir.Value | None) -> ir.Value:
            if inverse is None:
                return element(root, number, column)
            return b.fmul(element(root.operand(0), number, column), inverse)

        def store_quotients(root: Instruction, number: int, inverse: ir.Value | None,
                            rare: bool = False) -> None:
            with ctx.loop(width, name="column") as column:
                ctx.store(quotient(root, number, column, inverse), output, root.shape,
                          wide_index(column))
            if rare:
                _keep_scalar(ctx, column)

        def stream_row(root: Instruction, number: int,
                       choice: tuple[ir.Value, ir.Value] | None) -> None:
            """The row through streaming stores, emitted once: with `choice` (whether to
            multiply by the reciprocal, the reciprocal) the choice is made inside each
            block's fill, so the streamed store path is not doubled. A quotient of a row
            buffer (softmax) is stored straight from registers instead (`_stream_scaled_lines`;
            the rare exact rows by the plain scalar loop)."""
            source = _scaled_row_source(root, number, shared, buffers, width)
            if source is not None and choice is not None:
                with b.if_else(choice[0], likely=True) as (reciprocal, exact):
                    with reciprocal:
                        _stream_scaled_lines(ctx, root, source, choice[1], output, base,
                                             width)
                    with exact:
                        store_quotients(root, number, None, rare=True)
                return

            def fill(buffer: ir.Value, first: ir.Value, length: ir.Value) -> None:
                def loop(inverse: ir.Value | None, rare: bool = False) -> None:
                    with ctx.loop(length, name="stream.fill") as offset:
                        column = b.add(b.sub(first, base, flags=["nuw", "nsw"]), offset,
                                       flags=["nuw", "nsw"])
                        ctx.store(quotient(root, number, column, inverse), buffer,
                                  root.shape, Index(root.shape.dims, linear=offset))
                    if rare:
                        _keep_scalar(ctx, offset)

                if choice is None:
                    loop(None)
                    return
                with b.if_else(choice[0]) as (reciprocal, exact):
                    with reciprocal:
                        loop(choice[1])
                    with exact:
                        loop(None, rare=True)

            streaming.emit_streamed_range(ctx, output, root.shape, base,
                                          b.add(base, i64(width), flags=["nuw", "nsw"]), fill,
                                          length=width)

        def store_wide_root(root: Instruction, number: int) -> None:
            """Store the row of a wide root. x / d for a per-row d is one division per
            row, then x * (1/d) while 1/d is a normal number (`_reciprocal`)."""
            divisor = row_divisor(root, ctx.scalars) if width else None
            choice = None if divisor is None else \
                _reciprocal(ctx, root, ctx.value(divisor, wide_index(i64(0))))
            if stream:
                stream_row(root, number, choice)
            elif choice is None:
                store_quotients(root, number, None)
            else:
                with b.if_else(choice[0]) as (reciprocal, exact):
                    with reciprocal:
                        store_quotients(root, number, choice[1])
                    with exact:
                        store_quotients(root, number, None, rare=True)

        for number, stage in enumerate(stages):
            if stage.opcode == "reduce":
                operand, init = stage.operands
                result = ctx.value(init, Index.scalar())
                if width:
                    folded = _fold_stage(ctx, stage, number, width, base, element, shared,
                                         buffers, stage_buffers)
                    result = ctx.apply_computation(stage.called_computations[0],
                                                   [result, folded])
                ctx.scalars[id(stage)] = result
                bound.append(id(stage))
                bind_row_values()
            else:
                store_wide_root(stage, number)
        if plan.root.opcode == "reduce" or plan.classes[id(plan.root)] == "row":
            root = plan.root
            ctx.store(ctx.scalars[id(root)], output, root.shape, row_index(root))
        for key in bound:
            del ctx.scalars[key]


def _fold_stage(ctx: KernelContext, stage: Instruction, number: int, width: int,
                base: ir.Value, element: Callable[[Instruction, int, ir.Value], ir.Value],
                shared: dict[int, int], buffers: dict[int, ir.Value],
                stage_buffers: dict[str, ir.Value]) -> ir.Value:
    """The fold of one row of reduce `stage`'s operand (no init), read from a row buffer
    that an earlier stage, or a loop emitted here, filled, or from the input's own row;
    else computed element by element inside the fold."""
    b = ctx.builder
    operand = stage.operand(0)
    element_type = value_type(operand.shape.element_type)
    row = None
    if id(operand) in shared and shared[id(operand)] < number:
        row = buffers[id(operand)]
    elif operand.opcode == "parameter" and \
            storage_type(operand.shape.element_type) == element_type:
        # (A bf16 row in memory is 16-bit words, not the f32 values it computes in: it
        # is folded element by element, each loaded and widened.)
        row = b.gep(ctx.buffers[id(operand)], [base], inbounds=True, source_etype=element_type)
    elif id(operand) in shared or operand.shape.element_type in stage_buffers:
        if id(operand) in shared:
            row = buffers[id(operand)]
        else:
            row = stage_buffers[operand.shape.element_type]
        with ctx.loop(width, name="stage") as column:
            value = element(operand, number, column)
            if id(operand) not in shared:  # a shared value is stored by `element` itself
                b.store(value, b.gep(row, [column], inbounds=True, source_etype=element_type))
        if id(operand) in shared:
            # Two vectors an iteration: softmax's exp loop, which LLVM left at one, ran
            # 2-6% faster on one thread (the same bits: no fold in this loop).
            loop_hint(ctx, column, ("llvm.loop.interleave.count", ir.Constant(I32, 2)))
    if row is None:
        return reduction.fold_elements(ctx, stage, lambda column: element(operand, number,
                                                                          column), width)
    opcode = vector_reducer(stage)
    if opcode is not None and width >= 2 * _VECTOR_LANES[stage.shape.element_type]:
        return fold_contiguous(ctx, stage, opcode, row, width)
    return reduction.fold_elements(
        ctx, stage, lambda column: b.load(b.gep(row, [column], inbounds=True,
                                                source_etype=element_type), typ=element_type),
        width)


def _scaled_row_source(root: Instruction, number: int, shared: dict[int, int],
                       buffers: dict[int, ir.Value], width: int) -> ir.Value | None:
    """The row buffer holding the dividend of a divide root by a per-row value (softmax's
    exponentials, stored by an earlier stage) when the row is whole lines of f32 or f64,
    so that its quotients (x * 1/d) can be streamed out straight from registers."""
    if root.opcode != "divide" or root.shape.element_type not in _VECTOR_LANES:
        return None
    dividend = root.operand(0)
    if id(dividend) not in shared or shared[id(dividend)] >= number or \
            dividend.shape.element_type != root.shape.element_type or \
            width % _VECTOR_LANES[root.shape.element_type] != 0:
        return None
    return buffers[id(dividend)]


def _stream_scaled_lines(ctx: KernelContext, root: Instruction, source: ir.Value,
                         scale: ir.Value, output: ir.Value, base: ir.Value, width: int) -> None:
    """output[base + c] = source[c] * scale for the `width` elements (whole lines) of a
    row of divide root `root`: a line at a time, a load from the row buffer `source`,
    a multiply and a streaming store (`streaming.emit_lines`). The products are those
    the fill loop of `streaming.emit_streamed_range` would store (x * (1/d), the same
    bits), without its block buffer and the copy out of it.

    A row off the line grid (a NumPy output 16 bytes past a line) first scales `source`
    in place (the root is the row's last stage: nothing reads the buffer after it) and
    multiplies by 1 in the line loop (x * 1 = x), so that the elements before its first
    line boundary and after its last are copied with `memcpy` (a scalar loop for them
    costs LLVM far more time)."""
    b = ctx.builder
    scalar = scale.type
    size = streaming.element_bytes(root.shape)
    lanes = streaming.LINE_BYTES // size
    vector = ir.VectorType(scalar, lanes)
    flags = ["nuw", "nsw"]

    def splat(value: ir.Value) -> ir.Value:
        return b.shuffle_vector(
            b.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(I32, 0)),
            ir.Constant(vector, ir.Undefined),
            ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))

    def at(position: ir.Value) -> ir.Value:
        return b.gep(source, [position], inbounds=True, source_etype=scalar)

    address = b.add(b.ptrtoint(output, I64), b.mul(base, i64(size), flags=flags))
    off_grid = b.icmp_unsigned("!=", b.and_(address, i64(streaming.LINE_BYTES - 1)), i64(0))
    with b.if_then(off_grid, likely=False):
        factor = splat(scale)
        with ctx.loop(width // lanes, name="stream.scale") as number:
            pointer = at(b.mul(number, i64(lanes), flags=flags))
            b.store(b.fmul(b.load(pointer, typ=vector, align=size), factor),
                    b.bitcast(pointer, vector.as_pointer()), align=size)
    factor = splat(b.select(off_grid, ir.Constant(scalar, 1.0), scale))

    def line(position: ir.Value) -> ir.Value:
        return b.fmul(b.load(at(position), typ=vector, align=size), factor)

    streaming.emit_lines(ctx, output, root.shape, base, width, line, source)


def row_divisor(root: Instruction, scalars: dict[int, ir.Value]) -> Instruction | None:
    """The divisor of a float `divide` root when it is a per-row value already bound
    (softmax's broadcast row sum), else None."""
    if root.opcode != "divide" or root.shape.element_type not in _RECIPROCAL_RANGE:
        return None
    divisor = root.operand(1)
    if divisor.opcode != "broadcast" or id(divisor.operand(0)) not in scalars:
        return None
    return divisor


# |d| in [2^-e, 2^e]: 1/d is a normal number, rounded with relative error 2^-24 (f32).
_RECIPROCAL_RANGE = {"f32": 126, "f64": 1022}


def _reciprocal(ctx: KernelContext, root: Instruction, d: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(whether to multiply by the reciprocal, 1/d) for the divide root's per-row d.

    x * rn(1/d) is within 2 ulp of rn(x / d) (the tolerance tfxla-lite's tests keep
    for divide; oneDNN's softmax divides the same way) while 1/d is a normal number.
    For d = ±0, ±inf or NaN it is x / d exactly, by IEEE's special cases (x * ±inf,
    x * ±0, x * NaN: the same infinities, zeros and NaNs, 0 * inf and inf * 0 the
    default NaN as 0 / 0 and inf / inf; NaN payloads aside), so those rows multiply
    too (a softmax row with a NaN has a NaN sum). Only d tiny or huge (finite, 1/d
    not normal) keeps the exact quotients, in a scalar loop (`_keep_scalar`)."""
    b = ctx.builder
    exponent = _RECIPROCAL_RANGE[root.shape.element_type]
    magnitude = ctx.call_intrinsic("fabs", [d])

    def between(low: float, high: float) -> ir.Value:
        return b.and_(b.fcmp_ordered(">", magnitude, ir.Constant(d.type, low)),
                      b.fcmp_ordered("<", magnitude, ir.Constant(d.type, high)))

    exact = b.or_(between(0.0, 2.0 ** -exponent), between(2.0 ** exponent, float("inf")))
    return b.not_(exact), b.fdiv(ir.Constant(d.type, 1.0), d)


def _keep_scalar(ctx: KernelContext, counter: ir.Value) -> None:
    """Keep LLVM's loop vectorizer off the loop whose induction variable is `counter`: a
    loop only rare rows run, which vectorized (interleaved, with a remainder loop) costs
    LLVM more time than its scalar form for no run-time gain."""
    loop_hint(ctx, counter, ("llvm.loop.vectorize.enable", ir.Constant(ir.IntType(1), 0)))


def loop_hint(ctx: KernelContext, counter: ir.Value,
              *hints: tuple[str, ir.Constant | None]) -> None:
    """Give the loop whose induction variable is `counter` (closed: its latch branch
    emitted) the loop metadata `hints`, (name, value) pairs (None: a name alone)."""
    assert isinstance(counter, ir.PhiInstr)
    module = ctx.module
    options = tuple(module.add_metadata([ir.MetaDataString(module, name)]
                                        + ([] if value is None else [value]))
                    for name, value in hints)
    # A loop's ID is a node whose first operand is itself, which `add_metadata` cannot
    # make: made directly, once per module and shared by such loops (all want the same;
    # the same node keeps identical kernels' texts identical, `compiler.KernelMerger`).
    loop_id = next((node for node in module.metadata if len(node.operands) == len(options) + 1
                    and node.operands[0] is node
                    and all(a is b for a, b in zip(node.operands[1:], options))), None)
    if loop_id is None:
        loop_id = ir.values.MDValue(module, list(options), name=str(len(module.metadata)))
        loop_id.operands = (loop_id, *options)
    _, latch = counter.incomings[-1]
    latch.terminator.set_metadata("llvm.loop", loop_id)


# Float reducers folded in vector registers when a row lies contiguous in memory.
_VECTOR_REDUCERS = frozenset({"add", "multiply", "maximum", "minimum"})
_VECTOR_LANES = {"f32": 16, "f64": 8}
_VECTOR_ACCUMULATORS = 4  # independent chains, so that one op's latency hides the next


def vector_reducer(reduce: Instruction) -> str | None:
    """The opcode of `reduce`'s reducer when it is a plain float add, multiply, max or min."""
    root = reduce.called_computations[0].root
    if root is None or root.opcode not in _VECTOR_REDUCERS or \
            reduce.shape.element_type not in _VECTOR_LANES:
        return None
    if sorted(o.opcode for o in root.operands) != ["parameter", "parameter"] or \
            root.operand(0) is root.operand(1):
        return None
    return root.opcode


def fold_contiguous(ctx: KernelContext, reduce: Instruction, opcode: str, row: ir.Value,
                    width: int) -> ir.Value:
    """The fold of `width` contiguous elements at `row` by `opcode`, without the init.

    Element e goes to lane e % L of accumulator (e // L) % A while whole groups of
    A*L elements last; the accumulators then combine in a fixed tree, their lanes by
    halves, and the remaining elements fold in last, in order. The order depends on
    `width` alone, never on the thread count.

    Max and min fold by compare and select (`_fold_vectors` with `fast`: three
    instructions a vector on x86, where `llvm.maximum`, NaN-propagating and -0 below
    +0, costs about five) and give `llvm.maximum` / `llvm.minimum`'s exact result
    otherwise (`_fold_exactly`) only when the fast result may differ: a NaN was seen, or
    the result is a zero (whose sign a select may get wrong). Without a NaN, every
    lane's select fold, and the select tree over the lanes, equal the exact folds but
    for a zero's sign, and the exact tail keeps that so: the result is exact unless it
    is zero, so testing the result alone is enough.
    """
    element_type = reduce.shape.element_type
    if opcode not in ("maximum", "minimum"):
        value, _ = _fold_vectors(ctx, opcode, element_type, row, width, fast=False)
        return value
    b = ctx.builder
    value, nan = _fold_vectors(ctx, opcode, element_type, row, width, fast=True)
    assert nan is not None
    # Without a NaN, each lane holds the extreme of its elements, but a zero's sign may
    # be wrong; so may the select tree's result, and the exact tail keeps that: the
    # value is exact unless it is a zero.
    redo = b.or_(nan, b.fcmp_ordered("==", value, ir.Constant(value.type, 0.0)))
    result = ctx.alloca(value.type, name="vector.fold.result")
    b.store(value, result)
    with b.if_then(redo, likely=False):
        b.store(_fold_exactly(ctx, opcode, element_type, row, width, nan), result)
    return b.load(result)


def _fold_exactly(ctx: KernelContext, opcode: str, element_type: str, row: ir.Value,
                  width: int, nan: ir.Value) -> ir.Value:
    """`fold_contiguous`'s exact result (`llvm.maximum` / `llvm.minimum` of the `width`
    elements at `row`) where the fast fold saw a NaN or got a zero: NaN when `nan` (a
    quiet NaN: payloads aside, as everywhere in tfxla-lite), else a zero whose sign says
    whether the row holds the zero that wins (max: +0 when the row holds a +0, else -0;
    min: -0 when it holds a -0), found by comparing bits, a vector at a time.

    A bit scan rather than a second fold with `llvm.maximum`: it costs LLVM less time
    and rows whose maximum is 0 (a softmax of x - max(x)) less kernel time."""
    b = ctx.builder
    scalar = value_type(element_type)
    bits = ir.IntType(8 * (8 if element_type == "f64" else 4))
    sign = 1 << (bits.width - 1)
    wanted, other = (0, sign) if opcode == "maximum" else (sign, 0)
    lanes = _VECTOR_LANES[element_type]
    vector = ir.VectorType(bits, lanes)
    mask = ir.VectorType(ir.IntType(1), lanes)
    target = ir.Constant(vector, [wanted] * lanes)
    found = ctx.alloca(mask, name="zero.found")
    b.store(ir.Constant(mask, [0] * lanes), found)
    with ctx.loop(width // lanes, name="zero.scan") as number:
        position = b.mul(number, i64(lanes), flags=["nuw", "nsw"])
        x = b.load(b.gep(row, [position], inbounds=True, source_etype=bits), typ=vector,
                   align=bits.width // 8)
        b.store(b.or_(b.load(found), b.icmp_unsigned("==", x, target)), found)
    hit = b.icmp_unsigned("!=", b.bitcast(b.load(found), ir.IntType(lanes)),
                          ir.Constant(ir.IntType(lanes), 0))
    if width % lanes:
        flag = ctx.alloca(ir.IntType(1), name="zero.found.tail")
        b.store(hit, flag)
        with ctx.loop(width, name="zero.tail", start=width - width % lanes) as position:
            x = b.load(b.gep(row, [position], inbounds=True, source_etype=bits), typ=bits)
            b.store(b.or_(b.load(flag), b.icmp_unsigned("==", x, ir.Constant(bits, wanted))),
                    flag)
        _keep_scalar(ctx, position)
        hit = b.load(flag)
    zero = b.select(hit, ir.Constant(bits, wanted), ir.Constant(bits, other))
    return b.select(nan, ir.Constant(scalar, float("nan")), b.bitcast(zero, scalar))


def _fold_vectors(ctx: KernelContext, opcode: str, element_type: str, row: ir.Value,
                  width: int, fast: bool) -> tuple[ir.Value, ir.Value | None]:
    """`fold_contiguous`'s fold, and with `fast` (max and min) whether it saw a NaN: each
    group's vectors then fold by one compare-select each (x86's vmaxps/vminps: a NaN or
    the second of two zeros wins for one step), and one NaN mask collects the group's
    NaNs (`fcmp uno` of two vectors at a time): a mask per accumulator would make
    LLVM's InstCombine the largest part of the module's compile."""
    b = ctx.builder
    scalar = value_type(element_type)
    lanes = _VECTOR_LANES[element_type]
    accumulators = _VECTOR_ACCUMULATORS if width >= 2 * _VECTOR_ACCUMULATORS * lanes else 1
    group = accumulators * lanes
    vector = ir.VectorType(scalar, lanes)
    scalar_bytes = 8 if element_type == "f64" else 4

    def combine(x: ir.Value, y: ir.Value) -> ir.Value:
        if opcode == "add":
            return b.fadd(x, y)
        if opcode == "multiply":
            return b.fmul(x, y)
        typ = x.type
        suffix = (f"v{typ.count}" if isinstance(typ, ir.VectorType) else "") + \
            {"f32": "f32", "f64": "f64"}[element_type]
        name = f"llvm.{opcode}.{suffix}"
        function = ctx.module.globals.get(name)
        if function is None:
            function = ir.Function(ctx.module, ir.FunctionType(typ, [typ, typ]), name=name)
        return b.call(function, [x, y])

    def tree(x: ir.Value, y: ir.Value) -> ir.Value:
        """A step of the tree over the accumulators and their lanes: a compare and select
        when `fast`, exact but for a zero's sign where the mask saw no NaN, as the steps
        over the groups (`llvm.maximum` there cost LLVM time and made the kernel slower)."""
        if not fast:
            return combine(x, y)
        return b.select(b.fcmp_ordered(">" if opcode == "maximum" else "<", x, y), x, y)

    def load_vector(position: ir.Value) -> ir.Value:
        pointer = b.gep(row, [position], inbounds=True, source_etype=scalar)
        return b.load(pointer, typ=vector, align=scalar_bytes)

    groups = width // group
    slots = [ctx.alloca(vector, name=f"vector.accumulator{n}") for n in range(accumulators)]
    nans = ctx.alloca(ir.VectorType(ir.IntType(1), lanes), name="vector.nan") if fast else None

    def unordered(vectors: list[ir.Value]) -> ir.Value:
        """The lanes where one of `vectors` is a NaN (`fcmp uno` tests two at once)."""
        tests = [b.fcmp_unordered("uno", vectors[n], vectors[min(n + 1, len(vectors) - 1)])
                 for n in range(0, len(vectors), 2)]
        while len(tests) > 1:
            tests = [b.or_(tests[n], tests[n + 1]) if n + 1 < len(tests) else tests[n]
                     for n in range(0, len(tests), 2)]
        return tests[0]

    firsts = [load_vector(i64(n * lanes)) for n in range(accumulators)]
    for first, slot in zip(firsts, slots):
        b.store(first, slot)
    if nans is not None:
        b.store(unordered(firsts), nans)
    with ctx.loop(groups, name="vector.group", start=1) as number:
        start = b.mul(number, i64(group), flags=["nuw", "nsw"])
        loaded = []
        for n, slot in enumerate(slots):
            position = b.add(start, i64(n * lanes), flags=["nuw", "nsw"])
            x, accumulator = load_vector(position), b.load(slot)
            loaded.append(x)
            if not fast:
                b.store(combine(accumulator, x), slot)
                continue
            wins = b.fcmp_ordered(">" if opcode == "maximum" else "<", accumulator, x)
            b.store(b.select(wins, accumulator, x), slot)
        if nans is not None:
            b.store(b.or_(b.load(nans), unordered(loaded)), nans)
    values = [b.load(slot) for slot in slots]
    while len(values) > 1:
        values = [tree(values[n], values[n + 1]) for n in range(0, len(values), 2)]
    (value,) = values
    count = lanes
    while count > 1:
        half = count // 2
        low = b.shuffle_vector(value, value, ir.Constant(ir.VectorType(ir.IntType(32), half),
                                                          list(range(half))))
        high = b.shuffle_vector(value, value, ir.Constant(ir.VectorType(ir.IntType(32), half),
                                                           list(range(half, count))))
        value = tree(low, high)
        count = half
    value = b.extract_element(value, i64(0))
    if groups * group != width:  # the tail (no loop when there is none)
        result = ctx.alloca(scalar, name="vector.fold")
        b.store(value, result)
        with ctx.loop(width, name="vector.tail", start=groups * group) as position:
            pointer = b.gep(row, [position], inbounds=True, source_etype=scalar)
            b.store(combine(b.load(result), b.load(pointer, typ=scalar)), result)
        value = b.load(result)
    if nans is None:
        return value, None
    return value, b.icmp_unsigned("!=", b.bitcast(b.load(nans), ir.IntType(lanes)),
                                  ir.Constant(ir.IntType(lanes), 0))


__all__ = ["ROW_SCRATCH_BYTES", "emit_row_kernel", "is_row_fusion", "row_count"]

