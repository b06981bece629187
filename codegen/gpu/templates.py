"""CUDA kernel templates: one `extern "C" __global__` function per kernel plan.

Each template writes the loops that give threads their elements (grid-stride loops, so
that any grid is correct and the result never depends on it) and asks the element
generators (`elemental.py`, `data_movement.py`) for the values. A kernel takes its output
pointers, then its input pointers, then (split reductions) a scratch pointer; sizes are
compile-time constants, since shapes are static.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfxla_lite.codegen.gpu import (  # noqa: F401  (generators)
    bit_ops,
    convolution,
    data_movement,
)
from tfxla_lite.codegen.gpu.cuda_source import Writer, compute_type, storage_type, to_storage
from tfxla_lite.codegen.gpu.elemental import Index, KernelContext, ModuleTables
from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.kernels import (
    ROWS_PER_WARP_BLOCK,
    WARP,
    kernel_body,
    split_scratch,
)
from tfxla_lite.codegen.gpu.row_vectors import (
    RowVector,
    emit_group_loads,
    emit_group_store,
    plan_row_vector,
    pointer_alignment,
    store_lanes,
)
from tfxla_lite.hlo.ir import Instruction

INT_INDEX_LIMIT = 1 << 30  # below this many elements, indices are 32-bit


def _index_type(plan: KernelPlan) -> str:
    computed = [i for m in plan.members for i in (
        m.fused_computation.instructions if m.opcode == "fusion" else [m])]
    sizes = [v.shape.num_elements for m in plan.members for v in [m, *m.operands, *computed]
             if not v.shape.is_tuple]
    return "int" if max(sizes, default=0) < INT_INDEX_LIMIT else "long long"


class KernelSource:
    """The text of one plan's kernels and how to call them."""

    def __init__(self, plan: KernelPlan, functions: list[str], text: str) -> None:
        self.plan = plan
        self.functions = functions  # kernel names, in launch order (split: partials first)
        self.text = text


def _signature(plan: KernelPlan, assignment: Any, scratch: bool = False,
               restrict_outputs: bool = True) -> tuple[list[str], dict[Any, str]]:
    """Kernel parameters and the pointer name of every entry value the kernel touches."""
    params: list[str] = []
    names: dict[Any, str] = {}
    outputs = plan.outputs
    inputs = plan.inputs
    out_slices = [assignment.slice_of(o, index) for o, index in outputs]
    in_slices = [assignment.slice_of(i) for i in inputs]
    for n, ((out, index), out_slice) in enumerate(zip(outputs, out_slices)):
        alone = restrict_outputs and not any(out_slice.may_overlap(s) for s in in_slices)
        restrict = " __restrict__" if alone else ""
        shape = out.shape.tuple_shapes[index[0]] if index else out.shape  # type: ignore[index]
        params.append(f"{storage_type(shape.element_type)}*{restrict} out{n}")
        names[(id(out), index)] = f"out{n}"
        if not index:
            names[id(out)] = f"out{n}"
    for n, (value, in_slice) in enumerate(zip(inputs, in_slices)):
        alone = not any(in_slice.may_overlap(s) for s in out_slices)
        qualifier = "const " if alone else ""
        restrict = " __restrict__" if alone else ""
        params.append(f"{qualifier}{storage_type(value.shape.element_type)}*{restrict} in{n}")
        names[id(value)] = f"in{n}"
    if scratch:
        params.append("void* __restrict__ scratch")
    return params, names


def _member_context(writer: Writer, member: Instruction, names: dict[Any, str],
                    index_type: str, tables: ModuleTables) -> KernelContext:
    """A context reading `member`'s operands (its fusion parameters) from their pointers."""
    if member.opcode == "fusion":
        params = member.fused_computation.parameters
        buffers = {id(p): names[id(o)] for p, o in zip(params, member.operands)}
    else:
        buffers = {id(o): names[id(o)] for o in member.operands}
    return KernelContext(writer, buffers, index_type, tables)


def _header(name: str, params: list[str], threads: int) -> str:
    return (f'extern "C" __global__ void __launch_bounds__({threads}) {name}(\n    '
            + ",\n    ".join(params) + ")")


# -- loop ----------------------------------------------------------------------------------

def _emit_loop(plan: KernelPlan, assignment: Any, tables: ModuleTables) -> KernelSource:
    (inst,) = plan.members
    root, _ = kernel_body(inst)
    idx = _index_type(plan)
    params, names = _signature(plan, assignment)
    texts = [_loop_function(plan.name, inst, root, params, names, idx, tables, 1)]
    functions = [plan.name]
    if plan.vectorized:
        texts.append(_loop_function(plan.name + "_v4", inst, root, params, names, idx, tables, 4))
        functions.append(plan.name + "_v4")
    return KernelSource(plan, functions, "\n".join(texts))


def _loop_function(name: str, inst: Instruction, root: Instruction, params: list[str],
                   names: dict[Any, str], idx: str, tables: ModuleTables, width: int) -> str:
    w = Writer()
    w.open(_header(name, params, 256))
    count = inst.shape.num_elements // width
    w.open(f"for ({idx} i = blockIdx.x * blockDim.x + threadIdx.x; i < {count}; "
           f"i += gridDim.x * blockDim.x)")
    ctx = _member_context(w, inst, names, idx, tables)
    element_type = inst.shape.element_type
    if width == 1:
        value = ctx.value(root, Index(inst.shape.dims, linear="i"))
        w.line(f"out0[i] = {to_storage(element_type, value)};")
    else:
        # float4 lanes: every array read is at the output's own linear index (a flat kernel).
        arrays = [(p, o) for p, o in _reads(inst) if o.shape.dims]
        vectors = {}
        for param, operand in arrays:
            if id(param) in vectors:  # read twice (add(x, x)): one load
                continue
            vector = w.fresh("q")
            w.line(f"const float4 {vector} = reinterpret_cast<const float4*>"
                   f"({names[id(operand)]})[i];")
            vectors[id(param)] = vector
        lanes = []
        for lane, component in enumerate("xyzw"):
            ctx.bound = {key: f"{vector}.{component}" for key, vector in vectors.items()}
            with ctx.scope():
                linear = f"(i * 4 + {lane})"  # inline: a flat kernel may never read it
                lanes.append(ctx.value(root, Index(inst.shape.dims, linear=linear)))
        w.line(f"reinterpret_cast<float4*>(out0)[i] = make_float4({', '.join(lanes)});")
    w.close()
    w.close()
    return w.text()


def _emit_dot_epilogue(plan: KernelPlan, assignment: Any,
                       tables: ModuleTables) -> KernelSource:
    """The epilogue of a kOutput fusion over the product cuBLAS left in scratch memory."""
    (inst,) = plan.members
    root, _ = kernel_body(inst)
    dot = plan.extra["dot"]
    idx = _index_type(plan)
    params, names = _signature(plan, assignment)
    params.append(f"const {storage_type(dot.shape.element_type)}* __restrict__ product")
    w = Writer()
    w.open(_header(plan.name, params, 256))
    w.open(f"for ({idx} i = blockIdx.x * blockDim.x + threadIdx.x; i < "
           f"{inst.shape.num_elements}; i += gridDim.x * blockDim.x)")
    ctx = _member_context(w, inst, names, idx, tables)
    ctx.buffers[id(dot)] = "product"
    value = ctx.value(root, Index(inst.shape.dims, linear="i"))
    w.line(f"out0[i] = {to_storage(inst.shape.element_type, value)};")
    w.close()
    w.close()
    return KernelSource(plan, [plan.name], w.text())


def _reads(inst: Instruction) -> list[tuple[Instruction, Instruction]]:
    """(the instruction a kernel body reads, the entry operand it stands for)."""
    if inst.opcode == "fusion":
        return list(zip(inst.fused_computation.parameters, inst.operands))
    return [(o, o) for o in inst.operands]


# -- reductions ----------------------------------------------------------------------------

def _parts(reduce: Instruction) -> tuple[list[Instruction], list[Instruction]]:
    """The inputs and the init values of a (variadic) reduce."""
    count = len(reduce.operands) // 2
    return list(reduce.operands[:count]), list(reduce.operands[count:])


def _split_by_reduce(names: list[str], reduces: list[Instruction]) -> list[list[str]]:
    """`names` (one per init value of every reduce of `reduces`, in order) grouped by
    reduce."""
    groups, start = [], 0
    for reduce in reduces:
        count = len(reduce.operands) // 2
        groups.append(names[start:start + count])
        start += count
    return groups


def _fold_into(ctx: KernelContext, reduce: Instruction, accumulators: list[str],
               values: list[str], has: str) -> None:
    """accumulators = has ? reducer(accumulators, values) : values."""
    w = ctx.writer
    reducer = reduce.called_computations[0]
    if len(accumulators) == 1:
        combined = ctx.fold(reduce, [accumulators[0], values[0]])
        w.line(f"{accumulators[0]} = {has} ? {combined} : {values[0]};")
        return
    w.open(f"if ({has})")
    with ctx.scope():
        results = ctx.apply_tuple(reducer, accumulators + values)
        for accumulator, result in zip(accumulators, results):
            w.line(f"{accumulator} = {result};")
    w.depth -= 1
    w.open("} else")
    for accumulator, value in zip(accumulators, values):
        w.line(f"{accumulator} = {value};")
    w.close()


def _with_init(ctx: KernelContext, reduce: Instruction, accumulators: list[str],
               has: str) -> list[str]:
    """The reduce's results: the init values folded with the accumulators (if any)."""
    _, inits = _parts(reduce)
    init_values = [ctx.value(i, Index.scalar()) for i in inits]
    reducer = reduce.called_computations[0]
    if len(accumulators) == 1:
        folded = ctx.reduced(reduce, ctx.fold(reduce, [init_values[0], accumulators[0]]))
        return [f"({has} ? {folded} : {init_values[0]})"]
    w = ctx.writer
    results = []
    for init, value in zip(inits, init_values):
        result = w.fresh("result")
        w.line(f"{compute_type(init.shape.element_type)} {result} = {value};")
        results.append(result)
    w.open(f"if ({has})")
    with ctx.scope():
        for result, value in zip(results, ctx.apply_tuple(reducer, init_values + accumulators)):
            w.line(f"{result} = {value};")
    w.close()
    return results


def _team_fold(ctx: KernelContext, reduce: Instruction,
               element: Callable[[str], str | list[str]], length: str, team: int, lane: str,
               idx: str) -> tuple[list[str], str]:
    """Fold `element(j)` (one value per reduce input) for j in [0, length) over a team of
    `team` threads (a warp, or a block of whole warps); lane 0 ends with (accumulators,
    has-any-element). `_team_fold_all` for one reduce."""
    def values(j: str) -> list[list[str]]:
        value = element(j)
        return [[value] if isinstance(value, str) else value]

    (accumulators,), has = _team_fold_all(ctx, [reduce], values, length, team, lane, idx)
    return accumulators, has


def _team_fold_all(ctx: KernelContext, reduces: list[Instruction],
                   element: Callable[[str], list[list[str]]], length: str, team: int,
                   lane: str, idx: str, vector: RowVector | None = None,
                   at: Callable[[str], list[list[str]]] | None = None,
                   row_start: str = "",
                   after_group: Callable[[str], None] | None = None
                   ) -> tuple[list[list[str]], str]:
    """Fold `element(j)` (for each reduce, one value per input) for j in [0, length) into
    every reduce at once, over a team of `team` threads (a warp, or a block of whole
    warps); lane 0 ends with (each reduce's accumulators, has-any-element). Values the
    reduces share (their producers) are computed once per element.

    Thread t folds j = t, t + team, ... in order; the threads' results combine in a fixed
    binary tree (warp shuffles, then shared memory across warps): deterministic, and for
    each reduce the same order as when it is folded alone. With `vector` (a row fold whose
    rows start at `row_start`; `at(linear)` gives the values at a linear index), thread t
    folds groups g = t, t + team, ... of `vector.group` consecutive elements instead, each
    group in order, its buffers read by vector loads (`row_vectors`), and
    `after_group(first)` called at the end of each group (the linear index of its first
    element: a multi-output fold stores its loop results there by vector).
    """
    w = ctx.writer
    inits = [i for reduce in reduces for i in _parts(reduce)[1]]
    types = [compute_type(i.shape.element_type) for i in inits]
    init_values = [ctx.value(i, Index.scalar()) for i in inits]
    accumulators = [w.fresh("acc") for _ in inits]
    for c_type, accumulator, init in zip(types, accumulators, init_values):
        w.line(f"{c_type} {accumulator} = {init};")
    groups = _split_by_reduce(accumulators, reduces)  # each reduce's accumulators
    has = w.fresh("has")
    w.line(f"bool {has} = false;")
    if vector is None:
        j = w.fresh("j")
        w.open(f"for ({idx} {j} = {lane}; {j} < {length}; {j} += {team})")
        with ctx.scope():
            values = element(j)
            for reduce, group, reduce_values in zip(reduces, groups, values):
                _fold_into(ctx, reduce, group, reduce_values, has)
            w.line(f"{has} = true;")
        w.close()
    else:
        assert at is not None
        g = w.fresh("g")
        w.open(f"for ({idx} {g} = {lane}; {g} < {int(length) // vector.group}; "
               f"{g} += {team})")
        with ctx.scope():
            first = ctx.bind(f"{row_start} + {g} * {vector.group}", idx, "first")
            for linear in emit_group_loads(ctx, vector, first):
                for reduce, group, reduce_values in zip(reduces, groups, at(linear)):
                    _fold_into(ctx, reduce, group, reduce_values, has)
                w.line(f"{has} = true;")
            if after_group is not None:
                after_group(first)
        w.close()

    def warp_tree() -> None:
        w.open("for (int offset = 16; offset > 0; offset >>= 1)")
        others = [w.fresh("other") for _ in accumulators]
        for c_type, other, accumulator in zip(types, others, accumulators):
            w.line(f"const {c_type} {other} = tl_shfl_down({accumulator}, offset);")
        other_has = w.fresh("other_has")
        w.line(f"const bool {other_has} = tl_shfl_down({has}, offset);")
        w.open(f"if ({other_has})")
        with ctx.scope():
            for reduce, group, values in zip(reduces, groups,
                                             _split_by_reduce(others, reduces)):
                _fold_into(ctx, reduce, group, values, has)
        w.line(f"{has} = true;")
        w.close()
        w.close()

    warp_tree()
    if team > WARP:
        shared = [w.fresh("shared_acc") for _ in accumulators]
        shared_has = w.fresh("shared_has")
        for c_type, array in zip(types, shared):
            w.line(f"__shared__ {c_type} {array}[32];")
        w.line(f"__shared__ bool {shared_has}[32];")
        w.open(f"if (({lane} & 31) == 0)")
        for array, accumulator in zip(shared, accumulators):
            w.line(f"{array}[{lane} >> 5] = {accumulator};")
        w.line(f"{shared_has}[{lane} >> 5] = {has};")
        w.close()
        w.line("__syncthreads();")
        w.open(f"if ({lane} < 32)")
        for array, accumulator, init in zip(shared, accumulators, init_values):
            w.line(f"{accumulator} = {lane} < {team // WARP} ? {array}[{lane}] : {init};")
        w.line(f"{has} = {lane} < {team // WARP} ? {shared_has}[{lane}] : false;")
        warp_tree()
        w.close()
        w.line("__syncthreads();  // the shared arrays serve the next row")
    return groups, has


def _row_loop(w: Writer, team: int, rows: int, idx: str) -> tuple[str, str]:
    """Open the grid-stride loop over rows; (row variable, lane variable)."""
    if team == WARP:
        w.line("const int lane = threadIdx.x;")
        w.open(f"for ({idx} row = blockIdx.x * {ROWS_PER_WARP_BLOCK} + threadIdx.y; "
               f"row < {rows}; row += gridDim.x * {ROWS_PER_WARP_BLOCK})")
    else:
        w.line("const int lane = threadIdx.x;")
        w.open(f"for ({idx} row = blockIdx.x; row < {rows}; row += gridDim.x)")
    return "row", "lane"


def _threads(plan: KernelPlan) -> int:
    assert plan.launch is not None
    return plan.launch.block[0] * plan.launch.block[1]


def _output_names(inst: Instruction, names: dict[Any, str]) -> list[str]:
    """The output pointers of a kernel computing `inst` (one per leaf of a tuple)."""
    if inst.shape.is_tuple:
        assert inst.shape.tuple_shapes is not None
        return [names[(id(inst), (n,))] for n in range(len(inst.shape.tuple_shapes))]
    return [names[id(inst)]]


def _emit_row_reduction(plan: KernelPlan, assignment: Any,
                        tables: ModuleTables) -> KernelSource:
    (inst,) = plan.members
    reduce, _ = kernel_body(inst)
    idx = _index_type(plan)
    params, names = _signature(plan, assignment)
    w = Writer()
    w.open(_header(plan.name, params, _threads(plan)))
    row, lane = _row_loop(w, plan.team, plan.rows, idx)
    ctx = _member_context(w, inst, names, idx, tables)
    ctx.aligned = pointer_alignment(plan, assignment, names)
    _fold_row_into(ctx, reduce, row, lane, plan.team, idx, _output_names(inst, names))
    w.close()
    w.close()
    return KernelSource(plan, [plan.name], w.text())


def _fold_row_into(ctx: KernelContext, reduce: Instruction, row: str, lane: str, team: int,
                   idx: str, outputs: list[str]) -> None:
    """Fold row `row` of `reduce` (a row reduction, maybe variadic) and let lane 0 store
    each result."""
    _fold_rows_into(ctx, [reduce], row, lane, team, idx, [outputs])


def store_values(ctx: KernelContext, stores: list[tuple[Instruction, str]],
                 index: Index, pending: list[list[str]] | None = None) -> None:
    """Compute every value of `stores` ((instruction, pointer) of one shape) at `index`,
    then store each at its linear index (a multi-output fusion's loop results, written
    from the reduction loop that reads that element); with `pending` (one list per store)
    append the storage values there instead, for `store_groups`. The values come first:
    an index given in one form keeps the cache key the fold's reads used."""
    values = [to_storage(inst.shape.element_type, ctx.value(inst, index))
              for inst, _ in stores]
    if pending is not None:
        for held, value in zip(pending, values):
            held.append(value)
        return
    linear = index.get_linear(ctx)
    for (_, pointer), value in zip(stores, values):
        ctx.writer.line(f"{pointer}[{linear}] = {value};")


def store_groups(ctx: KernelContext, stores: list[tuple[Instruction, str]],
                 pending: list[list[str]], first: str, vector: RowVector) -> None:
    """Store the values `store_values` held for a group of `vector.group` consecutive
    elements from linear index `first`: by 16-byte vectors where the type divides the
    group and the pointer's alignment allows (`row_vectors.emit_group_store`), else
    element by element; then forget them."""
    for (inst, pointer), values in zip(stores, pending):
        element_type = inst.shape.element_type
        lanes = store_lanes(vector, element_type)
        emit_group_store(ctx, pointer, element_type, values, first, lanes,
                         ctx.aligned.get(pointer) if lanes else None)
        values.clear()


def _fold_rows_into(ctx: KernelContext, reduces: list[Instruction], row: str, lane: str,
                    team: int, idx: str, outputs: list[list[str]],
                    stores: list[tuple[Instruction, str]] | None = None) -> None:
    """Fold row `row` of every reduce of `reduces` (row reductions of one input shape and
    row width) in one pass over the row, and let lane 0 store each result (`outputs`: a
    list of pointers per reduce); `stores`: values of the reduces' input shape computed
    and stored (`store_values`) at every element the fold reads."""
    width = _parts(reduces[0])[0][0].shape.num_elements // max(_kept_elements(reduces[0]), 1)

    inputs = [i for r in reduces for i in _parts(r)[0]]
    vector = plan_row_vector(ctx, inputs, width, ctx.aligned)
    # Loop results of a vector-read group are stored once the group is computed.
    pending = [[] for _ in stores or []] if vector is not None and stores else None

    def at(linear: str) -> list[list[str]]:
        values = [[ctx.value(i, Index(i.shape.dims, linear=linear)) for i in _parts(r)[0]]
                  for r in reduces]
        if stores:
            store_values(ctx, stores, Index(stores[0][0].shape.dims, linear=linear), pending)
        return values

    def element(j: str) -> list[list[str]]:
        return at(ctx.bind(f"{row} * {width} + {j}", idx, "lin"))

    def after_group(first: str) -> None:
        assert stores is not None and pending is not None and vector is not None
        store_groups(ctx, stores, pending, first, vector)

    groups, has = _team_fold_all(ctx, reduces, element, str(width), team, lane, idx, vector,
                                 at, f"{row} * {width}",
                                 after_group if pending is not None else None)
    ctx.writer.open(f"if ({lane} == 0)")
    with ctx.scope():
        for reduce, accumulators, pointers in zip(reduces, groups, outputs):
            results = _with_init(ctx, reduce, accumulators, has)
            for output, init, result in zip(pointers, _parts(reduce)[1], results):
                ctx.writer.line(f"{output}[{row}] = "
                                f"{to_storage(init.shape.element_type, result)};")
    ctx.writer.close()


def _kept_elements(reduce: Instruction) -> int:
    """Elements of each of a reduce's results (the kept dimensions)."""
    inputs, _ = _parts(reduce)
    reduced = set(reduce.dimensions)
    count = 1
    for d, size in enumerate(inputs[0].shape.dims):
        if d not in reduced:
            count *= size
    return count


def _emit_split_reduction(plan: KernelPlan, assignment: Any,
                          tables: ModuleTables) -> KernelSource:
    """A reduction to a few long rows (one row: a full reduction), maybe variadic, or
    sibling reductions of a multi-output fusion (`extra["siblings"]`, folded together):
    kernel 1 folds each chunk of a row into partials (one array per accumulator in
    scratch memory), kernel 2 folds each row's partials in chunk order, then the init
    values. The chunks are fixed by the row width alone, and every fold is in a fixed
    tree, so the bits do not depend on the grid (nor, for a sibling, on its siblings)."""
    (inst,) = plan.members
    reduces = plan.extra.get("siblings") or [kernel_body(inst)[0]]
    inits = [i for reduce in reduces for i in _parts(reduce)[1]]
    types = [compute_type(i.shape.element_type) for i in inits]
    offsets, _ = split_scratch(plan)
    idx = _index_type(plan)
    params, names = _signature(plan, assignment, scratch=True)
    team = plan.team

    def partial_arrays(w: Writer, qualifier: str) -> list[str]:
        arrays = []
        for n, (c_type, offset) in enumerate(zip(types, offsets)):
            w.line(f"{qualifier}{c_type}* partials{n} = reinterpret_cast<{qualifier}{c_type}*>"
                   f"(static_cast<{qualifier}char*>(scratch) + {offset});")
            arrays.append(f"partials{n}")
        return arrays

    # Kernel 1: partials[row * chunks + c] = the fold of chunk c of the row (never empty).
    w = Writer()
    w.open(_header(plan.name + "_partials", params, team))
    arrays = partial_arrays(w, "")
    w.line("const int lane = threadIdx.x;")
    units = plan.rows * plan.chunks
    w.open(f"for ({idx} unit = blockIdx.x; unit < {units}; unit += gridDim.x)")
    ctx = _member_context(w, inst, names, idx, tables)
    row = ctx.bind(f"unit / {plan.chunks}", idx, "row")
    offset = ctx.bind(f"(unit % {plan.chunks}) * ({idx}){plan.chunk}", idx, "offset")
    start = ctx.bind(f"{row} * ({idx}){plan.width} + {offset}", idx, "start")
    length = ctx.bind(f"min(({idx}){plan.chunk}, ({idx}){plan.width} - {offset})", idx,
                      "length")

    def element(j: str) -> list[list[str]]:
        linear = ctx.bind(f"{start} + {j}", idx, "lin")
        return [[ctx.value(i, Index(i.shape.dims, linear=linear)) for i in _parts(r)[0]]
                for r in reduces]

    folded, _ = _team_fold_all(ctx, reduces, element, length, team, "lane", idx)
    w.open("if (lane == 0)")
    for array, accumulator in zip(arrays, [a for group in folded for a in group]):
        w.line(f"{array}[unit] = {accumulator};")
    w.close()
    w.close()
    w.close()
    partials_text = w.text()

    # Kernel 2: a block per row folds its partials in the order of a fixed tree, then
    # the init values.
    w = Writer()
    w.open(_header(plan.name, params, team))
    arrays = partial_arrays(w, "const ")
    by_reduce = _split_by_reduce(arrays, reduces)
    w.line("const int lane = threadIdx.x;")
    w.open(f"for ({idx} row = blockIdx.x; row < {plan.rows}; row += gridDim.x)")
    ctx = _member_context(w, inst, names, idx, tables)
    folded, has = _team_fold_all(
        ctx, reduces,
        lambda j: [[f"{a}[row * {plan.chunks} + {j}]" for a in group] for group in by_reduce],
        str(plan.chunks), team, "lane", idx)
    w.open("if (lane == 0)")
    with ctx.scope():
        results = [result for reduce, group in zip(reduces, folded)
                   for result in _with_init(ctx, reduce, group, has)]
        for output, init, result in zip(_output_names(inst, names), inits, results):
            w.line(f"{output}[row] = {to_storage(init.shape.element_type, result)};")
    w.close()
    w.close()
    w.close()
    return KernelSource(plan, [plan.name + "_partials", plan.name], partials_text + "\n"
                        + w.text())


# -- row groups ----------------------------------------------------------------------------

def _emit_row_group(plan: KernelPlan, assignment: Any, tables: ModuleTables) -> KernelSource:
    """Members in order for each row, a team per row; a member reads earlier members' rows
    back from memory after the team synchronizes (written by the same team)."""
    idx = _index_type(plan)
    # Later members read what earlier ones wrote in this kernel: no `__restrict__`, so the
    # compiler neither reorders those accesses nor uses the non-coherent read-only cache.
    params, names = _signature(plan, assignment, restrict_outputs=False)
    w = Writer()
    w.open(_header(plan.name, params, _threads(plan)))
    row, lane = _row_loop(w, plan.team, plan.rows, idx)
    sync = "__syncwarp();" if plan.team == WARP else "__syncthreads();"
    aligned = pointer_alignment(plan, assignment, names)
    for member in plan.members:
        root, _ = kernel_body(member)
        w.line(f"// {member.name}")
        w.open("")
        ctx = _member_context(w, member, names, idx, tables)
        ctx.aligned = aligned
        output = names[id(member)]
        if root.opcode == "reduce":
            _fold_row_into(ctx, root, row, lane, plan.team, idx, [output])
        else:
            width = member.shape.num_elements // plan.rows
            j = w.fresh("j")
            w.open(f"for ({idx} {j} = {lane}; {j} < {width}; {j} += {plan.team})")
            linear = ctx.bind(f"{row} * {width} + {j}", idx, "lin")
            value = ctx.value(root, Index(member.shape.dims, linear=linear))
            w.line(f"{output}[{linear}] = {to_storage(member.shape.element_type, value)};")
            w.close()
        w.line(sync)
        w.close()
    w.close()
    w.close()
    return KernelSource(plan, [plan.name], w.text())


__all__ = ["TEMPLATES", "KernelSource", "store_groups", "store_values"]


def _emit_row_fusion(plan: KernelPlan, assignment: Any, tables: ModuleTables) -> KernelSource:
    """A kCustom row fusion (`tfxla_lite.passes.row_fusion`): per row, each reduce folds
    in order (earlier reduces' row values bound), its result shared through shared memory;
    then the root's elements of the row (a wide root) or its one value (a per-row root)."""
    (inst,) = plan.members
    row_plan = plan.extra["row_plan"]
    spec = row_plan.spec
    idx = _index_type(plan)
    params, names = _signature(plan, assignment)
    w = Writer()
    w.open(_header(plan.name, params, _threads(plan)))
    slots = ROWS_PER_WARP_BLOCK if plan.team == WARP else 1
    slot = "threadIdx.y" if plan.team == WARP else "0"
    sync = "__syncwarp();" if plan.team == WARP else "__syncthreads();"
    shared = []
    for number, reduce in enumerate(row_plan.reduces):
        name = f"row_value{number}"
        w.line(f"__shared__ {compute_type(reduce.shape.element_type)} {name}[{slots}];")
        shared.append(name)
    row, lane = _row_loop(w, plan.team, plan.rows, idx)
    ctx = _member_context(w, inst, names, idx, tables)
    ctx.aligned = pointer_alignment(plan, assignment, names)
    for reduce, name in zip(row_plan.reduces, shared):
        operand = reduce.operand(0)
        with ctx.scope():
            def at(linear: str, operand: Instruction = operand) -> list[list[str]]:
                return [[ctx.value(operand, Index(spec.dims, linear=linear))]]

            def element(j: str, at: Callable[[str], list[list[str]]] = at) -> list[list[str]]:
                return at(ctx.bind(f"{row} * {spec.width} + {j}", idx, "lin"))

            vector = plan_row_vector(ctx, [operand], spec.width, ctx.aligned)
            ((acc,),), has = _team_fold_all(ctx, [reduce], element, str(spec.width),
                                            plan.team, lane, idx, vector, at,
                                            f"{row} * {spec.width}")
            init = ctx.value(reduce.operand(1), Index.scalar())
            w.open(f"if ({lane} == 0)")
            w.line(f"{name}[{slot}] = {has} ? "
                   f"{ctx.reduced(reduce, ctx.fold(reduce, [init, acc]))} : {init};")
            w.close()
        w.line(sync)
        value = w.fresh("row_value")
        w.line(f"const {compute_type(reduce.shape.element_type)} {value} = {name}[{slot}];")
        w.line(f"{sync}  // every lane has read it before lane 0 writes the next row's")
        ctx.bound[id(reduce)] = value
    root = row_plan.root
    element_type = inst.shape.element_type
    vector = plan_row_vector(ctx, [root], spec.width, ctx.aligned) \
        if row_plan.classes.get(id(root)) == "wide" else None
    if lanes := store_lanes(vector, element_type):
        assert vector is not None
        # Groups of the reduces' width: 16-byte loads of the row, 16-byte stores.
        g = w.fresh("g")
        w.open(f"for ({idx} {g} = {lane}; {g} < {spec.width // vector.group}; "
               f"{g} += {plan.team})")
        with ctx.scope():
            first = ctx.bind(f"{row} * {spec.width} + {g} * {vector.group}", idx, "first")
            values = [to_storage(element_type, ctx.value(root, Index(spec.dims, linear=linear)))
                      for linear in emit_group_loads(ctx, vector, first)]
            emit_group_store(ctx, "out0", element_type, values, first, lanes,
                             ctx.aligned.get("out0"))
        w.close()
    elif row_plan.classes.get(id(root)) == "wide":
        j = w.fresh("j")
        w.open(f"for ({idx} {j} = {lane}; {j} < {spec.width}; {j} += {plan.team})")
        with ctx.scope():
            linear = ctx.bind(f"{row} * {spec.width} + {j}", idx, "lin")
            value = ctx.value(root, Index(spec.dims, linear=linear))
            w.line(f"out0[{linear}] = {to_storage(element_type, value)};")
        w.close()
    else:  # one value per row, at the row's linear index
        w.open(f"if ({lane} == 0)")
        with ctx.scope():
            value = ctx.value(root, Index(root.shape.dims, linear=row))
            w.line(f"out0[{row}] = {to_storage(element_type, value)};")
        w.close()
    w.close()
    w.close()
    return KernelSource(plan, [plan.name], w.text())


# The plan kinds whose template is here; compiler.py adds the ones in modules of their own.
TEMPLATES: dict[str, Callable[[KernelPlan, Any, ModuleTables], KernelSource]] = {
    "loop": _emit_loop, "row-reduction": _emit_row_reduction,
    "split-reduction": _emit_split_reduction, "row-group": _emit_row_group,
    "row-fusion": _emit_row_fusion, "dot-epilogue": _emit_dot_epilogue}
