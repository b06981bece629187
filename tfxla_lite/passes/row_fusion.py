"""Row fusion (`fuse-rows`): reductions over the rows of one array and their consumers,
as one kernel.

Softmax and layer norm are chains of row reductions broadcast back along their rows;
`fuse` would cut them after every reduce, reading the array again per stage. This pass,
before `fuse`, puts the chain into one kCustom `fusion` (a *row fusion*) that
`codegen/cpu/row_kernel.py` runs a row at a time, every stage while the row is in the
cache. Which members may join (each keeps row r's values at row r), cloning and
`max_row_bytes`: docs/architecture.md, `fuse-rows`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import is_elementwise, is_expensive
from tfxla_lite.passes.base import Pass

# The fusion pass's group materialization and exclusivity test serve as they are.
from tfxla_lite.passes.fusion import (
    _is_exclusive,
    buffer_written,
    can_fuse_producer,
    fuse_groups,
    fusion_targets,
    should_fuse,
)

ROW_FUSION_KIND = "kCustom"


@dataclass(frozen=True)
class RowSpec:
    """Rows of an array of `dims`: the first `kept` dimensions index rows, the rest a row."""

    dims: tuple[int, ...]
    kept: int

    @property
    def kept_dims(self) -> tuple[int, ...]:
        return self.dims[:self.kept]

    @property
    def row_dims(self) -> tuple[int, ...]:
        return self.dims[self.kept:]

    @property
    def rows(self) -> int:
        return prod(self.kept_dims)

    @property
    def width(self) -> int:
        return prod(self.row_dims)


def row_spec(reduce: Instruction) -> RowSpec | None:
    """The rows a single-input `reduce` folds, when it reduces trailing dimensions only."""
    if reduce.opcode != "reduce" or len(reduce.operands) != 2 or reduce.shape.is_tuple:
        return None
    dims = reduce.operand(0).shape.dims
    reduced = sorted(reduce.dimensions)
    if not reduced or reduced != list(range(len(dims) - len(reduced), len(dims))):
        return None
    return RowSpec(dims, len(dims) - len(reduced))


@dataclass
class RowPlan:
    """A valid row group: its rows, its reduces in order, each dependent member's class."""

    spec: RowSpec
    root: Instruction
    reduces: list[Instruction]
    classes: dict[int, str] = field(default_factory=dict)  # id → "wide" or "row"

    def is_dependent(self, inst: Instruction) -> bool:
        return id(inst) in self.classes


def _non_unit(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in dims if d != 1)


def _shape_class(dims: tuple[int, ...], spec: RowSpec) -> str | None:
    if dims == spec.dims:
        return "wide"
    if _non_unit(dims) == _non_unit(spec.kept_dims):
        return "row"
    return None


def _row_axes(dims: tuple[int, ...], cls: str, spec: RowSpec) -> list[int]:
    """The axes of a value of class `cls` that index rows (in the order of S's kept ones)."""
    if cls == "wide":
        return [d for d in range(spec.kept) if spec.dims[d] != 1]
    return [d for d, size in enumerate(dims) if size != 1]


def plan_rows(root: Instruction, members: list[Instruction]) -> RowPlan | None:
    """The plan of a row group (`members` in topological order, `root` among them), or
    None when the group is not one (see the module docstring)."""
    spec: RowSpec | None = None
    reduces: list[Instruction] = []
    classes: dict[int, str] = {}
    for inst in members:
        dependent = [o for o in inst.operands if id(o) in classes]
        if inst.opcode == "reduce":
            this = row_spec(inst)
            if this is None or (spec is not None and this != spec) or id(inst.operand(1)) \
                    in classes:
                return None
            spec = this
            reduces.append(inst)
            classes[id(inst)] = "row"
            continue
        if not dependent:
            continue
        assert spec is not None  # a dependent member follows a reduce
        cls = _shape_class(inst.shape.dims, spec)
        if cls is None:
            return None
        if is_elementwise(inst.opcode):
            if any(o.shape.dims != inst.shape.dims and o.shape.rank for o in dependent):
                return None
        elif inst.opcode == "broadcast":
            operand = inst.operand(0)
            if classes[id(operand)] != "row":
                return None
            mapped = [inst.dimensions[i] for i, size in enumerate(operand.shape.dims)
                      if size != 1]
            if mapped != _row_axes(inst.shape.dims, cls, spec):
                return None
        elif inst.opcode in ("reshape", "bitcast"):
            if classes[id(inst.operand(0))] != cls:
                return None
            if cls == "wide" and inst.operand(0).shape.dims != inst.shape.dims:
                return None
        else:
            return None
        classes[id(inst)] = cls
    if spec is None or id(root) not in classes:
        return None
    if root.opcode == "reduce" and len(reduces) < 2:
        return None  # one reduce and its producers: a kInput fusion
    return RowPlan(spec, root, reduces, classes)


def plan_row_fusion(fusion: Instruction) -> RowPlan | None:
    """The plan of a row fusion instruction (None for any other instruction)."""
    if fusion.opcode != "fusion" or fusion.attributes.get("kind") != ROW_FUSION_KIND:
        return None
    computation = fusion.fused_computation
    assert computation.root is not None
    members = [i for i in computation.instructions if i.opcode != "parameter"]
    return plan_rows(computation.root, members)


def _grow_row_group(root: Instruction, needed: set[int], max_row_bytes: int
                    ) -> list[Instruction] | None:
    """`root` and the producers a row group around it holds, or None when it is no group."""
    if root.shape.is_tuple or not (is_elementwise(root.opcode) or root.opcode == "reduce"):
        return None
    spec = row_spec(root) if root.opcode == "reduce" else None
    members = [root]
    member_ids = {id(root)}
    grown = True
    while grown:  # again until nothing joins: a producer may turn exclusive later
        grown = False
        for member in members:  # grows while iterating: a worklist
            for producer in member.operands:
                if id(producer) in member_ids:
                    continue
                if producer.opcode == "reduce":
                    this = row_spec(producer)
                    if this is None or (spec is not None and this != spec) or \
                            not _only_read_by(producer, root, member_ids, needed):
                        continue
                    operand = producer.operand(0).shape
                    element_bytes = operand.byte_size // max(1, operand.num_elements)
                    if this.width < 2 or this.width * element_bytes > max_row_bytes:
                        continue
                    spec = this
                elif not can_fuse_producer(producer):
                    continue
                elif is_expensive(producer.opcode):
                    if not _only_read_by(producer, root, member_ids, needed):
                        continue
                elif not should_fuse(producer, 1.0, False, buffer_written(producer, needed)) \
                        and not _only_read_by(producer, root, member_ids, needed):
                    continue  # a copy would cost more than reading its buffer
                members.append(producer)
                member_ids.add(id(producer))
                grown = True
    if spec is None:
        return None
    position = {id(inst): n for n, inst in enumerate(root.parent.instructions)}
    ordered = sorted(members, key=lambda inst: position[id(inst)])
    if plan_rows(root, ordered) is None:
        return None
    return members


def _only_read_by(producer: Instruction, root: Instruction, member_ids: set[int],
                  needed: set[int]) -> bool:
    """Whether only the group (rooted at `root`) reads `producer`. It walks the users,
    so the growth asks it last, only of the producers that need it."""
    return id(producer) not in needed and all(
        _is_exclusive(user, root, member_ids) for user in producer.users)


def fuse_rows(computation: Computation, max_row_bytes: int) -> int:
    """Form the row fusions of `computation` in place; how many were formed.

    A group needs a row reduce among its members, so a root with none upstream is not
    grown at all: growing the producers of every element-wise root and discarding the
    group made the pass quadratic in long element-wise chains (a Philox draw: most of
    a random op's compile time)."""
    below_reduce = _downstream_of_row_reduces(computation)

    def grow(inst: Instruction, needed: set[int]) -> list[Instruction] | None:
        if id(inst) not in below_reduce:
            return None
        return _grow_row_group(inst, needed, max_row_bytes)

    return fuse_groups(computation, grow, kind=ROW_FUSION_KIND)


def _downstream_of_row_reduces(computation: Computation) -> set[int]:
    """Ids of the instructions that are, or read (transitively), a reduce of rows."""
    found: set[int] = set()
    for inst in computation.instructions:  # topological order
        if (inst.opcode == "reduce" and row_spec(inst) is not None) or \
                any(id(o) in found for o in inst.operands):
            found.add(id(inst))
    return found


@dataclass(frozen=True)
class RowFusion(Pass):
    """Needs: a module that verifies, not yet fused.

    Guarantees: every valid row group (module docstring) of the entry and the
    computations it calls is one `fusion` of kind kCustom whose computation
    `plan_row_fusion` accepts; the rest is unchanged (`fuse` still runs after).
    """

    name: ClassVar[str] = "fuse-rows"
    # Rows wider than this (bytes of one reduce operand's row) stay out: a stage would
    # no longer find the row in L2 where the stage before left it.
    max_row_bytes: int = 256 << 10

    def run(self, module: HloModule) -> bool:
        formed = 0
        for computation in fusion_targets(module):
            formed += fuse_rows(computation, self.max_row_bytes)
        return formed > 0
