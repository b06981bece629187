"""CPU kernels with several outputs: multi-output fusions and variadic reduces.

`compiler.emit_kernel` hands every entry instruction with a tuple result here. The
kernel takes one output pointer per leaf, then one per operand. A *loop* kernel (no
reduce among the leaves, all of one shape) computes every leaf at an index, then stores
them; a *reduction* kernel (reduces of one input shape, plus input-shaped leaves)
computes row reductions row by row, column reductions by rows (`column_reduction.py`)
and big full reductions in fixed chunks. Partitions never split one element's fold, so
results do not depend on the thread count. docs/architecture.md, section 4.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llvmlite import ir

from tfxla_lite.codegen.cpu import column_reduction, parallel, reduction, variadic_reduce
from tfxla_lite.codegen.cpu.emitter import (
    I64,
    PTR,
    ConstantPool,
    Index,
    KernelContext,
    i64,
    kernel_name,
    new_kernel_function,
    value_type,
)
from tfxla_lite.codegen.cpu.partition import (
    FLAT_ALIGN,
    SPLIT_CHUNK,
    SPLIT_MAX_CHUNKS,
    Partition,
)
from tfxla_lite.hlo.ir import Instruction, user_edges, widened_reduce_op
from tfxla_lite.hlo.opcodes import is_elementwise, is_flat
from tfxla_lite.hlo.shape import Shape


@dataclass(frozen=True)
class Leaf:
    """One output of a kernel: `producer`'s value (its field `field` when the producer
    is a variadic reduce, whose value is a struct), of `shape`."""

    producer: Instruction
    field: int | None
    shape: Shape


def kernel_leaves(inst: Instruction) -> list[Leaf]:
    """The outputs of entry instruction `inst`'s kernel, in the flat order of its shape."""
    root = inst.fused_computation.root if inst.opcode == "fusion" else inst
    assert root is not None
    elements = list(root.operands) if root.opcode == "tuple" else [root]
    result = []
    for element in elements:
        if element.opcode == "tuple":
            raise NotImplementedError(f"CPU backend: nested tuple %{element.name} in the "
                                      f"result of %{inst.name}")
        if element.shape.tuple_shapes is None:
            result.append(Leaf(element, None, element.shape))
        elif element.opcode == "reduce":
            result.extend(Leaf(element, n, s) for n, s in enumerate(element.shape.tuple_shapes))
        else:
            raise NotImplementedError(f"CPU backend: tuple-shaped {element.opcode} "
                                      f"%{element.name} in the result of %{inst.name}")
    reduces = _reduces(result)
    if reduces:
        dims = _input_dims(reduces[0])
        result = [_at_input_dims(leaf, dims) for leaf in result]
    return result


def _at_input_dims(leaf: Leaf, dims: tuple[int, ...]) -> Leaf:
    """A reduction kernel's leaf that reshapes a value of the reductions' input dims
    (the bias gradient's [16,64,256] stored as the [1024,256] a dot reads): that value,
    stored where the reshape puts it (row-major reshapes keep every element's linear
    position, and stores go by the linear index)."""
    producer = leaf.producer
    while producer.opcode in ("reshape", "bitcast") and producer.shape.dims != dims:
        producer = producer.operand(0)
    if producer is leaf.producer or producer.shape.dims != dims or \
            producer.shape.element_type != leaf.shape.element_type:
        return leaf
    return Leaf(producer, leaf.field, leaf.shape)


def _reduces(leaves: list[Leaf]) -> list[Instruction]:
    """The distinct reduces among the leaves' producers, in leaf order."""
    seen: dict[int, Instruction] = {}
    for leaf in leaves:
        if leaf.producer.opcode == "reduce":
            seen.setdefault(id(leaf.producer), leaf.producer)
    return list(seen.values())


def _input_dims(reduce: Instruction) -> tuple[int, ...]:
    return reduce.operand(0).shape.dims


def plan(inst: Instruction) -> Partition:
    """The partition of a multi-output kernel, checking that its leaves share one
    iteration space (see the module docstring)."""
    leaves = kernel_leaves(inst)
    reduces = _reduces(leaves)
    work = max([leaf.shape.num_elements for leaf in leaves]
               + [o.shape.num_elements for o in inst.operands if not o.shape.is_tuple])
    if not reduces:
        dims = leaves[0].shape.dims
        if any(leaf.shape.dims != dims for leaf in leaves):
            raise NotImplementedError(f"CPU backend: loop fusion %{inst.name} with outputs "
                                      f"of different dimensions ({inst.shape})")
        computed = inst.fused_computation.instructions if inst.opcode == "fusion" else [inst]
        if is_flat([c for c in computed if c.opcode != "tuple"]):
            return Partition("flat", leaves[0].shape.num_elements, work)
        return _dimension_partition(dims, work)
    first = reduces[0]
    for reduce in reduces[1:]:
        if _input_dims(reduce) != _input_dims(first) or \
                set(reduce.dimensions) != set(first.dimensions):
            raise NotImplementedError(f"CPU backend: reductions of %{inst.name} differ in "
                                      f"their input or reduced dimensions")
    extras = [leaf for leaf in leaves if leaf.producer.opcode != "reduce"]
    if any(leaf.producer.shape.dims != _input_dims(first) for leaf in extras):
        raise NotImplementedError(f"CPU backend: %{inst.name} mixes reductions with outputs "
                                  f"not of the reduction's input shape")
    output_dims = variadic_reduce.result_shapes(first)[0].dims
    input_size = first.operand(0).shape.num_elements
    if not output_dims and not extras and input_size >= parallel.PARALLEL_MIN_WORK:
        # A full reduction: fixed chunks (chosen as compiler.plan_partition does).
        chunks = min(SPLIT_MAX_CHUNKS, -(-input_size // SPLIT_CHUNK))
        chunk = -(-input_size // chunks)
        chunk = -(-chunk // FLAT_ALIGN) * FLAT_ALIGN
        return Partition("split", -(-input_size // chunk), work, chunk=chunk)
    if reduction.is_row_reduction(first):
        return _dimension_partition(output_dims, work)
    columns = column_reduction.plan(reduces)
    if columns is not None:
        return Partition("columns", columns.units, work, dim=-1, chunk=columns.chunks)
    dim = reduction.column_partition_dimension(first)
    if dim is None:
        return Partition("column", 1, work, dim=-1)
    return Partition("column", _input_dims(first)[dim], work, dim=dim)


def _dimension_partition(dims: tuple[int, ...], work: int) -> Partition:
    for dim, size in enumerate(dims):
        if size > 1:
            return Partition("dimension", size, work, dim=dim)
    return Partition("dimension", 1, work, dim=-1)


def _new_function(module: ir.Module, pool: ConstantPool, inst: Instruction, name: str,
                  noalias: list[bool], extra: list[ir.Type]
                  ) -> tuple[KernelContext, list[ir.Value]]:
    """`void name(out..., in..., *extra)` and a context reading the inputs; the outputs."""
    ctx, outputs, _ = new_kernel_function(module, pool, inst, name, len(noalias), extra)
    for n, (arg, flag) in enumerate(zip(outputs, noalias)):
        arg.name = f"output{n}"
        arg.attributes.add("captures(none)")
        if flag:
            arg.attributes.add("noalias")
    return ctx, outputs


def emit_kernel(module: ir.Module, pool: ConstantPool, inst: Instruction,
                noalias: list[bool], threads: int,
                in_place: Sequence[int | None] = ()) -> ir.Function:
    """The launcher of `inst`'s kernel, `void kernel(out..., in...)`: `noalias[k]` says
    whether output k overlaps no operand; `in_place[k]`, the operand whose very buffer
    output k is on every call (buffer assignment's reuse of a dying operand), read
    through the output pointer (which is then `noalias` in the range function): LLVM
    vectorizes that without a runtime alias check, where two pointers to one buffer fail
    the check and send every element down the scalar loop."""
    for operand in inst.operands:
        if operand.shape.is_tuple:
            raise NotImplementedError(f"CPU backend: tuple-shaped operand %{operand.name} "
                                      f"of %{inst.name}")
    leaves = kernel_leaves(inst)
    partition = plan(inst)
    reduce_leaves = [leaf for leaf in leaves if leaf.producer.opcode == "reduce"]
    split = partition.kind == "split"
    keys = partial_keys(leaves) if split else []
    columns = column_reduction.plan(_reduces(leaves)) if partition.kind == "columns" else None
    column_partials = len(_reduces(leaves)) if partition.has_partials and columns else 0
    extra = [PTR] * (len(keys) + column_partials) + [I64, I64]
    # An output that is an operand's buffer is that operand's only pointer here (its own
    # argument goes unread), so it overlaps nothing else the range function reads.
    own = [flag or (k < len(in_place) and in_place[k] is not None)
           for k, flag in enumerate(noalias)]
    ctx, outputs = _new_function(module, pool, inst, kernel_name(inst), own, extra)
    for output, operand in zip(outputs, in_place):
        if operand is not None:
            ctx.buffers[id(inst.fused_computation.parameters[operand]
                           if inst.opcode == "fusion" else inst.operand(operand))] = output
    begin, end = ctx.function.args[-2:]
    begin.name, end.name = "begin", "end"
    if split:
        partials = list(ctx.function.args[-2 - len(keys):-2])
        _emit_partials(ctx, leaves, partials, partition, begin, end)
    elif columns is not None:
        partials = list(ctx.function.args[-2 - column_partials:-2])
        targets = _column_targets(leaves, outputs, partials)
        extras = [column_reduction.Extra(leaf.producer, output, leaf.shape)
                  for leaf, output in zip(leaves, outputs) if leaf.producer.opcode != "reduce"]
        column_reduction.emit_units(ctx, columns, targets, extras, begin, end)
    elif not any(leaf.shape.num_elements for leaf in leaves):
        pass  # nothing to compute
    elif not reduce_leaves:
        _emit_loop(ctx, leaves, outputs, partition, begin, end)
    elif partition.kind == "column":
        _emit_column(ctx, leaves, outputs, partition, begin, end)
    else:
        _emit_rows(ctx, leaves, outputs, partition, begin, end)
    ctx.builder.ret_void()
    range_function = ctx.function

    launcher, outputs = _new_function(module, pool, inst, kernel_name(inst) + ".launch",
                                      noalias, [])
    inputs = list(launcher.function.args[len(outputs):])
    pointers = [*outputs, *inputs]
    slots = []
    if split:
        for _, _, shape in keys:
            slots.append(launcher.alloca(value_type(shape.element_type),
                                         name="partials", count=partition.total))
        pointers.extend(slots)
    if columns is not None and column_partials:
        for reduce in _reduces(leaves):
            element = value_type(reduction.Accumulation(launcher, reduce).element_type)
            slots.append(launcher.alloca(element, name="partials",
                                         count=columns.partial_count))
        pointers.extend(slots)
    if partition.work < parallel.PARALLEL_MIN_WORK:
        threads = 1
    parallel.emit_launch(launcher, range_function, pointers, partition.total, threads,
                         partition.align)
    if split:
        _combine_partials(launcher, leaves, outputs, slots, partition.total)
    elif columns is not None and column_partials:
        column_reduction.emit_combine(launcher, columns,
                                      _column_targets(leaves, outputs, slots))
    launcher.builder.ret_void()
    return launcher.function


def _column_targets(leaves: list[Leaf], outputs: list[ir.Value], partials: list[ir.Value]
                    ) -> list[column_reduction.Target]:
    """Each reduce with the outputs that hold it and its partials buffer (if any)."""
    reduces = _reduces(leaves)
    return [column_reduction.Target(
        reduce, [o for leaf, o in zip(leaves, outputs) if leaf.producer is reduce],
        partials[n] if partials else None) for n, reduce in enumerate(reduces)]


def _values(ctx: KernelContext, leaves: list[Leaf], index: Index) -> list[ir.Value]:
    """Every leaf's element at `index` (a variadic reduce's struct is computed once)."""
    values = []
    for leaf in leaves:
        value = ctx.value(leaf.producer, index)
        values.append(value if leaf.field is None else
                      ctx.builder.extract_value(value, leaf.field))
    return values


def _emit_loop(ctx: KernelContext, leaves: list[Leaf], outputs: list[ir.Value],
               partition: Partition, begin: ir.Value, end: ir.Value) -> None:
    """Loop kind: compute every leaf at an index, then store them all."""
    dims = leaves[0].shape.dims
    if partition.kind == "flat":
        with ctx.loop(end, name="i", start=begin) as linear:
            index = Index(dims, linear=linear)
            for leaf, output, value in zip(leaves, outputs, _values(ctx, leaves, index)):
                ctx.store(value, output, leaf.shape, index)
        return
    restrict = (partition.dim, begin, end) if partition.dim >= 0 else None
    with ctx.loop_nest(dims, name="i", restrict=restrict) as multi:
        index = Index(dims, multi, Index(dims, multi).get_linear(ctx.builder))
        for leaf, output, value in zip(leaves, outputs, _values(ctx, leaves, index)):
            ctx.store(value, output, leaf.shape, index)


def _split_leaves(leaves: list[Leaf], outputs: list[ir.Value]
                  ) -> tuple[list[tuple[Leaf, ir.Value]], list[tuple[Leaf, ir.Value]]]:
    pairs = list(zip(leaves, outputs))
    return ([p for p in pairs if p[0].producer.opcode == "reduce"],
            [p for p in pairs if p[0].producer.opcode != "reduce"])


def _emit_rows(ctx: KernelContext, leaves: list[Leaf], outputs: list[ir.Value],
               partition: Partition, begin: ir.Value, end: ir.Value) -> None:
    """Row reductions: each output index of the part computed whole. The row's
    input-shaped leaves are stored first, in a loop with no reduction in it (so it
    vectorizes); the reduces then fold the row with their own generators (vectorized
    partial sums for float rows), reading those leaves' values back from the row just
    stored (in the cache) rather than computing them again."""
    reduced_pairs, extra_pairs = _split_leaves(leaves, outputs)
    first = reduced_pairs[0][0].producer
    dims = reduced_pairs[0][0].shape.dims
    restrict = (partition.dim, begin, end) if partition.dim >= 0 else None
    reduced_dims = tuple(_input_dims(first)[d] for d in sorted(set(first.dimensions)))
    with ctx.loop_nest(dims, name="i", restrict=restrict) as multi:
        index = Index(dims, multi)
        if extra_pairs:
            with ctx.loop_nest(reduced_dims, name="row") as reduced:
                at = variadic_reduce.full_index(first, multi, reduced)
                extra_leaves = [leaf for leaf, _ in extra_pairs]
                for (leaf, output), value in zip(extra_pairs, _values(ctx, extra_leaves, at)):
                    ctx.store(value, output, leaf.shape, at)
        # Buffer assignment never lets a kernel with a reduce write in place, so the
        # stores above leave every input intact.
        saved = dict(ctx.buffers)
        ctx.buffers.update({id(leaf.producer): output for leaf, output in extra_pairs
                            if _read_in_its_row(leaf.producer)})
        leaves_here = [leaf for leaf, _ in reduced_pairs]
        for (leaf, output), value in zip(reduced_pairs, _values(ctx, leaves_here, index)):
            ctx.store(value, output, leaf.shape, index)
        ctx.buffers = saved


def _read_in_its_row(producer: Instruction) -> bool:
    """Whether the kernel's reduces read `producer` only at its own index, through
    elementwise ops (so a row's reduce reads only that row of it)."""
    def ends_walk(node: Instruction, user: Instruction) -> bool:
        if user.opcode == "tuple" and user.parent is not None and user is user.parent.root:
            return True
        if user.opcode != "reduce":
            return False
        # A reduce of it as an input reads its row; as an init value, anywhere: the walk
        # goes on to that reduce, which is not elementwise, and so fails.
        inputs, _ = variadic_reduce.reduce_inputs(user)
        return any(node is x for x in inputs) and all(node is not i for i in
                                                      user.operands[len(inputs):])

    return all(is_elementwise(user.opcode) and user.shape.dims == producer.shape.dims
               for _, user in user_edges([producer], ends_walk))


def _emit_column(ctx: KernelContext, leaves: list[Leaf], outputs: list[ir.Value],
                 partition: Partition, begin: ir.Value, end: ir.Value) -> None:
    """Column reductions: initialize the outputs of the part, then walk the input once
    in row-major order, folding every reduce into its outputs and storing the
    input-shaped leaves."""
    reduced_pairs, extra_pairs = _split_leaves(leaves, outputs)
    first = reduced_pairs[0][0].producer
    input_dims = _input_dims(first)
    reduced = set(first.dimensions)
    kept = [d for d in range(len(input_dims)) if d not in reduced]
    out_dims = reduced_pairs[0][0].shape.dims
    restrict = (partition.dim, begin, end) if partition.dim >= 0 else None
    out_restrict = None if restrict is None else (kept.index(restrict[0]), begin, end)
    targets_of: dict[tuple[int, int], list[ir.Value]] = {}
    for leaf, output in reduced_pairs:
        targets_of.setdefault((id(leaf.producer), leaf.field or 0), []).append(output)
    reduces = _reduces([leaf for leaf, _ in reduced_pairs])
    with ctx.loop_nest(out_dims, name="init", restrict=out_restrict) as multi:
        index = Index(out_dims, multi)
        for leaf, output in reduced_pairs:
            if widened_reduce_op(leaf.producer):
                # A 2-byte sum or product folds whole here, in f32 (`reduction.Accumulation`):
                # its 2-byte output cannot carry f32 partial results through the walk.
                ctx.store(ctx.value(leaf.producer, index), output, leaf.shape, index)
                continue
            _, inits = variadic_reduce.reduce_inputs(leaf.producer)
            init = inits[leaf.field or 0]
            ctx.store(ctx.value(init, Index.scalar()), output, leaf.shape, index)
    with ctx.loop_nest(input_dims, name="i", restrict=restrict) as multi:
        at = Index(input_dims, multi)
        out_index = Index(out_dims, [v for d, v in enumerate(multi) if d not in reduced])
        for reduce in reduces:
            if widened_reduce_op(reduce):
                continue  # folded in the init loop
            inputs, _ = variadic_reduce.reduce_inputs(reduce)
            shapes = variadic_reduce.result_shapes(reduce)
            targets = [targets_of.get((id(reduce), n)) for n in range(len(shapes))]
            if any(t is None for t in targets):
                raise NotImplementedError(f"CPU backend: a result of %{reduce.name} is not "
                                          "an output of its kernel")
            current = [ctx.load(t[0], s, out_index) for t, s in zip(targets, shapes)]
            elements = [ctx.value(x, at) for x in inputs]
            combined = variadic_reduce.apply_reducer(ctx, reduce.called_computations[0],
                                                     current, elements)
            for value, group, shape in zip(combined, targets, shapes):
                for target in group or ():
                    ctx.store(value, target, shape, out_index)
        extra_leaves = [leaf for leaf, _ in extra_pairs]
        for (leaf, output), value in zip(extra_pairs, _values(ctx, extra_leaves, at)):
            ctx.store(value, output, leaf.shape, at)


def _fold_chunk(ctx: KernelContext, reduce: Instruction, start: ir.Value, length: int
                ) -> list[ir.Value]:
    if reduce.shape.is_tuple:
        return variadic_reduce.fold_range(ctx, reduce, start, length)
    return [reduction.fold_range(ctx, reduce, start, length)]


def partial_keys(leaves: list[Leaf]) -> list[tuple[Instruction, int, Shape]]:
    """The results a split reduction keeps partials of: (reduce, field, shape), each once."""
    return [(reduce, n, shape) for reduce in _reduces(leaves)
            for n, shape in enumerate(variadic_reduce.result_shapes(reduce))]


def _emit_partials(ctx: KernelContext, leaves: list[Leaf], partials: list[ir.Value],
                   partition: Partition, begin: ir.Value, end: ir.Value) -> None:
    """partials_k[c] = the fold of chunk c for result k (`partial_keys`), for the chunks
    c in [begin, end)."""
    b = ctx.builder
    reduces = _reduces(leaves)
    keys = partial_keys(leaves)
    size = reduces[0].operand(0).shape.num_elements
    last = size - (partition.total - 1) * partition.chunk

    def store_folds(start: ir.Value, chunk: ir.Value, length: int) -> None:
        values = [v for reduce in reduces for v in _fold_chunk(ctx, reduce, start, length)]
        for value, target, (_, _, shape) in zip(values, partials, keys):
            element = value_type(shape.element_type)
            b.store(value, b.gep(target, [chunk], inbounds=True, source_etype=element))

    with ctx.loop(end, name="chunk", start=begin) as chunk:
        start = b.mul(chunk, i64(partition.chunk), flags=["nuw", "nsw"])
        if last == partition.chunk:
            store_folds(start, chunk, last)
        else:
            is_last = b.icmp_signed("==", chunk, i64(partition.total - 1))
            with b.if_else(is_last) as (then, otherwise):
                with then, ctx.scope():
                    store_folds(start, chunk, last)
                with otherwise, ctx.scope():
                    store_folds(start, chunk, partition.chunk)


def _combine_partials(ctx: KernelContext, leaves: list[Leaf], outputs: list[ir.Value],
                      partials: list[ir.Value], count: int) -> None:
    """Each result = its init folded with its partials 0, 1, ... in order; stored to
    every output leaf that holds it."""
    b = ctx.builder
    result: dict[tuple[int, int], ir.Value] = {}
    keys = partial_keys(leaves)
    position = 0
    for reduce in _reduces(leaves):
        _, inits = variadic_reduce.reduce_inputs(reduce)
        shapes = variadic_reduce.result_shapes(reduce)
        mine = list(range(position, position + len(shapes)))
        position += len(shapes)
        slots = [ctx.alloca(value_type(s.element_type), name="accumulator") for s in shapes]
        for slot, init in zip(slots, inits):
            b.store(ctx.value(init, Index.scalar()), slot)
        with ctx.loop(count, name="combine") as chunk:
            parts = [b.load(b.gep(partials[k], [chunk], inbounds=True,
                                  source_etype=value_type(s.element_type)),
                            typ=value_type(s.element_type)) for k, s in zip(mine, shapes)]
            combined = variadic_reduce.apply_reducer(ctx, reduce.called_computations[0],
                                                     [b.load(s) for s in slots], parts)
            for slot, value in zip(slots, combined):
                b.store(value, slot)
        for n, slot in enumerate(slots):
            result[(id(reduce), n)] = b.load(slot)
    assert position == len(keys)
    for leaf, output in zip(leaves, outputs):
        value = result[(id(leaf.producer), leaf.field or 0)]
        ctx.store(value, output, leaf.shape, Index(leaf.shape.dims, linear=i64(0)))
