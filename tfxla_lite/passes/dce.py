"""Dead code elimination: drop what the entry's result does not depend on.

Runs before and after fusion in the default pipeline: lowering leaves unused
values behind, and fusion leaves producers it cloned into every consumer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule
from tfxla_lite.passes.base import Pass


def _live_instructions(computation: Computation) -> set[int]:
    live: set[int] = set()
    stack = [computation.root] if computation.root is not None else []
    while stack:
        inst = stack.pop()
        if id(inst) not in live:
            live.add(id(inst))
            stack.extend(inst.operands)
    return live


def remove_dead_instructions(computation: Computation) -> bool:
    """Remove every instruction the root does not reach; parameters always stay."""
    live = _live_instructions(computation)
    changed = False
    # Reverse topological order: users go before the operands they kept alive.
    for inst in reversed(computation.instructions):
        if id(inst) not in live and inst.opcode != "parameter":
            computation.remove(inst)
            changed = True
    return changed


@dataclass(frozen=True)
class DeadCodeElimination(Pass):
    """Needs: a module with an entry computation whose computations have roots.

    Guarantees: every instruction other than a parameter is reachable from its
    computation's root, and every computation is reachable from the entry.
    """

    name: ClassVar[str] = "dce"

    def run(self, module: HloModule) -> bool:
        changed = False
        for computation in module.computations:
            changed |= remove_dead_instructions(computation)
        reachable = _reachable_computations(module.entry) if module.entry is not None else set()
        for computation in list(module.computations):
            if id(computation) not in reachable:
                module.remove_computation(computation)
                changed = True
        return changed


def _reachable_computations(entry: Computation) -> set[int]:
    stack, seen = [entry], set()
    while stack:
        comp = stack.pop()
        if id(comp) not in seen:
            seen.add(id(comp))
            stack.extend(c for inst in comp.instructions for c in inst.called_computations)
    return seen
