"""The `transpose` template: a transpose that moves the minor dimension, tiled through
shared memory (the plan comes from `kernels.transpose_tiling`).

XLA's GPU backend does the same (its transpose emitter): a loop kernel moving such a
transpose reads or writes memory with a stride, one 32-byte sector per element for a
warp, where a tile read along the input's minor dimension and written along the
output's moves whole sectors both ways. Fused elementwise producers run on the tile's
input side, consumers on its output side.
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.cuda_source import Writer, compute_type, to_storage
from tfxla_lite.codegen.gpu.elemental import Index, ModuleTables
from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.kernels import (
    TRANSPOSE_BLOCK,
    TRANSPOSE_TILE,
    ceil_div,
    kernel_body,
)
from tfxla_lite.codegen.gpu.templates import (
    KernelSource,
    _header,
    _index_type,
    _member_context,
    _signature,
)


def emit_transpose(plan: KernelPlan, assignment: Any, tables: ModuleTables) -> KernelSource:
    """A tiled transpose (`kernels.transpose_tiling`): per 32x32 tile of the heroes'
    operands seen as [A, B, C], the 32x8 threads compute the operands' elements (fused
    producers included) at consecutive c, 4 rows each, into shared memory; after the
    barrier, they compute the root at consecutive b of the output [A, C, B], each hero's
    element read from its tile's column. A tile row has 33 slots, so that the 32 elements
    of a column lie in 32 different banks."""
    (inst,) = plan.members
    root, _ = kernel_body(inst)
    tiling = plan.extra["tiling"]
    a_size, b_size, c_size = tiling.shape
    tiles_b, tiles_c = ceil_div(b_size, TRANSPOSE_TILE), ceil_div(c_size, TRANSPOSE_TILE)
    assert plan.launch is not None
    idx = _index_type(plan)
    params, names = _signature(plan, assignment)
    w = Writer()
    w.open(_header(plan.name, params, TRANSPOSE_BLOCK[0] * TRANSPOSE_BLOCK[1]))
    tiles = [f"tile{n}" for n in range(len(tiling.heroes))]
    for hero, tile in zip(tiling.heroes, tiles):
        w.line(f"__shared__ {compute_type(hero.shape.element_type)} "
               f"{tile}[{TRANSPOSE_TILE}][{TRANSPOSE_TILE + 1}];")
    w.open(f"for ({idx} t = blockIdx.x; t < {plan.launch.units}; t += gridDim.x)")
    w.line(f"const {idx} a = t / {tiles_b * tiles_c};")
    w.line(f"const {idx} b0 = t / {tiles_c} % {tiles_b} * {TRANSPOSE_TILE};")
    w.line(f"const {idx} c0 = t % {tiles_c} * {TRANSPOSE_TILE};")
    ctx = _member_context(w, inst, names, idx, tables)
    rows = f"for (int k = threadIdx.y; k < {TRANSPOSE_TILE}; k += {TRANSPOSE_BLOCK[1]})"
    w.line(f"const {idx} c = c0 + threadIdx.x;")
    w.open(rows)
    w.line(f"const {idx} b = b0 + k;")
    w.open(f"if (b < {b_size} && c < {c_size})")
    with ctx.scope():
        linear = ctx.bind(f"(a * {b_size} + b) * {c_size} + c", idx, "lin")
        for hero, tile in zip(tiling.heroes, tiles):
            operand = hero.operand(0)
            value = ctx.value(operand, Index(operand.shape.dims, linear=linear))
            w.line(f"{tile}[k][threadIdx.x] = {value};")
    w.close()
    w.close()
    w.line("__syncthreads();")
    w.line(f"const {idx} ob = b0 + threadIdx.x;")
    w.open(rows)
    w.line(f"const {idx} oc = c0 + k;")
    w.open(f"if (ob < {b_size} && oc < {c_size})")
    with ctx.scope():
        for hero, tile in zip(tiling.heroes, tiles):
            ctx.bound[id(hero)] = f"{tile}[threadIdx.x][k]"
        linear = ctx.bind(f"(a * {c_size} + oc) * {b_size} + ob", idx, "lin")
        value = ctx.value(root, Index(root.shape.dims, linear=linear))
        w.line(f"out0[{linear}] = {to_storage(inst.shape.element_type, value)};")
        for hero in tiling.heroes:
            del ctx.bound[id(hero)]
    w.close()
    w.close()
    w.line("__syncthreads();  // the tiles serve the block's next tile")
    w.close()
    w.close()
    return KernelSource(plan, [plan.name], w.text())


__all__ = ["emit_transpose"]
