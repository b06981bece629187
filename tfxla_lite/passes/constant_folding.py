"""Constant folding: evaluate instructions whose operands are all constants.

Runs after `simplify` and before fusion. The values come from the NumPy
reference evaluator (`tfxla_lite.hlo.evaluator`), the same definition of every
opcode that the backends are tested against, so a folded value is what the
instruction would have computed.

As XLA's `hlo_constant_folding.cc`, it keeps the module small: a result of more
than `max_elements` elements or `max_bytes` bytes is not folded, and neither is
a broadcast of a scalar (codegen splats it into a register; as a literal it would
be read from memory) nor a big iota. Parameters, tuples, calls and fusions are
never folded, and fusion computations are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tfxla_lite.hlo.evaluator import REFERENCES
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.passes.base import Pass

# Opcodes whose value is not an array computed from operand arrays alone.
# Control flow is not run at compile time: a loop may run long, or forever.
_NEVER_FOLDED = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "fusion",
                           "call", "while", "conditional"})


def _is_foldable(inst: Instruction, max_elements: int, max_bytes: int) -> bool:
    if inst.opcode in _NEVER_FOLDED or inst.opcode not in REFERENCES or inst.shape.is_tuple:
        return False
    if not all(o.opcode == "constant" for o in inst.operands):
        return False
    if inst.opcode == "broadcast" and not inst.operand(0).shape.dims and inst.shape.dims:
        return False  # a splat stays broadcast(constant)
    return inst.shape.num_elements <= max_elements and inst.shape.byte_size <= max_bytes


def fold_computation(computation: Computation, max_elements: int, max_bytes: int) -> bool:
    """Fold in topological order, so chains of constant arithmetic fold at once."""
    changed = False
    for inst in computation:
        if not _is_foldable(inst, max_elements, max_bytes):
            continue
        try:
            with np.errstate(all="ignore"):
                value = REFERENCES[inst.opcode](inst, [o.literal for o in inst.operands])
        except (TypeError, ValueError, ArithmeticError, NotImplementedError):
            continue  # the evaluator rejects it; leave it for the verifier and codegen
        value = np.array(value, copy=True)
        if value.shape != inst.shape.dims or value.dtype != inst.shape.numpy_dtype:
            continue
        value.setflags(write=False)
        constant = computation.create("constant", name="constant", metadata=inst.metadata,
                                      literal=value)
        inst.replace_all_uses_with(constant)
        operands = list(inst.operands)
        if inst is not computation.root:
            computation.remove(inst)
        for operand in operands:  # constants no one reads any more
            if operand.parent is computation and not operand.users and \
                    operand is not computation.root:
                computation.remove(operand)
        changed = True
    if changed:
        computation.sort()  # new constants were appended after their users
    return changed


@dataclass(frozen=True)
class ConstantFolding(Pass):
    """Needs: a module that verifies, before fusion.

    Guarantees: no instruction outside fusion computations whose operands are all
    constants remains, except those the size caps, the scalar-broadcast rule or
    the evaluator left; each folded value is the evaluator's, bit for bit.
    """

    name: ClassVar[str] = "constant-folding"
    max_elements: int = 1024
    max_bytes: int = 64 * 1024

    def run(self, module: HloModule) -> bool:
        changed = False
        for computation in list(module.computations):
            if not computation.is_fusion_computation:
                changed |= fold_computation(computation, self.max_elements, self.max_bytes)
        return changed
