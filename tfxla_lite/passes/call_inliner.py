"""Call inlining: every `call` of the entry (and of what it calls) replaced by the
instructions of its computation, as XLA's `call_inliner.cc` does first in its pipeline.

TF's XLA prints `call` for functions a graph calls; the passes after this one
(simplification, CSE, fusion) see across a call's boundary only once it is inlined,
and the CPU backend's kernels are straight-line code over one computation. The
callee stays in the module until DCE drops it (other callers may still use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.passes.base import Pass


def inline_call(computation: Computation, call: Instruction) -> Instruction:
    """Clone `call`'s callee into `computation` in place of `call`; the clone of its root."""
    callee = call.called_computations[0]
    assert callee.root is not None
    clones: dict[int, Instruction] = {id(p): operand
                                      for p, operand in zip(callee.parameters, call.operands)}
    for inst in callee.instructions:
        if id(inst) in clones:
            continue
        clone = Instruction(inst.opcode, inst.shape, [clones[id(o)] for o in inst.operands],
                            inst.attributes, inst.called_computations, inst.name,
                            inst.metadata or call.metadata)
        clones[id(inst)] = computation.add(clone)
    result = clones[id(callee.root)]
    call.replace_all_uses_with(result)
    computation.remove(call)
    computation.sort()
    return result


@dataclass(frozen=True)
class CallInliner(Pass):
    """Needs: a module that verifies.

    Guarantees: no `call` is left in the entry (nested calls are inlined too);
    reducers and fusion computations are untouched. The module computes the same values.
    """

    name: ClassVar[str] = "call-inliner"

    def run(self, module: HloModule) -> bool:
        entry = module.entry
        changed = False
        while entry is not None and (call := next(
                (i for i in entry.instructions if i.opcode == "call"), None)) is not None:
            inline_call(entry, call)  # the callee's own calls come along, inlined next
            changed = True
        return changed
