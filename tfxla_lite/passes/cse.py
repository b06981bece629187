"""Common subexpression elimination: one instruction per distinct computed value.

Runs after constant folding, which may produce equal constants, and before DCE
and fusion. Two instructions are the same value when they have the same opcode,
shape, operands (in any order for commutative ops), attributes and called
computations; constants when they have the same type, shape and bytes (so
-0.0 and 0.0 differ, and equal NaNs match). Parameters are never merged. The
first instruction in topological order is kept, with its metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import is_commutative
from tfxla_lite.passes.base import Pass


def _frozen(value: Any) -> Any:
    """A hashable stand-in for an attribute value that equals only equal values."""
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return ("array", array.dtype.str, array.shape, array.tobytes())
    if isinstance(value, np.generic):
        return _frozen(np.asarray(value))
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    return (type(value).__name__, value)


def value_key(inst: Instruction, operands: list[int] | None = None) -> tuple:
    """What makes two instructions compute the same value; `operands`: numbers standing
    for the operands' values (default: the operand instructions' identities)."""
    operands = [id(o) for o in inst.operands] if operands is None else list(operands)
    commutative = is_commutative(inst.opcode) or (
        inst.opcode == "compare" and inst.attributes.get("direction") in ("EQ", "NE"))
    if commutative:
        operands.sort()
    attributes = tuple(sorted((k, _frozen(v)) for k, v in inst.attributes.items()))
    called = tuple(id(c) for c in inst.called_computations)
    return (inst.opcode, inst.shape, tuple(operands), attributes, called)


def eliminate_common_subexpressions(computation: Computation) -> bool:
    """Merge equal instructions of `computation`; True when any was merged."""
    kept: dict[tuple, Instruction] = {}
    changed = False
    # In topological order an instruction's operands are already merged, so equal
    # chains collapse in one sweep.
    for inst in computation:
        if inst.opcode == "parameter":
            continue
        key = value_key(inst)
        first = kept.setdefault(key, inst)
        if first is inst:
            continue
        inst.replace_all_uses_with(first)
        computation.remove(inst)
        changed = True
    return changed


@dataclass(frozen=True)
class CommonSubexpressionElimination(Pass):
    """Needs: a module that verifies.

    Guarantees: in every computation no two instructions other than parameters
    compute the same value by `value_key`; each merged use now reads the first
    of them. Values, shapes and the order of what is kept are unchanged.
    """

    name: ClassVar[str] = "cse"

    def run(self, module: HloModule) -> bool:
        changed = False
        for computation in module.computations:
            changed |= eliminate_common_subexpressions(computation)
        return changed
