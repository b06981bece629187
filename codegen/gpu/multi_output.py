"""The `multi-output` template: a multi-output fusion's reduce results, folded in
phases of sibling reduces over the same elements, then its other results in one loop
(the plan comes from `kernels.py`; the fold helpers are the row and column templates'
in `templates.py`)."""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.cuda_source import Writer, compute_type, to_storage
from tfxla_lite.codegen.gpu.elemental import Index, KernelContext, ModuleTables
from tfxla_lite.codegen.gpu.kernels import (
    COLUMN_TILE,
    WARP,
    KernelPlan,
    is_row_reduction,
    row_team,
)
from tfxla_lite.codegen.gpu.row_vectors import pointer_alignment
from tfxla_lite.codegen.gpu.templates import (
    KernelSource,
    _fold_rows_into,
    _header,
    _index_type,
    _member_context,
    _signature,
)
from tfxla_lite.hlo.ir import Instruction


def phase_groups(leaves: list[Instruction], reduces: list[int]) -> list[list[int]]:
    """The reduce results of a multi-output fusion that one phase folds together: reduces
    over one input shape with the same reduced dimensions (the iteration space
    `multi-output-fusion` requires of siblings), in order of their first result."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for n in reduces:
        reduce = leaves[n]
        key = (reduce.operand(0).shape.dims, tuple(sorted(reduce.dimensions)))
        groups.setdefault(key, []).append(n)
    return list(groups.values())


def emit_multi_output(plan: KernelPlan, assignment: Any,
                       tables: ModuleTables) -> KernelSource:
    """Two kernels (either may be absent): `<name>_reduce`, one phase per group of reduce
    results over the same elements (`phase_groups`), each a grid-stride loop of its own
    over 1-D blocks of 256 threads (warp teams, block teams or 32x8 column tiles carved
    out of `threadIdx.x`) folding the group's reduces in one pass, so that producers they
    share are computed once per element; then `<name>`, one loop computing every other
    result at an index before storing any of them."""
    (inst,) = plan.members
    leaves = list(inst.fused_computation.root.operands)  # type: ignore[union-attr]
    idx = _index_type(plan)
    params, names = _signature(plan, assignment)
    texts, functions = [], []
    if plan.extra["reduces"]:
        w = Writer()
        w.open(_header(plan.name + "_reduce", params, 256))
        for group in phase_groups(leaves, plan.extra["reduces"]):
            w.line("// " + ", ".join(f"result {n}: {leaves[n].name}" for n in group))
            w.open("")
            ctx = _member_context(w, inst, names, idx, tables)
            ctx.aligned = pointer_alignment(plan, assignment, names)
            _reduction_phase(ctx, [leaves[n] for n in group],
                             [names[(id(inst), (n,))] for n in group], idx)
            w.close()
        w.close()
        texts.append(w.text())
        functions.append(plan.name + "_reduce")
    if plan.extra["loops"]:
        dims = leaves[plan.extra["loops"][0]].shape.dims
        count = leaves[plan.extra["loops"][0]].shape.num_elements
        w = Writer()
        w.open(_header(plan.name, params, 256))
        w.open(f"for ({idx} i = blockIdx.x * blockDim.x + threadIdx.x; i < {count}; "
               f"i += gridDim.x * blockDim.x)")
        ctx = _member_context(w, inst, names, idx, tables)
        values = [(n, ctx.value(leaves[n], Index(dims, linear="i")))
                  for n in plan.extra["loops"]]
        for n, value in values:
            element_type = leaves[n].shape.element_type
            w.line(f"{names[(id(inst), (n,))]}[i] = {to_storage(element_type, value)};")
        w.close()
        w.close()
        texts.append(w.text())
        functions.append(plan.name)
    return KernelSource(plan, functions, "\n".join(texts))


def _reduction_phase(ctx: KernelContext, reduces: list[Instruction], outputs: list[str],
                     idx: str) -> None:
    """Reduce results of a multi-output kernel over the same elements (`phase_groups`),
    folded in one pass, in 1-D blocks of 256 threads; `outputs`: their pointers."""
    w = ctx.writer
    reduce = reduces[0]
    count_out = reduce.shape.num_elements
    operand = reduce.operand(0)
    if is_row_reduction(reduce) and count_out:
        width = operand.shape.num_elements // count_out
        team = row_team(width)
        if team == WARP:
            w.line("const int lane = threadIdx.x & 31;")
            w.open(f"for ({idx} row = blockIdx.x * 8 + (threadIdx.x >> 5); "
                   f"row < {count_out}; row += gridDim.x * 8)")
        else:
            team = 256  # the whole block
            w.line("const int lane = threadIdx.x;")
            w.open(f"for ({idx} row = blockIdx.x; row < {count_out}; row += gridDim.x)")
        with ctx.scope():
            _fold_rows_into(ctx, reduces, "row", "lane", team, idx, [[o] for o in outputs])
        w.close()
        return
    types = [compute_type(r.shape.element_type) for r in reduces]
    tile_x, tile_y = COLUMN_TILE
    reduced_dims = sorted(set(reduce.dimensions))
    reduced_sizes = tuple(operand.shape.dims[d] for d in reduced_dims)
    count = 1
    for size in reduced_sizes:
        count *= size
    w.line("const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;")
    shared_accs = [w.fresh("shared_acc") for _ in reduces]
    shared_has = w.fresh("shared_has")
    for ct, shared_acc in zip(types, shared_accs):
        w.line(f"__shared__ {ct} {shared_acc}[{tile_y}][{tile_x + 1}];")
    w.line(f"__shared__ bool {shared_has}[{tile_y}][{tile_x + 1}];")
    w.open(f"for ({idx} base = blockIdx.x * {tile_x}; base < {count_out}; "
           f"base += gridDim.x * {tile_x})")
    with ctx.scope():
        w.line(f"const {idx} o = base + tx;")
        inits = [ctx.value(r.operand(1), Index.scalar()) for r in reduces]
        accumulators = [f"acc{n}" for n in range(len(reduces))]
        for ct, accumulator, init in zip(types, accumulators, inits):
            w.line(f"{ct} {accumulator} = {init};")
        w.line("bool has = false;")
        w.open(f"if (o < {count_out})")
        with ctx.scope():
            kept = Index(reduce.shape.dims, linear="o").get_multi(ctx)
            w.open(f"for ({idx} k = ty; k < {count}; k += {tile_y})")
            with ctx.scope():
                reduced = iter(Index(reduced_sizes, linear="k").get_multi(ctx))
                kept_iter = iter(kept)
                multi = [next(reduced) if d in reduced_dims else next(kept_iter)
                         for d in range(operand.shape.rank)]
                values = [ctx.value(r.operand(0), Index(operand.shape.dims, multi))
                          for r in reduces]
                for r, accumulator, x in zip(reduces, accumulators, values):
                    w.line(f"{accumulator} = has ? {ctx.fold(r, [accumulator, x])} : {x};")
                w.line("has = true;")
            w.close()
        w.close()
        for shared_acc, accumulator in zip(shared_accs, accumulators):
            w.line(f"{shared_acc}[ty][tx] = {accumulator};")
        w.line(f"{shared_has}[ty][tx] = has;")
        w.line("__syncthreads();")
        w.open(f"if (ty == 0 && o < {count_out})")
        results = [f"result{n}" for n in range(len(reduces))]
        for ct, result, init in zip(types, results, inits):
            w.line(f"{ct} {result} = {init};")
        w.open(f"for (int s = 0; s < {tile_y}; ++s)")
        w.open(f"if ({shared_has}[s][tx])")
        for r, result, shared_acc in zip(reduces, results, shared_accs):
            w.line(f"{result} = {ctx.fold(r, [result, f'{shared_acc}[s][tx]'])};")
        w.close()
        w.close()
        for r, output, result in zip(reduces, outputs, results):
            w.line(f"{output}[o] = {to_storage(r.shape.element_type, result)};")
        w.close()
        w.line("__syncthreads();")
    w.close()


__all__ = ["emit_multi_output", "phase_groups"]
