"""The `multi-output` template: a multi-output fusion's reduce results, folded in
phases of sibling reduces over the same elements, each phase also storing the loop
results of its input shape at every index it folds (as XLA's reduction emitter writes
a multi-output fusion's elementwise roots from the reduction loop); the loop results
no phase can take in a second loop kernel (the plan, and why a result stays apart,
come from `kernels.plan_multi_output`; the fold helpers are the row and column
templates' in `templates.py` and `columns.py`)."""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.columns import fold_columns
from tfxla_lite.codegen.gpu.cuda_source import Writer, to_storage
from tfxla_lite.codegen.gpu.elemental import Index, KernelContext, ModuleTables
from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.kernels import (
    WARP,
    is_row_reduction,
    phase_groups,
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


def emit_multi_output(plan: KernelPlan, assignment: Any,
                       tables: ModuleTables) -> KernelSource:
    """Two kernels (either may be absent): `<name>_reduce`, one phase per group of reduce
    results over the same elements (`phase_groups`), each a grid-stride loop of its own
    over 1-D blocks of 256 threads (warp teams, block teams or 32x8 column tiles carved
    out of `threadIdx.x`) folding the group's reduces in one pass, so that producers they
    share are computed once per element, and storing the loop results the plan gives the
    phase (`extra["phase_loops"]`) at each element it reads; then `<name>`, one loop
    computing every other loop result (`extra["loops"]`) at an index before storing any
    of them."""
    (inst,) = plan.members
    leaves = list(inst.fused_computation.root.operands)  # type: ignore[union-attr]
    idx = _index_type(plan)
    params, names = _signature(plan, assignment)
    texts, functions = [], []
    if plan.extra["reduces"]:
        w = Writer()
        w.open(_header(plan.name + "_reduce", params, 256))
        aligned = pointer_alignment(plan, assignment, names)
        for group in phase_groups(leaves, plan.extra["reduces"]):
            w.line("// " + ", ".join(f"result {n}: {leaves[n].name}" for n in group))
            w.open("")
            ctx = _member_context(w, inst, names, idx, tables)
            ctx.aligned = aligned
            stores = [(leaves[n], names[(id(inst), (n,))])
                      for n in plan.extra["phase_loops"].get(group[0], [])]
            _reduction_phase(ctx, [leaves[n] for n in group],
                             [names[(id(inst), (n,))] for n in group], idx, stores,
                             plan.extra["column_groups"][group[0]])
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
                     idx: str, stores: list[tuple[Instruction, str]],
                     column_group: int) -> None:
    """Reduce results of a multi-output kernel over the same elements (`phase_groups`),
    folded in one pass, in 1-D blocks of 256 threads; `outputs`: their pointers;
    `stores`: loop results of the reduces' input shape (and pointers) computed and stored
    at each element the phase reads (each is read by exactly one thread);
    `column_group`: outputs per thread of a column phase (`kernels.column_group`)."""
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
            _fold_rows_into(ctx, reduces, "row", "lane", team, idx, [[o] for o in outputs],
                            stores)
        w.close()
        return
    w.line("const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;")
    fold_columns(ctx, reduces, [[o] for o in outputs], idx, "tx", "ty", column_group, stores)


__all__ = ["emit_multi_output", "phase_groups"]
