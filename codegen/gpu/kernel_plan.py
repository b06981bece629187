"""A kernel plan of the GPU backend: one kernel (or library call), its members and launch.

What `kernels.py` (and `sort.py`, for sort and topk) plan and the templates, the driver and
the executable read; apart from `kernels.py`, which calls `sort.py`, so that both build one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tfxla_lite.hlo.ir import Instruction


@dataclass(frozen=True)
class Launch:
    """Threads per block, and the work units a grid strides over (`units_per_block` per
    block): the grid is `min(ceil(units / units_per_block), cap)` at run time, any grid
    being correct."""

    block: tuple[int, int]
    units: int
    units_per_block: int

    def grid(self, cap: int) -> int:
        return max(1, min(-(-self.units // self.units_per_block), cap))


@dataclass
class KernelPlan:
    """One kernel (or library call) of the executable."""

    # loop | transpose | row-reduction | split-reduction | column-reduction | row-group |
    # row-fusion | multi-output | dot | dot-epilogue | sort | topk | linalg | random
    kind: str
    name: str
    members: list[Instruction]  # the entry instructions it computes, in order
    launch: Launch | None = None
    team: int = 0  # threads per row (reductions and row groups)
    rows: int = 0
    width: int = 0  # elements per row (of a reduction)
    vectorized: bool = False  # has a float4 variant `<name>_v4`
    chunk: int = 0  # split-reduction: elements per partial
    chunks: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def outputs(self) -> list[tuple[Instruction, tuple[int, ...]]]:
        """(member, shape index) of every array the kernel writes, in flat order."""
        return [(m, index) for m in self.members for index in leaf_indices(m)]

    @property
    def inputs(self) -> list[Instruction]:
        """The entry values the kernel reads that it does not compute, in first-use order."""
        member_ids = {id(m) for m in self.members}
        inputs: list[Instruction] = []
        for member in self.members:
            for operand in member.operands:
                if id(operand) not in member_ids and all(operand is not i for i in inputs):
                    inputs.append(operand)
        return inputs


def leaf_indices(inst: Instruction) -> list[tuple[int, ...]]:
    """The shape indices of an instruction's arrays: `[()]`, or one per tuple element."""
    if not inst.shape.is_tuple:
        return [()]
    assert inst.shape.tuple_shapes is not None
    if any(s.is_tuple for s in inst.shape.tuple_shapes):
        raise NotImplementedError(f"GPU backend: nested tuple result of %{inst.name}")
    return [(n,) for n in range(len(inst.shape.tuple_shapes))]
