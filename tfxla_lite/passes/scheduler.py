"""Memory scheduling (`schedule`): the order of the entry's instructions, chosen for a
small arena.

The instruction order is the schedule (buffer assignment's live ranges, codegen's kernel
order). As XLA's `DefaultMemoryScheduler`, the pass tries several orders (list
scheduling, a depth-first walk biggest subtree first, plain post-order) and keeps the
one whose `assign_buffers` arena is smallest; the current order stays unless a candidate
is strictly smaller. docs/buffers.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.passes.base import Pass

if TYPE_CHECKING:  # imported where used at run time, as `assign_buffers` is
    from tfxla_lite.passes.buffer_assignment import BufferAssignment

_FORWARDERS = ("tuple", "get-tuple-element")
_NO_ARENA = ("parameter", "constant")


def _defined_bytes(inst: Instruction) -> int:
    """Arena bytes `inst` may need for its own result (forwarders, parameters and
    constants need none)."""
    return 0 if inst.opcode in _FORWARDERS + _NO_ARENA else inst.shape.byte_size


def _sources(inst: Instruction) -> list[Instruction]:
    """The instructions whose results `inst` reads, looking through forwarders."""
    found: list[Instruction] = []
    for operand in inst.operands:
        if operand.opcode in _FORWARDERS:
            found.extend(_sources(operand))
        else:
            found.append(operand)
    return found


def list_schedule(entry: Computation) -> list[Instruction]:
    """Greedy forward list scheduling by bytes freed minus bytes defined."""
    root = entry.root
    order_of = {id(inst): n for n, inst in enumerate(entry.instructions)}
    readers: dict[int, set[int]] = {id(inst): set() for inst in entry.instructions}
    for inst in entry.instructions:
        if inst.opcode not in _FORWARDERS:
            for source in _sources(inst):
                readers[id(source)].add(id(inst))
    outputs = {id(s) for s in _sources(root)} if root is not None and \
        root.opcode in _FORWARDERS else {id(root)}
    waiting = {id(inst): len({id(o) for o in inst.operands}) for inst in entry.instructions}
    users: dict[int, list[Instruction]] = {id(inst): [] for inst in entry.instructions}
    for inst in entry.instructions:
        for operand in {id(o): o for o in inst.operands}.values():
            users[id(operand)].append(inst)
    unread = {key: set(value) for key, value in readers.items()}
    ready = [inst for inst in entry.instructions if waiting[id(inst)] == 0]
    schedule: list[Instruction] = []
    # Priorities are recomputed for every ready instruction at every step: look sizes
    # and sources up once.
    defined = {id(inst): _defined_bytes(inst) for inst in entry.instructions}
    sources = {id(inst): list({id(s): s for s in _sources(inst)}) for inst in entry.instructions}

    def priority(inst: Instruction) -> tuple[int, int, int]:
        if inst.opcode in _FORWARDERS + _NO_ARENA:
            return (0, 0, order_of[id(inst)])  # free: as soon as it may run
        freed = sum(defined[s] for s in sources[id(inst)]
                    if unread[s] == {id(inst)} and s not in outputs)
        return (1, defined[id(inst)] - freed, order_of[id(inst)])

    while ready:
        candidates = [i for i in ready if i is not root] or ready
        inst = min(candidates, key=priority)
        ready.remove(inst)
        schedule.append(inst)
        if inst.opcode not in _FORWARDERS:
            for source in _sources(inst):
                unread[id(source)].discard(id(inst))
        for user in users[id(inst)]:
            waiting[id(user)] -= 1
            if waiting[id(user)] == 0:
                ready.append(user)
    return schedule


def _post_order(entry: Computation, biggest_first: bool) -> list[Instruction]:
    order_of = {id(inst): n for n, inst in enumerate(entry.instructions)}
    subtree: dict[int, int] = {}

    def subtree_bytes(inst: Instruction) -> int:
        # Bytes defined by `inst` and everything it depends on (shared parts counted
        # once per path: a ranking, not an exact count).
        if id(inst) not in subtree:
            subtree[id(inst)] = _defined_bytes(inst) + sum(
                subtree_bytes(o) for o in {id(o): o for o in inst.operands}.values())
        return subtree[id(inst)]

    if biggest_first:  # (only this ranking reads the sizes)
        for inst in entry.instructions:  # topological: no deep recursion below
            subtree_bytes(inst)
    schedule: list[Instruction] = []
    done: set[int] = set()
    roots = [entry.root] if entry.root is not None else []
    # Instructions the root does not reach (parameters kept by DCE) go first.
    leftovers = [i for i in entry.instructions if i.opcode == "parameter"]
    stack: list[tuple[Instruction, bool]] = [(r, False) for r in reversed(roots)]
    stack += [(p, False) for p in reversed(leftovers)]
    while stack:
        inst, expanded = stack.pop()
        if id(inst) in done:
            continue
        if expanded:
            done.add(id(inst))
            schedule.append(inst)
            continue
        stack.append((inst, True))
        operands = list({id(o): o for o in inst.operands}.values())
        if biggest_first:
            operands.sort(key=lambda o: (-subtree[id(o)], order_of[id(o)]))
        stack.extend((o, False) for o in reversed(operands) if id(o) not in done)
    # What the root does not reach reads nothing the root needs after it: keep it, in
    # its own order, just before the root.
    rest = [i for i in entry.instructions if id(i) not in done]
    if rest and schedule and schedule[-1] is entry.root:
        return schedule[:-1] + rest + schedule[-1:]
    return schedule + rest


def dfs_schedule(entry: Computation) -> list[Instruction]:
    return _post_order(entry, biggest_first=True)


def post_order_schedule(entry: Computation) -> list[Instruction]:
    return _post_order(entry, biggest_first=False)


SCHEDULERS: dict[str, Callable[[Computation], list[Instruction]]] = {
    "list": list_schedule,
    "dfs": dfs_schedule,
    "post-order": post_order_schedule,
}


def is_topological(order: list[Instruction]) -> bool:
    seen: set[int] = set()
    for inst in order:
        if any(id(o) not in seen for o in inst.operands):
            return False
        seen.add(id(inst))
    return True


@dataclass(frozen=True)
class MemoryScheduler(Pass):
    """Needs: a module whose entry has a root; run last, after `add-output-copies`.

    Guarantees: the entry's instructions are a topological order whose temp arena
    under `assign_buffers` is the smallest of the current order and the candidates
    (module docstring); the order changes only when the arena strictly shrinks.
    """

    name: ClassVar[str] = "schedule"

    def run(self, module: HloModule) -> bool:
        entry = module.entry
        before = list(entry.instructions) if entry is not None else []
        schedule(module)
        return entry is not None and entry.instructions != before


def schedule(module: HloModule) -> BufferAssignment | None:
    """Put the entry in the order of the smallest temp arena (`MemoryScheduler`) and
    return the buffer assignment of that order, which choosing it computed (callers that
    plan memory need not assign buffers again); None, with the order left as it was,
    when the entry has no root or buffer assignment cannot plan it."""
    from tfxla_lite.passes.buffer_assignment import EntryValues, assign_buffers

    entry = module.entry
    if entry is None or entry.root is None:
        return None
    current = list(entry.instructions)

    def plan(order: list[Instruction]) -> BufferAssignment:
        entry.instructions[:] = order
        try:
            return assign_buffers(module, values=values)
        finally:
            entry.instructions[:] = current

    try:
        # What does not depend on the order is derived once for every candidate.
        values = EntryValues(entry)
        best, best_plan = current, plan(current)
    except (NotImplementedError, ValueError, KeyError):
        return None  # a plan buffer assignment cannot make: leave it to report
    planned = [current]  # orders already weighed (candidates often coincide)
    for make in SCHEDULERS.values():
        order = make(entry)
        assert len(order) == len(current) and is_topological(order), make.__name__
        if order in planned:
            continue  # its plan is the best one's or lost to it
        planned.append(order)
        candidate = plan(order)
        if candidate.temp_bytes < best_plan.temp_bytes:
            best, best_plan = order, candidate
    entry.instructions[:] = best
    return best_plan
