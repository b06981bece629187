"""Kernel planning of the GPU backend: which template each entry instruction becomes, and
its launch geometry.

The step between the buffer-assigned HLO module and the CUDA text. Every entry instruction
that computes is one *kernel plan*; consecutive kernels over the same rows are then merged
into one *row group* (`row_groups.py`). The templates (docs/gpu.md, "Kernel templates",
describes each): `loop` (a thread per element, grid-stride), `row-reduction` (a warp or
block per contiguous row), `split-reduction` (partials over blocks, then a second kernel),
`column-reduction`, `transpose` (32x32 tiles through shared memory, as XLA's transpose
emitter), `row-group`, `row-fusion` (softmax, layer norm), `multi-output`, `sort`,
`topk`, `dot` (cuBLAS) and `dot-epilogue` (cuBLAS then a loop kernel, or one cuBLASLt
call for a bias and/or relu).

Every reduction folds in a fixed tree order that depends only on the shapes (never on the
grid size or the device), so results are deterministic run to run and device to device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tfxla_lite.codegen.gpu.cuda_source import identifier
from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan, Launch, leaf_indices
from tfxla_lite.codegen.gpu.linalg import LINALG_OPCODES, plan_linalg
from tfxla_lite.codegen.gpu.lt_epilogue import lt_epilogue
from tfxla_lite.codegen.gpu.random_bits import RANDOM_OPCODES, plan_random
from tfxla_lite.codegen.gpu.row_vectors import VECTOR_BYTES, VECTOR_TYPES, read_at_own_index
from tfxla_lite.codegen.gpu.sort import WHOLE_ROW_OPCODES, plan_sort
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.opcodes import is_elementwise, is_flat
from tfxla_lite.passes.row_fusion import plan_row_fusion

LIBRARY_DOT_TYPES = frozenset({"f16", "bf16", "f32", "f64"})  # dots cuBLAS computes
BLOCK_SIZE = 256  # threads of loop and column-reduction blocks
WARP = 32
ROWS_PER_WARP_BLOCK = 8  # rows of a block of one-warp teams
LOOP_ROW_MAX = 16  # rows this short are folded by one thread each (loop template)
WARP_ROW_MAX = 512  # rows up to this long get a warp, longer ones a block
SPLIT_MIN = 1 << 16  # rows (full reductions: inputs) from this many elements are split
SPLIT_MAX_ROWS = 64  # ... when there are at most this many (a guess, never measured)
SPLIT_CHUNK = 1 << 14  # elements per partial (at least)
SPLIT_MAX_CHUNKS = 1024
COLUMN_TILE = (32, 8)  # outputs x slices of a column-reduction block
# A multi-output fusion's loop result is stored by a reduction phase that runs on one
# block only up to this many elements (64 KiB of f32): one multiprocessor's stores of
# that much cost about a kernel launch (a few us at tens of GB/s). A guess, never measured.
ONE_BLOCK_LOOP_MAX = 1 << 14
TRANSPOSE_TILE = 32  # a tile of the transposed [B, C] view: 32x32 elements
TRANSPOSE_BLOCK = (32, 8)  # threads of a tiled transpose; each thread moves 4 rows
# When tiling pays (XLA's `ir_emission_utils.h`): both swapped sides at least 16, or
# both at least 8 with at least 64x128 elements between them. XLA's constants, never
# measured here: only a GPU can say whether ours should differ.
TILED_MIN_SIDE = 16
TILED_MIN_SIDE_SMALL = 8
TILED_MIN_ELEMENTS = 64 * 128

_NO_KERNEL = frozenset({"parameter", "constant"})
DERIVED_SUFFIXES = ("", "_v4", "_partials", "_reduce", "_row_group")


def multi_output_leaves(inst: Instruction) -> list[Instruction] | None:
    """The roots of a multi-output fusion (a fusion whose root is a tuple of arrays),
    or None for any other instruction."""
    if inst.opcode != "fusion":
        return None
    root = inst.fused_computation.root
    if root is None or root.opcode != "tuple":
        return None
    for leaf in root.operands:
        if leaf.shape.is_tuple:
            raise NotImplementedError(f"GPU backend: variadic {leaf.opcode} in multi-output "
                                      f"fusion %{inst.name}")
        if leaf.opcode == "reduce" and len(leaf.operands) != 2:
            raise NotImplementedError(f"GPU backend: variadic reduce (%{inst.name})")
    return list(root.operands)


def kernel_body(inst: Instruction) -> tuple[Instruction, list[Instruction]]:
    """The instruction a kernel computes last (its root) and all it computes."""
    if inst.opcode == "fusion":
        computation = inst.fused_computation
        assert computation.root is not None
        if computation.root.opcode == "tuple":
            raise NotImplementedError(f"GPU backend: multi-output fusion %{inst.name}")
        return computation.root, list(computation.instructions)
    return inst, [inst]


def is_row_reduction(reduce: Instruction) -> bool:
    """Whether every reduced dimension lies after every kept one (rows are contiguous)."""
    reduced = set(reduce.dimensions)
    kept = [d for d in range(reduce.operand(0).shape.rank) if d not in reduced]
    return not kept or not reduced or max(kept) < min(reduced)




def column_group(inst: Instruction, reduces: list[Instruction]) -> int:
    """Consecutive outputs each thread of a column fold takes, reading them with 16-byte
    vector loads (`row_vectors`): G = 16 bytes over the narrowest f32/f16/bf16 buffer the
    reduces' inputs read at their own index (through elementwise ops, reshapes and
    bitcasts), when the operand's minor dimension is kept and a multiple of G (so each
    thread's G outputs are G consecutive elements of every reduced row, from a multiple
    of G); else 1. The buffers are found by `row_vectors.read_at_own_index`, the walk
    `columns.fold_columns` makes again in its context."""
    operand = reduces[0].operand(0)
    dims = operand.shape.dims
    if not dims or any(len(dims) - 1 in r.dimensions for r in reduces):
        return 1
    if inst.opcode == "fusion":
        buffers = {id(p) for p in inst.fused_computation.parameters}
    else:
        buffers = {id(o) for o in inst.operands}
    read = read_at_own_index([i for r in reduces for i in r.operands[:len(r.operands) // 2]],
                             buffers)
    if not read:
        return 1
    group = VECTOR_BYTES // min(VECTOR_TYPES[b.shape.element_type] for b in read)
    return group if dims[-1] % group == 0 else 1


def loop_launch(elements: int, vector_width: int = 1) -> Launch:
    per_block = BLOCK_SIZE * vector_width
    return Launch((BLOCK_SIZE, 1), elements, per_block)


def row_team(width: int) -> int:
    """Threads that fold one row of `width` elements."""
    if width <= WARP_ROW_MAX:
        return WARP
    return 512 if width >= 16384 else 256


def row_launch(rows: int, team: int) -> Launch:
    if team == WARP:
        return Launch((WARP, ROWS_PER_WARP_BLOCK), rows, ROWS_PER_WARP_BLOCK)
    return Launch((team, 1), rows, 1)


def splits(rows: int, width: int) -> bool:
    """Whether a row reduction (a full one: one row) is split into chunks folded by
    blocks of their own, then a second kernel folding each row's chunks: rows long
    enough, and too few for a block per row to fill a GPU (`SPLIT_MIN`, `SPLIT_MAX_ROWS`)."""
    return 0 < rows <= SPLIT_MAX_ROWS and width >= SPLIT_MIN


def split_scratch(plan: KernelPlan) -> tuple[list[int], int]:
    """Where a split reduction's partials lie in the scratch area: one array per
    accumulator (two for an ArgMax: values and indices) of `rows * chunks` slots of 8
    bytes (the widest compute type), each from a 256-byte boundary; (offsets, bytes)."""
    reduces = plan.extra.get("siblings") or [kernel_body(plan.members[0])[0]]
    size = plan.rows * plan.chunks * 8
    offsets, end = [], 0
    for _ in range(sum(len(r.operands) // 2 for r in reduces)):
        offsets.append(-(-end // 256) * 256)
        end = offsets[-1] + size
    return offsets, end


def split_plan(elements: int) -> tuple[int, int]:
    """(chunk, chunks) of a split row of `elements` (the whole input of a full
    reduction), from its size alone."""
    chunks = min(SPLIT_MAX_CHUNKS, -(-elements // SPLIT_CHUNK))
    chunk = -(-elements // chunks)
    chunk = -(-chunk // 1024) * 1024
    return chunk, -(-elements // chunk)


def _vectorizable(inst: Instruction, computed: list[Instruction]) -> bool:
    """A flat f32 kernel whose every array operand is f32 of the output's size, a size
    divisible by 4: the float4 variant reads and writes 16 bytes per access."""
    root_shape = inst.shape
    if root_shape.element_type != "f32" or root_shape.num_elements % 4 or not is_flat(computed):
        return False
    for operand in inst.operands:
        if operand.shape.dims and (operand.shape.element_type != "f32"
                                   or operand.shape.num_elements != root_shape.num_elements):
            return False
    return all(not (i.opcode == "constant" and i.shape.num_elements > 1) for i in computed)


def plan_instruction(inst: Instruction, name: str, assignment: Any = None) -> KernelPlan:
    """The plan of one entry instruction on its own (`assignment`: its buffers, which
    decide whether a multi-output fusion's loop results may be written from its
    reduction loop)."""
    for operand in inst.operands:
        if operand.shape.is_tuple:
            raise NotImplementedError(f"GPU backend: tuple-shaped operand %{operand.name} of "
                                      f"%{inst.name}")
    if inst.opcode in WHOLE_ROW_OPCODES:
        return plan_sort(inst, name)
    if inst.opcode in LINALG_OPCODES:
        return plan_linalg(inst, name)
    if inst.opcode in RANDOM_OPCODES:
        return plan_random(inst, name)
    if inst.opcode in ("tuple", "get-tuple-element", "while", "conditional", "call"):
        raise NotImplementedError(f"GPU backend: {inst.opcode} in the entry computation "
                                  f"(%{inst.name})")
    if (leaves := multi_output_leaves(inst)) is not None:
        return _sibling_split(inst, name, leaves) or \
            plan_multi_output(inst, name, leaves, assignment)
    root, computed = kernel_body(inst)
    if root.shape.is_tuple and root.opcode != "reduce":
        raise NotImplementedError(f"GPU backend: {root.opcode} (%{inst.name}) returns a tuple")
    if root.shape.is_tuple:
        # A variadic reduce (ArgMax: values and indices): a team per row, or column tiles.
        leaf_indices(inst)  # arrays only
        inputs = root.operands[:len(root.operands) // 2]
        outputs = root.shape.tuple_shapes[0].num_elements  # type: ignore[index]
        if is_row_reduction(root) and outputs:
            width = inputs[0].shape.num_elements // outputs
            if splits(outputs, width):
                return _split_reduction(inst, name, outputs, width)
            team = row_team(width)
            return KernelPlan("row-reduction", name, [inst], row_launch(outputs, team), team,
                              outputs, width)
        group = column_group(inst, [root])
        return KernelPlan("column-reduction", name, [inst],
                          Launch(COLUMN_TILE, outputs, COLUMN_TILE[0] * group), rows=outputs,
                          extra={"group": group})
    if inst.opcode == "dot" and inst.shape.element_type in LIBRARY_DOT_TYPES:
        return KernelPlan("dot", name, [inst])
    if inst.opcode == "fusion" and (dot := epilogue_dot(inst)) is not None:
        # cuBLAS writes the product to scratch memory; a loop kernel applies the epilogue.
        # Or one cuBLASLt call computes both (`lt_epilogue.py`; "lt": its epilogue, or why
        # not), the loop kernel kept for executables that cannot bind cuBLASLt.
        return KernelPlan("dot-epilogue", name, [inst], loop_launch(inst.shape.num_elements),
                          extra={"dot": dot, "lt": lt_epilogue(inst, dot)})
    if (row_plan := plan_row_fusion(inst)) is not None:
        rows, width = row_plan.spec.rows, row_plan.spec.width
        team = row_team(width)
        return KernelPlan("row-fusion", name, [inst], row_launch(rows, team), team, rows,
                          width, extra={"row_plan": row_plan})
    if root.opcode == "reduce":
        operand_size = root.operand(0).shape.num_elements
        outputs = root.shape.num_elements
        if is_row_reduction(root) and outputs:
            width = operand_size // outputs
            if width <= LOOP_ROW_MAX:
                return KernelPlan("loop", name, [inst], loop_launch(outputs))
            if splits(outputs, width):
                return _split_reduction(inst, name, outputs, width)
            team = row_team(width)
            return KernelPlan("row-reduction", name, [inst], row_launch(outputs, team), team,
                              outputs, width)
        group = column_group(inst, [root])
        return KernelPlan("column-reduction", name, [inst],
                          Launch(COLUMN_TILE, outputs, COLUMN_TILE[0] * group),
                          rows=outputs, width=operand_size // max(outputs, 1),
                          extra={"group": group})
    if (tiling := transpose_tiling(inst)) is not None:
        a_size, b_size, c_size = tiling.shape
        tiles = a_size * ceil_div(b_size, TRANSPOSE_TILE) * ceil_div(c_size, TRANSPOSE_TILE)
        return KernelPlan("transpose", name, [inst], Launch(TRANSPOSE_BLOCK, tiles, 1),
                          extra={"tiling": tiling})
    vectorized = _vectorizable(inst, computed)
    return KernelPlan("loop", name, [inst], loop_launch(inst.shape.num_elements),
                      vectorized=vectorized)


def _split_reduction(inst: Instruction, name: str, rows: int, width: int) -> KernelPlan:
    """Kernel 1: a block per chunk of a row (`chunks` per row, grid-stride over
    rows x chunks) folds it into partials in scratch memory; kernel 2: a block per row
    folds the row's partials in chunk order, then the init value."""
    chunk, chunks = split_plan(width)
    return KernelPlan("split-reduction", name, [inst], Launch((256, 1), rows * chunks, 1),
                      256, rows, width, chunk=chunk, chunks=chunks)


def _sibling_split(inst: Instruction, name: str, leaves: list[Instruction]) -> KernelPlan | None:
    """A multi-output fusion of sibling reductions only (no loop results) that would split
    alone: the split template, every sibling folded per chunk in one pass (a phase of one
    block per row otherwise); `extra["siblings"]`: the reduces, in output order."""
    if not all(leaf.opcode == "reduce" and is_row_reduction(leaf) for leaf in leaves) or \
            len(phase_groups(leaves, list(range(len(leaves))))) != 1:
        return None
    rows = leaves[0].shape.num_elements
    width = leaves[0].operand(0).shape.num_elements // max(rows, 1)
    if not rows or not splits(rows, width):
        return None
    plan = _split_reduction(inst, name, rows, width)
    plan.extra["siblings"] = list(leaves)
    return plan


@dataclass(frozen=True)
class TransposeTiling:
    """How a tiled transpose kernel sees its work: every hero's operand as [A, B, C]
    (row-major, size-1 dimensions dropped, dimensions that stay adjacent merged) and the
    kernel's output, at each hero's shape, as [A, C, B]."""

    heroes: tuple[Instruction, ...]
    shape: tuple[int, int, int]


def normalized_transpose(dims: tuple[int, ...],
                         permutation: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(A, B, C) when transposing an array of `dims` by `permutation` (result dimension i
    is operand dimension permutation[i]) is [A, B, C] -> [A, C, B] once size-1 dimensions
    are dropped and runs of dimensions that stay adjacent are merged; else None (the
    minor dimension stays in place, or a permutation of more than three groups)."""
    kept = [d for d in range(len(dims)) if dims[d] != 1]
    order = [kept.index(d) for d in permutation if dims[d] != 1]
    groups: list[list[int]] = []  # runs of operand dimensions, in result order
    for d in order:
        if groups and groups[-1][-1] + 1 == d:
            groups[-1].append(d)
        else:
            groups.append([d])
    firsts = sorted(g[0] for g in groups)
    positions = [firsts.index(g[0]) for g in groups]  # each group's place in the operand
    sizes = [1] * len(groups)
    for g, position in zip(groups, positions):
        for d in g:
            sizes[position] *= dims[kept[d]]
    if positions == [1, 0]:
        return 1, sizes[0], sizes[1]
    if positions == [0, 2, 1]:
        return sizes[0], sizes[1], sizes[2]
    return None


def tiling_pays(b_size: int, c_size: int) -> bool:
    """Whether a [B, C] -> [C, B] transpose is large enough for the shared-memory tile
    (`TILED_MIN_*`); a smaller one stays a loop kernel."""
    return (b_size >= TILED_MIN_SIDE and c_size >= TILED_MIN_SIDE) or (
        b_size >= TILED_MIN_SIDE_SMALL and c_size >= TILED_MIN_SIDE_SMALL
        and b_size * c_size >= TILED_MIN_ELEMENTS)


def transpose_tiling(inst: Instruction) -> TransposeTiling | None:
    """The tiling of an entry instruction that is a lone transpose, or a kLoop fusion
    whose root reads transposes (the heroes) only through elementwise ops and reshapes,
    so that the root's element at a linear index needs each hero's element at that same
    linear index and nothing else does. The heroes must move the minor dimension,
    all the same way on operands of one shape, by enough to pay (`tiling_pays`)."""
    if inst.shape.is_tuple or not inst.shape.num_elements:
        return None
    if inst.opcode == "fusion" and inst.attributes.get("kind") != "kLoop" \
            or inst.opcode not in ("fusion", "transpose"):
        return None
    root, _ = kernel_body(inst)
    count = root.shape.num_elements
    # Computed at the output's linear index, from the root: elementwise ops and reshapes
    # (a row-major reshape keeps the linear index, as XLA's bitcasts keep the layout).
    reached: dict[int, Instruction] = {}
    candidates: list[Instruction] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in reached or node.shape.is_tuple or node.shape.num_elements != count:
            continue
        reached[id(node)] = node
        if node.opcode == "transpose":
            candidates.append(node)
        elif is_elementwise(node.opcode) or node.opcode in ("reshape", "bitcast"):
            stack.extend(node.operands)
    heroes: list[Instruction] = []
    shape = None
    for hero in candidates:
        this = normalized_transpose(hero.operand(0).shape.dims, hero.dimensions)
        if this is None or not _read_only_at_output_index(hero, root, reached):
            continue
        key = (this, hero.operand(0).shape.dims, hero.dimensions)
        if heroes and key != (shape, heroes[0].operand(0).shape.dims, heroes[0].dimensions):
            continue  # another permutation: computed by its element generator
        heroes.append(hero)
        shape = this
    if shape is None or not tiling_pays(shape[1], shape[2]):
        return None
    return TransposeTiling(tuple(heroes), shape)


def _read_only_at_output_index(hero: Instruction, root: Instruction,
                               reached: dict[int, Instruction]) -> bool:
    """Whether every value computed from `hero` up to `root` is one the root reads at its
    own index (elementwise, reached from the root), so the hero's tile element may stand
    for it."""
    stack, seen = [hero], {id(hero)}
    while stack:
        node = stack.pop()
        if node is root:
            continue  # the kernel's result (an entry transpose's users are other kernels)
        for user in node.users:
            if id(user) not in reached:
                return False
            if id(user) not in seen:
                seen.add(id(user))
                stack.append(user)
    return True


def phase_blocks(reduce: Instruction, group: int = 1) -> int:
    """Blocks of 256 threads a reduction phase of a multi-output kernel needs at most
    (`group`: outputs per thread of a column phase, `column_group`)."""
    outputs = reduce.shape.num_elements
    if is_row_reduction(reduce) and outputs:
        width = reduce.operand(0).shape.num_elements // outputs
        return -(-outputs // ROWS_PER_WARP_BLOCK) if row_team(width) == WARP else outputs
    return -(-outputs // (COLUMN_TILE[0] * group))


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


def _reads_a_reduce(leaf: Instruction) -> bool:
    """Whether a fused value depends on a reduce of its fusion (through anything)."""
    stack, seen = [leaf], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.opcode == "reduce":
            return True
        stack.extend(node.operands)
    return False


def _column_groups(inst: Instruction, leaves: list[Instruction],
                   groups: list[list[int]]) -> dict[int, int]:
    """`column_group` of each column phase (by its first reduce result); row phases: 1."""
    return {g[0]: 1 if is_row_reduction(leaves[g[0]]) and leaves[g[0]].shape.num_elements
            else column_group(inst, [leaves[n] for n in g]) for g in groups}


def _loop_phase(inst: Instruction, leaves: list[Instruction], n: int,
                groups: list[list[int]], column_groups: dict[int, int],
                assignment: Any) -> tuple[int | None, str]:
    """The phase group (its first reduce result) whose fold also computes and stores loop
    result `n` (XLA's reduction emitter writes such roots from the reduction loop, so the
    inputs are read once), or (None, why not): the second kernel computes it
    (`column_groups`: `_column_groups` of `groups`)."""
    leaf = leaves[n]
    group = next((g for g in groups if leaves[g[0]].operand(0).shape.dims == leaf.shape.dims),
                 None)
    if not groups:
        return None, "no reduction in the fusion"
    if group is None:
        return None, "not of a reduction's input shape"
    if _reads_a_reduce(leaf):
        return None, "reads a reduce of the fusion"
    blocks = phase_blocks(leaves[group[0]], column_groups[group[0]])
    if blocks == 1 and leaf.shape.num_elements > ONE_BLOCK_LOOP_MAX:
        return None, "its reduction runs on one block"
    written = assignment.slice_of(inst, (n,))
    if any(written.may_overlap(assignment.slice_of(o)) for o in inst.operands):
        return None, "written in place of an input"
    return group[0], ""


def plan_multi_output(inst: Instruction, name: str, leaves: list[Instruction],
                      assignment: Any = None) -> KernelPlan:
    """A multi-output fusion: a kernel of reduction phases (one per group of reduce leaves
    over the same elements, `phase_groups`; each a grid-stride loop of its own over blocks
    of 256 threads) that also computes and stores every loop leaf of a phase's input shape
    at the index it folds (`_loop_phase`; `extra["phase_loops"]`), then, for the loop
    leaves it cannot take (`extra["apart"]`: why), a loop kernel computing each at an
    index before storing any (a leaf may overwrite an operand in place; the reductions
    have read everything by then). Without `assignment` nothing is known about in-place
    outputs and no loop leaf joins a phase."""
    reduces = [n for n, leaf in enumerate(leaves) if leaf.opcode == "reduce"]
    groups = phase_groups(leaves, reduces)
    column_groups = _column_groups(inst, leaves, groups)
    phase_loops: dict[int, list[int]] = {}
    apart: dict[int, str] = {}
    for n, leaf in enumerate(leaves):
        if leaf.opcode == "reduce":
            continue
        if assignment is None:
            apart[n] = "no buffer assignment"
            continue
        first, why = _loop_phase(inst, leaves, n, groups, column_groups, assignment)
        if first is None:
            apart[n] = why
        else:
            phase_loops.setdefault(first, []).append(n)
    loops = sorted(apart)
    if len({leaves[n].shape.dims for n in loops}) > 1:
        raise NotImplementedError(f"GPU backend: multi-output fusion %{inst.name} with loop "
                                  "results of different shapes")
    blocks = max((phase_blocks(leaves[g[0]], column_groups[g[0]]) for g in groups), default=0)
    elements = leaves[loops[0]].shape.num_elements if loops else 0
    return KernelPlan("multi-output", name, [inst], Launch((BLOCK_SIZE, 1), elements,
                                                             BLOCK_SIZE),
                      extra={"reduces": reduces, "loops": loops, "apart": apart,
                             "phase_loops": phase_loops, "column_groups": column_groups,
                             "reduce_launch": Launch((BLOCK_SIZE, 1), blocks, 1)})


def epilogue_dot(fusion: Instruction) -> Instruction | None:
    """The dot of a fusion that is a library dot plus an elementwise epilogue (a kOutput
    fusion, ours or XLA's): one dot of parameters, read by the rest only at its own index
    through elementwise ops of its dimensions. None for any other fusion."""
    computation = fusion.fused_computation
    dots = [i for i in computation.instructions if i.opcode == "dot"]
    if len(dots) != 1 or computation.root is None or computation.root.shape.is_tuple:
        return None
    (dot,) = dots
    if dot.shape.element_type not in LIBRARY_DOT_TYPES or any(
            o.opcode != "parameter" for o in dot.operands) or \
            dot.shape.dims != computation.root.shape.dims:
        return None
    stack, seen = [dot], set()
    while stack:
        node = stack.pop()
        for user in node.users:
            if not is_elementwise(user.opcode) or user.shape.dims != dot.shape.dims:
                return None
            if id(user) not in seen:
                seen.add(id(user))
                stack.append(user)
    return dot


def plan_kernels(entry_instructions: list[Instruction], assignment: Any) -> list[KernelPlan]:
    """The kernel of each entry instruction that computes, on its own, in execution order
    (`assignment`: its buffers). `row_groups.merge_row_groups` then merges runs of them
    over the same rows (`compiler.emit_program` does both)."""
    root = entry_instructions[-1] if entry_instructions else None
    plans: list[KernelPlan] = []
    used: set[str] = set()
    for inst in entry_instructions:
        if inst.opcode in _NO_KERNEL or (inst is root and inst.opcode == "tuple"):
            continue
        if inst.opcode == "get-tuple-element" and not inst.shape.is_tuple:
            continue  # a name of a leaf's buffer (buffer assignment aliases it): no code
        name = "kernel_" + identifier(inst.name)
        # Templates derive more names from a plan's (`_v4`, `_partials`, `_reduce`,
        # `_row_group`): none may meet another kernel's.
        while any(name + suffix in used for suffix in DERIVED_SUFFIXES):
            name += "_"
        used.update(name + suffix for suffix in DERIVED_SUFFIXES)
        plans.append(plan_instruction(inst, name, assignment))
    return plans


def describe(plans: list[KernelPlan]) -> str:
    """One line per kernel: name, template, members and geometry (for dumps and tests)."""
    lines = []
    for plan in plans:
        geometry = ""
        if plan.launch is not None:
            geometry = f" block={plan.launch.block} units={plan.launch.units}"
        extra = " float4" if plan.vectorized else ""
        if plan.kind == "multi-output":
            # Which loop results the reduction loop writes, and why the others are apart.
            written = sorted(n for loops in plan.extra["phase_loops"].values() for n in loops)
            if written:
                extra += " loops in reduction: " + ",".join(map(str, written))
            for n, why in sorted(plan.extra["apart"].items()):
                extra += f" loop {n} apart: {why};"
        members = ",".join(m.name for m in plan.members)
        lines.append(f"{plan.name}: {plan.kind}{extra} [{members}]{geometry}")
    return "\n".join(lines) + ("\n" if lines else "")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b else 0


__all__ = ["KernelPlan", "Launch", "ceil_div", "describe", "kernel_body",
           "plan_instruction", "plan_kernels"]
