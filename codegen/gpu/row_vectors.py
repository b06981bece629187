"""16-byte vector loads of the rows that row kernels fold (row reductions, row fusions, and
the row phases of row groups and multi-output kernels), and 16-byte stores of a row
fusion's wide output stage.

Where a row of W elements is folded by a team, thread t normally folds elements t,
t + team, ... Where the fold reads a buffer of f32, f16 or bf16 at the row element's own
linear index (the reduce's input is that buffer, or is computed from it only through
elementwise ops, converts and reshapes), each thread instead folds *groups* of G
consecutive elements: group g = t, t + team, ... covers elements G·g … G·g + G − 1,
folded in that order. G is 16 bytes over the narrowest such buffer's element size (4
for f32, 8 for f16/bf16) and W must be a multiple of G; otherwise the order stays the
element-per-step one. Each such buffer is then read with one 16-byte load per 16 bytes
of a group (`tl_load_vector`, an aligned `tl_vector<T, N>`: `ld.global.v4`), the
producers computed per element from the loaded lanes.

The order is fixed by the shapes and element types alone, not by alignment: a buffer
whose alignment cannot be shown is read element by element in the same grouped order,
so the bits are the same either way. The 16-byte alignment of a group's first element
(`row·W + G·g`, a multiple of G) follows from its buffer's start:

- a temp: the arena starts 256-byte aligned (CuPy's pool; `fake_cupy` alike) and buffer
  assignment's offset is known, so offset % 16 == 0 is checked here, and a misaligned
  temp gets no vector load at all;
- an output, or a constant of the entry: CuPy allocations (`cupy.empty`,
  `cupy.asarray`), 256-byte aligned;
- a parameter: the caller's array, whose start the executable's input checks do not
  constrain (as the flat f32 loop kernels, which choose their `_v4` variant from the
  pointers at launch), so the kernel tests the pointer at run time and falls back to
  element loads.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from tfxla_lite.codegen.gpu.cuda_source import load, storage_type
from tfxla_lite.codegen.gpu.elemental import KernelContext
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.opcodes import is_elementwise

VECTOR_BYTES = 16
VECTOR_TYPES = {"f32": 4, "f16": 2, "bf16": 2}  # element types read by vector, their sizes
ARENA_ALIGNMENT = 256  # CuPy's memory pool; buffer offsets are relative to it


@dataclass(frozen=True)
class RowVector:
    """How a row fold reads its rows: `group` consecutive elements per thread and step,
    and the buffers read with vector loads (fusion parameter, pointer, and the C
    condition under which its pointer is aligned, "" where it is proven)."""

    group: int
    loads: tuple[tuple[Instruction, str, str], ...]


def pointer_alignment(plan: Any, assignment: Any, names: dict[Any, str]) -> dict[str, str]:
    """For each pointer of a kernel (`names`: `templates._signature`'s), the condition
    under which its start is 16-byte aligned: "" where buffer assignment proves it, a run
    time test for a parameter; pointers known to be misaligned are left out."""
    aligned: dict[str, str] = {}
    values = [(o, index) for o, index in plan.outputs] + [(i, ()) for i in plan.inputs]
    for value, index in values:
        pointer = names.get((id(value), index)) if index else names.get(id(value))
        if pointer is None:
            continue
        buffer = assignment.slice_of(value, index)
        if buffer.kind == "parameter":
            aligned[pointer] = (f"(reinterpret_cast<unsigned long long>({pointer}) & "
                                f"{VECTOR_BYTES - 1}) == 0")
        elif buffer.kind in ("output", "constant") or (
                buffer.kind == "temp" and buffer.offset % VECTOR_BYTES == 0):
            aligned[pointer] = ""
    return aligned


def read_at_own_index(inputs: list[Instruction], buffers: Container[int],
                      bound: Container[int] = ()) -> list[Instruction]:
    """The vector-typed arrays among a kernel's `buffers` (ids) that `inputs` read at their
    own linear index: reached through elementwise ops, reshapes and bitcasts of the same
    element count, not through values already `bound` (ids). Shared by the fold's emitter
    (`plan_row_vector`) and the column plan (`kernels.column_group`)."""
    count = inputs[0].shape.num_elements
    found: list[Instruction] = []
    seen: set[int] = set()
    stack = list(inputs)
    while stack:
        node = stack.pop()
        if id(node) in seen or node.shape.is_tuple or node.shape.num_elements != count:
            continue
        seen.add(id(node))
        if id(node) in bound:
            continue
        if id(node) in buffers:
            if node.shape.element_type in VECTOR_TYPES and node.shape.dims:
                found.append(node)
            continue
        if is_elementwise(node.opcode) or node.opcode in ("reshape", "bitcast"):
            stack.extend(node.operands)
    return found


def plan_row_vector(ctx: KernelContext, inputs: list[Instruction], width: int,
                    aligned: dict[str, str]) -> RowVector | None:
    """The grouped order and vector loads of a fold of rows of `width` elements of
    `inputs` (the reduces' inputs), or None for the element-per-step order."""
    buffers = sorted(read_at_own_index(inputs, ctx.buffers, ctx.bound),
                     key=lambda n: ctx.buffers[id(n)])
    if not buffers:
        return None
    group = VECTOR_BYTES // min(VECTOR_TYPES[b.shape.element_type] for b in buffers)
    if width % group:
        return None
    loads = tuple((b, ctx.buffers[id(b)], aligned[ctx.buffers[id(b)]]) for b in buffers
                  if ctx.buffers[id(b)] in aligned)
    return RowVector(group, loads)


def emit_group_loads(ctx: KernelContext, vector: RowVector, first: str) -> list[str]:
    """Load the group of elements starting at linear index `first` (a variable) of every
    vector-read buffer, make each lane the known value of its buffer at its index, and
    return the group's linear indices."""
    w = ctx.writer
    linears = [first] + [f"({first} + {k})" for k in range(1, vector.group)]
    for buffer, pointer, condition in vector.loads:
        element_type = buffer.shape.element_type
        lanes = VECTOR_BYTES // VECTOR_TYPES[element_type]
        c_type = f"tl_vector<{storage_type(element_type)}, {lanes}>"
        names = [w.fresh("vec") for _ in range(vector.group // lanes)]
        for part, name in enumerate(names):
            start = first if part == 0 else f"{first} + {part * lanes}"
            if not condition:
                w.line(f"const {c_type} {name} = tl_load_vector<{lanes}>({pointer} + {start});")
                continue
            w.line(f"{c_type} {name};")
            w.open(f"if ({condition})")
            w.line(f"{name} = tl_load_vector<{lanes}>({pointer} + {start});")
            w.depth -= 1
            w.open("} else")
            w.line(f"for (int e = 0; e < {lanes}; ++e) {name}.v[e] = {pointer}[{start} + e];")
            w.close()
        for k, linear in enumerate(linears):
            ctx.known(buffer, linear, load(element_type, f"{names[k // lanes]}.v",
                                           str(k % lanes)))
    return linears


def store_lanes(vector: RowVector | None, element_type: str) -> int:
    """Elements per 16-byte store of a row stage writing `element_type` in `vector`'s
    groups, or 0 where it cannot store by vector (no groups, a type not stored so)."""
    if vector is None or element_type not in VECTOR_TYPES:
        return 0
    lanes = VECTOR_BYTES // VECTOR_TYPES[element_type]
    return lanes if vector.group % lanes == 0 else 0


def emit_group_store(ctx: KernelContext, pointer: str, element_type: str, values: list[str],
                     first: str, lanes: int, condition: str | None) -> None:
    """Store `values` (storage-type expressions) at linear indices `first`, `first` + 1, …
    of `pointer`: by 16-byte vectors of `lanes` elements where `condition` (its alignment,
    as `pointer_alignment` gives it; None: known misaligned) allows, else element by
    element."""
    w = ctx.writer
    if condition is None:
        for k, value in enumerate(values):
            w.line(f"{pointer}[{first if k == 0 else f'{first} + {k}'}] = {value};")
        return
    c_type = f"tl_vector<{storage_type(element_type)}, {lanes}>"
    for part in range(len(values) // lanes):
        name = w.fresh("out_vec")
        start = first if part == 0 else f"{first} + {part * lanes}"
        w.line(f"{c_type} {name};")
        for e in range(lanes):
            w.line(f"{name}.v[{e}] = {values[part * lanes + e]};")
        if not condition:
            w.line(f"tl_store_vector<{lanes}>({pointer} + {start}, {name});")
            continue
        w.open(f"if ({condition})")
        w.line(f"tl_store_vector<{lanes}>({pointer} + {start}, {name});")
        w.depth -= 1
        w.open("} else")
        w.line(f"for (int e = 0; e < {lanes}; ++e) {pointer}[{start} + e] = {name}.v[e];")
        w.close()


__all__ = ["RowVector", "emit_group_loads", "emit_group_store", "plan_row_vector",
           "pointer_alignment", "store_lanes"]
