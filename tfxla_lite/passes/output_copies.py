"""Output copies: give every result of the entry a buffer of its own.

Runs last before buffer assignment. The runtime hands each output its own
buffer, so an output may not be a parameter (the caller's input), a constant
(the executable's read-only data) or the same value as another output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.passes.base import Pass


@dataclass(frozen=True)
class AddOutputCopies(Pass):
    """Needs: a module with an entry root.

    Guarantees: the entry root is a tuple whose operands are distinct
    instructions, none a parameter or a constant. A root that was not a tuple
    becomes the one element of a new root tuple.
    """

    name: ClassVar[str] = "add-output-copies"

    def run(self, module: HloModule) -> bool:
        entry = module.entry
        if entry is None or entry.root is None:
            raise ValueError(f"module {module.name} has no entry root")
        changed = False
        root = entry.root
        if root.opcode != "tuple":
            root = entry.create("tuple", [root])
            entry.instructions.remove(root)
            entry.instructions.append(root)
            entry.root = root
            changed = True
        seen: set[int] = set()
        for index, output in enumerate(root.operands):
            if output.opcode in ("parameter", "constant") or id(output) in seen:
                copy = entry.create("copy", [output], metadata=output.metadata)
                # Copies read like XLA's: together, just before the root.
                entry.instructions.remove(copy)
                entry.instructions.insert(entry.instructions.index(root), copy)
                root.replace_operand(index, copy)
                output = copy
                changed = True
            seen.add(id(output))
        return changed
