"""Output copies: give every result of the entry a buffer of its own.

Runs last before buffer assignment. The runtime hands each output its own
buffer, so an output may not be a parameter (the caller's input), a constant
(the executable's read-only data) or the same value as another output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.passes.base import Pass


@dataclass(frozen=True)
class AddOutputCopies(Pass):
    """Needs: a module with an entry root.

    Guarantees: the entry root is a tuple whose operands are distinct
    array-shaped instructions, none a parameter or a constant. A root that was not
    a tuple becomes the one element of a new root tuple; a tuple-shaped output (a
    multi-output fusion's result) is replaced by its leaves, as get-tuple-elements.
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
        if any(o.shape.is_tuple for o in root.operands):
            root = _flatten_root(entry, root)
            changed = True
        seen: set[tuple[int, int]] = set()
        for index, output in enumerate(root.operands):
            # get-tuple-elements only name a value (buffer assignment aliases them):
            # look through them at the instruction and leaf that define it.
            defining, key = _defining_value(output)
            if defining.opcode in ("parameter", "constant") or key in seen:
                copy = entry.create("copy", [output], metadata=output.metadata)
                # Copies read like XLA's: together, just before the root.
                entry.instructions.remove(copy)
                entry.instructions.insert(entry.instructions.index(root), copy)
                root.replace_operand(index, copy)
                key = (id(copy), -1)
                changed = True
            seen.add(key)
        return changed


def _defining_value(value: Instruction) -> tuple[Instruction, tuple[int, int]]:
    """The instruction that defines the array `value` names, and a key of that value:
    (instruction, leaf), the leaf -1 for an array-shaped instruction."""
    leaf = -1
    while value.opcode == "get-tuple-element":
        source = value.operand(0)
        if source.opcode != "tuple":
            leaf = int(value.attributes["index"])
            value = source
            break
        value = source.operand(int(value.attributes["index"]))
    return value, (id(value), leaf)


def _flatten_root(entry: Computation, root: Instruction) -> Instruction:
    """A new root tuple holding the array leaves of `root`'s operands, in flat order."""

    def leaves_of(value: Instruction) -> list[Instruction]:
        if not value.shape.is_tuple:
            return [value]
        if value.opcode == "tuple":
            return [leaf for operand in value.operands for leaf in leaves_of(operand)]
        assert value.shape.tuple_shapes is not None
        elements = [entry.create("get-tuple-element", [value], index=n)
                    for n in range(len(value.shape.tuple_shapes))]
        return [leaf for element in elements for leaf in leaves_of(element)]

    flat = entry.create("tuple", [leaf for o in root.operands for leaf in leaves_of(o)],
                        metadata=root.metadata)
    entry.instructions.remove(flat)
    entry.instructions.append(flat)
    entry.root = flat
    if not root.users:
        entry.remove(root)
    return flat
