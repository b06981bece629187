"""The `column-reduction` template, and the column fold it shares with the column phases
of multi-output kernels (`multi_output.py`): 32·G outputs a tile, G consecutive outputs a
thread read by 16-byte vector loads where the kept minor dimension allows
(`kernels.column_group`), 8 slices of the reduced elements an output combined in shared
memory in a fixed order (the plan comes from `kernels.py`; the fold helpers are
`templates.py`'s)."""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.cuda_source import Writer, compute_type, to_storage
from tfxla_lite.codegen.gpu.elemental import Index, KernelContext, ModuleTables
from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.kernels import COLUMN_TILE, kernel_body
from tfxla_lite.codegen.gpu.row_vectors import (
    emit_group_loads,
    plan_row_vector,
    pointer_alignment,
)
from tfxla_lite.codegen.gpu.templates import (
    KernelSource,
    _fold_into,
    _header,
    _index_type,
    _member_context,
    _output_names,
    _parts,
    _signature,
    _split_by_reduce,
    store_groups,
    store_values,
)
from tfxla_lite.hlo.ir import Instruction


def emit_column_reduction(plan: KernelPlan, assignment: Any,
                           tables: ModuleTables) -> KernelSource:
    """Any reduce (maybe variadic): 32 x G outputs per block (`fold_columns`)."""
    (inst,) = plan.members
    reduce, _ = kernel_body(inst)
    idx = _index_type(plan)
    params, names = _signature(plan, assignment)
    w = Writer()
    w.open(_header(plan.name, params, COLUMN_TILE[0] * COLUMN_TILE[1]))
    ctx = _member_context(w, inst, names, idx, tables)
    ctx.aligned = pointer_alignment(plan, assignment, names)
    fold_columns(ctx, [reduce], [_output_names(inst, names)], idx, "threadIdx.x",
                 "threadIdx.y", plan.extra["group"])
    w.close()
    return KernelSource(plan, [plan.name], w.text())


def fold_columns(ctx: KernelContext, reduces: list[Instruction], outputs: list[list[str]],
                 idx: str, tx: str, ty: str, group: int,
                 stores: list[tuple[Instruction, str]] | None = None) -> None:
    """Fold `reduces` (one input shape and reduced dimensions, maybe variadic; `outputs`:
    each one's pointers) in tiles of 32 x `group` outputs, a grid-stride loop over tiles:
    thread (tx, ty) of the 32x8 threads folds outputs o … o + group − 1 (o = base +
    group·tx) over the reduced elements k = ty, ty + 8, …, and the 8 slices of each output
    combine in shared memory in order. With `group` > 1 (`kernels.column_group`) the
    thread's outputs are `group` consecutive elements of each reduced row, read by one
    16-byte load per 16 bytes of every buffer the inputs read at their own index
    (`row_vectors`); each output's fold order is the same whatever `group` is, so are the
    bits. `stores`: loop results of the input shape stored at each element read."""
    w = ctx.writer
    reduce = reduces[0]
    operand = _parts(reduce)[0][0]
    dims = operand.shape.dims
    reduced_dims = sorted(set(reduce.dimensions))
    kept_dims = tuple(size for d, size in enumerate(dims) if d not in reduced_dims)
    reduced_sizes = tuple(dims[d] for d in reduced_dims)
    count = outputs_count = 1
    for size in reduced_sizes:
        count *= size
    for size in kept_dims:
        outputs_count *= size
    tile_x, tile_y = COLUMN_TILE
    span = tile_x * group
    parts = [_parts(r) for r in reduces]
    inits = [i for _, reduce_inits in parts for i in reduce_inits]
    types = [compute_type(i.shape.element_type) for i in inits]
    vector = None
    if group > 1:
        vector = plan_row_vector(ctx, [i for inputs, _ in parts for i in inputs], dims[-1],
                                 ctx.aligned)
        assert vector is not None and vector.group == group, "kernels.column_group disagrees"
    shared = [w.fresh("shared_acc") for _ in inits]
    shared_has = w.fresh("shared_has")
    for c_type, array in zip(types, shared):
        w.line(f"__shared__ {c_type} {array}[{tile_y}][{span + 1}];")
    w.line(f"__shared__ bool {shared_has}[{tile_y}][{tile_x + 1}];")
    w.open(f"for ({idx} base = blockIdx.x * {span}; base < {outputs_count}; "
           f"base += gridDim.x * {span})")
    with ctx.scope():
        w.line(f"const {idx} o = base + {tx}{f' * {group}' if group > 1 else ''};")
        init_values = [ctx.value(i, Index.scalar()) for i in inits]
        lanes = []  # per output of the thread: per reduce, its accumulators
        for _ in range(group):
            accumulators = [w.fresh("acc") for _ in inits]
            for c_type, accumulator, init in zip(types, accumulators, init_values):
                w.line(f"{c_type} {accumulator} = {init};")
            lanes.append(_split_by_reduce(accumulators, reduces))
        w.line("bool has = false;")
        w.open(f"if (o < {outputs_count})")
        with ctx.scope():
            kept = Index(kept_dims, linear="o").get_multi(ctx)
            w.open(f"for ({idx} k = {ty}; k < {count}; k += {tile_y})")
            with ctx.scope():
                reduced = iter(Index(reduced_sizes, linear="k").get_multi(ctx))
                kept_iter = iter(kept)
                multi = [next(reduced) if d in reduced_dims else next(kept_iter)
                         for d in range(len(dims))]
                pending = None
                if vector is None:
                    indices = [Index(dims, multi)]
                else:
                    first = ctx.bind(Index(dims, multi).get_linear(ctx), idx, "first")
                    indices = [Index(dims, linear=linear)
                               for linear in emit_group_loads(ctx, vector, first)]
                    pending = [[] for _ in stores or []]
                for index, lane in zip(indices, lanes):
                    values = [[ctx.value(i, index) for i in inputs] for inputs, _ in parts]
                    if stores:
                        store_values(ctx, stores, index, pending)
                    for r, accumulators, reduce_values in zip(reduces, lane, values):
                        _fold_into(ctx, r, accumulators, reduce_values, "has")
                if stores and vector is not None and pending is not None:
                    store_groups(ctx, stores, pending, first, vector)
                w.line("has = true;")
            w.close()
        w.close()
        # Output e of thread tx sits at column 32·e + tx: consecutive threads, consecutive
        # banks (tx·G + e would be a G-way bank conflict).
        for e, lane in enumerate(lanes):
            column = f"{e * tile_x} + {tx}" if e else tx
            for array, accumulator in zip(shared, [a for accs in lane for a in accs]):
                w.line(f"{array}[{ty}][{column}] = {accumulator};")
        w.line(f"{shared_has}[{ty}][{tx}] = has;")
        w.line("__syncthreads();")
        w.open(f"if ({ty} == 0 && o < {outputs_count})")
        with ctx.scope():
            for e in range(group):
                column = f"{e * tile_x} + {tx}" if e else tx
                results = [w.fresh("result") for _ in inits]
                for c_type, result, init in zip(types, results, init_values):
                    w.line(f"{c_type} {result} = {init};")
                w.open(f"for (int s = 0; s < {tile_y}; ++s)")
                w.open(f"if ({shared_has}[s][{tx}])")
                with ctx.scope():
                    partials = _split_by_reduce([f"{a}[s][{column}]" for a in shared], reduces)
                    for r, accumulators, values in zip(
                            reduces, _split_by_reduce(results, reduces), partials):
                        _fold_into(ctx, r, accumulators, values, "true")
                w.close()
                w.close()
                at = "o" if e == 0 else f"o + {e}"
                for pointers, init_list, accumulators in zip(
                        outputs, [i for _, i in parts], _split_by_reduce(results, reduces)):
                    for pointer, init, result in zip(pointers, init_list, accumulators):
                        w.line(f"{pointer}[{at}] = {to_storage(init.shape.element_type, result)};")
        w.close()
        w.line("__syncthreads();")
    w.close()


__all__ = ["emit_column_reduction", "fold_columns"]
