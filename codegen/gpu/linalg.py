"""GPU kernels of HLO `cholesky` and `triangular-solve`: whole kernels, not element generators.

Where it sits: `kernels.plan_instruction` hands every entry `cholesky` and
`triangular-solve` to `plan_linalg` (fusion never takes one), `compiler.emit_plan` to
`linalg_template.emit_linalg`. The semantics and the order of every sum are
`tfxla_lite/hlo/linalg.py`'s (and the CPU kernels'): substitution row by row in the
operand's type; a matrix that is not positive definite is NaN throughout; a zero pivot
gives inf and NaN. Products are written `__fmul_rn`/`__dmul_rn`, so that nvcc does not
contract them into FMAs the reference does not have.

`cholesky`: a thread per matrix, which zeroes its output and works in it. The factor is
lower; `lower=false` reads and writes the transposed positions. `triangular-solve`: a
thread per right-hand side (a column of `b` on the left side, a row on the right),
since those are independent; each substitutes through the kernel's own output. Small
matrices (the case `clustering/rules_linalg.py` compiles) run well this way; a blocked,
block-per-matrix form would be next for large ones.
"""

from __future__ import annotations

from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan, Launch
from tfxla_lite.hlo.ir import Instruction

LINALG_OPCODES = frozenset({"cholesky", "triangular-solve"})  # the opcodes `plan_linalg` takes
THREADS = 64


def _matrices(inst: Instruction) -> int:
    count = 1
    for size in inst.shape.dims[:-2]:
        count *= size
    return count


def plan_linalg(inst: Instruction, name: str) -> KernelPlan:
    """The plan of an entry cholesky (a thread per matrix) or triangular-solve (a thread
    per right-hand side)."""
    element_type = inst.shape.element_type
    if element_type not in ("f32", "f64"):
        raise NotImplementedError(f"GPU backend: {inst.opcode} of {element_type} (%{inst.name})")
    if inst.opcode == "cholesky":
        units = _matrices(inst) if inst.shape.dims[-1] else 0
    else:
        left = bool(inst.attributes.get("left_side", False))
        units = _matrices(inst) * inst.shape.dims[-1 if left else -2]
        if not inst.operand(0).shape.dims[-1]:
            units = 0  # nothing to solve: b is empty too
    return KernelPlan("linalg", name, [inst], Launch((THREADS, 1), units, THREADS),
                      rows=units)
