"""Row groups: runs of consecutive kernel plans over the same rows merged into one kernel.

A step of kernel planning, after `kernels.plan_kernels` has planned each entry instruction
on its own: a softmax or layer norm left as separate kernels (row reductions and their
elementwise consumers) becomes one `row-group` kernel, one block or warp per row, so each
row is read from memory once per group instead of once per kernel (XLA's GPU backend gets
the same from its multi-output fusions and `softmax rewriter`). A run starts at a row
reduction (`_group_rows`), takes each next kernel that reads the group's results only in
its own row (`reads_row_local`), and stops where the buffers would let one team's writes
reach another team's reads (`_buffers_allow`). The template is `templates.py`'s
`_emit_row_group`.
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.kernels import (
    is_row_reduction,
    kernel_body,
    row_launch,
    row_team,
)
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.opcodes import is_elementwise

ROW_GROUP_MAX_WIDTH = 1 << 16  # a single-row group (R = 1) must stay this small


def _group_rows(plan: KernelPlan) -> int | None:
    """The rows a reduction plan could lead a row group with, if any."""
    if plan.kind not in ("row-reduction", "loop") or len(plan.members) != 1:
        return None
    root, _ = kernel_body(plan.members[0])
    if root.opcode != "reduce" or root.shape.is_tuple or not is_row_reduction(root):
        return None
    rows = root.shape.num_elements
    width = root.operand(0).shape.num_elements // max(rows, 1)
    if rows == 0 or width < 2 or (rows == 1 and width > ROW_GROUP_MAX_WIDTH):
        return None
    return rows


def _can_join(plan: KernelPlan, rows: int, group: list[Instruction]) -> bool:
    """Whether `plan` may run in a row group of `rows` rows after `group`'s members."""
    if len(plan.members) != 1 or plan.kind not in ("loop", "row-reduction"):
        return False
    inst = plan.members[0]
    if inst.shape.is_tuple:
        return False
    root, computed = kernel_body(inst)
    if root.opcode == "reduce":
        if not is_row_reduction(root) or root.shape.num_elements != rows:
            return False
    elif not (inst.opcode == "fusion" and inst.attributes.get("kind") == "kLoop"
              or is_elementwise(inst.opcode)):
        return False
    elif inst.shape.num_elements % rows or not inst.shape.num_elements:
        return False
    reads = [n for n, o in enumerate(inst.operands) if any(o is m for m in group)]
    return bool(reads) and all(reads_row_local(inst, n, rows) for n in reads)


def reads_row_local(inst: Instruction, operand_number: int, rows: int) -> bool:
    """Whether `inst` (an entry kernel) reads operand `operand_number` only in row r when it
    computes row r, both viewed as `rows` rows of contiguous elements."""
    if rows == 1:
        return True
    if inst.opcode != "fusion":
        return _edge_is_row_local(inst, inst.operand(operand_number), rows)
    computation = inst.fused_computation
    start = computation.parameter(operand_number)
    stack, seen = [start], {id(start)}
    while stack:
        node = stack.pop()
        for user in node.users:
            if not _edge_is_row_local(user, node, rows):
                return False
            if id(user) not in seen:
                seen.add(id(user))
                stack.append(user)
    return True


def _edge_is_row_local(user: Instruction, operand: Instruction, rows: int) -> bool:
    if user.shape.is_tuple or operand.shape.num_elements % rows or \
            user.shape.num_elements % rows:
        return False
    if user.opcode == "reduce":
        return user.operand(0) is operand and operand is not user.operand(1) and \
            is_row_reduction(user) and user.shape.num_elements == rows
    if is_elementwise(user.opcode):
        return operand.shape.dims == user.shape.dims
    if user.opcode in ("reshape", "bitcast"):
        return True  # the linear index, hence the row, is kept
    if user.opcode == "broadcast":
        dimensions = user.dimensions
        product = 1
        for k in range(user.shape.rank + 1):
            if product == rows:
                if len(dimensions) >= k and all(dimensions[i] == i for i in range(k)) \
                        and operand.shape.dims[:k] == user.shape.dims[:k] \
                        and all(d >= k for d in dimensions[k:]):
                    return True
            if k < user.shape.rank:
                product *= user.shape.dims[k]
    return False


def _buffers_allow(group: list[Instruction], assignment: Any) -> bool:
    """Merged kernels run interleaved, a team per row: no member may write where any
    member reads an outside value. Two members may share a buffer (buffer assignment
    reuses a dead member's bytes, or writes one in place of another) only when row r of
    each lies on the same bytes (same offset and size), every reader of the earlier one
    runs before the later one writes (or is the later one, reading in place: at its own
    index only), so each team has finished with its row before it overwrites it."""
    outputs = [assignment.slice_of(m) for m in group]
    member_ids = {id(m) for m in group}
    inputs = [assignment.slice_of(o) for m in group for o in m.operands
              if id(o) not in member_ids]
    in_place: dict[str, str] = getattr(assignment, "in_place", {}) or {}
    position = {id(m): n for n, m in enumerate(group)}
    for n, (member, out) in enumerate(zip(group, outputs)):
        if any(out.may_overlap(value) for value in inputs):
            return False
        for later, other in zip(group[n + 1:], outputs[n + 1:]):
            if not out.may_overlap(other):
                continue
            if (out.offset, out.size) != (other.offset, other.size):
                return False
            readers = [position.get(id(user)) for user in member.users]
            if any(r is None or r > position[id(later)] for r in readers):
                return False
            if any(o is member for o in later.operands) and in_place.get(later.name) != \
                    member.name:
                return False
    return True


def merge_row_groups(plans: list[KernelPlan], assignment: Any) -> list[KernelPlan]:
    """Merge runs of consecutive kernels over the same rows (module docstring)."""
    merged: list[KernelPlan] = []
    n = 0
    while n < len(plans):
        rows = _group_rows(plans[n])
        if rows is None:
            merged.append(plans[n])
            n += 1
            continue
        group = [plans[n].members[0]]
        end = n + 1
        while end < len(plans) and _can_join(plans[end], rows, group) and \
                _buffers_allow(group + plans[end].members, assignment):
            group.append(plans[end].members[0])
            end += 1
        if len(group) == 1:
            merged.append(plans[n])
            n += 1
            continue
        widths = [m.shape.num_elements // rows if kernel_body(m)[0].opcode != "reduce"
                  else kernel_body(m)[0].operand(0).shape.num_elements // rows for m in group]
        team = row_team(max(widths))
        merged.append(KernelPlan("row-group", plans[n].name + "_row_group", group,
                                 row_launch(rows, team), team, rows, max(widths)))
        n = end
    return merged
