"""Which dot epilogues cuBLASLt computes exactly, read off a kOutput fusion's HLO.

Part of kernel planning (`kernels.plan_instruction`, plan kind `dot-epilogue`): pure
Python, no CuPy. A kOutput fusion is a library dot plus an elementwise epilogue. Where
the epilogue is one cuBLASLt's `cublasLtMatmul` applies itself, the executable runs the
whole fusion as one cuBLASLt call (`cublaslt.py`): no product in scratch memory, no loop
kernel. The forms taken, and only these (each computed by cuBLASLt in f32 from the f32
accumulator, rounded once into the output):

- `dot + broadcast(b)`, b a vector along the output's minor (rhs free) dimensions and a
  parameter of the fusion: `CUBLASLT_EPILOGUE_BIAS`. The GEMM computes out^T (n x m,
  column-major, `gemm.py`), whose rows are the output's minor dimensions: cuBLASLt's bias
  runs along D's rows, so a bias along the output's rows (m) is not one of them.
- `maximum(x, 0)` of the dot (or of the biased dot): `CUBLASLT_EPILOGUE_RELU` and
  `CUBLASLT_EPILOGUE_RELU_BIAS`.

Not taken: GELU. cuBLASLt documents its GELU as the tanh approximation
0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))); TF's and Keras's default `gelu`
(`approximate=False`) is 0.5x(1 + erf(x/sqrt(2))), which differs from it by up to 4.7e-4
absolute (at x = 2.7) and 22% relative in the negative tail, far outside the f32
tolerance (rtol 2e-5). `approximate=True` is the tanh form, but how exactly cuBLASLt
evaluates its tanh is not documented and cannot be checked without a GPU, so it is not
recognized either. Nor scales, updates (`w - lr * dot`) or anything else: those keep
the cuBLAS product plus a loop kernel. f64 dots keep it too (the epilogues are used
here for f16, bf16 and f32 with f32 compute only).

The `cublaslt_epilogues` option (`TFXLA_LITE_CUBLASLT=0`) turns the fusion off, so that a GPU
run can time both paths (`benchmarks/gpu.py --cublaslt-ab`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tfxla_lite.flags import SWITCH_VARIABLES, switch
from tfxla_lite.hlo.ir import Instruction

SWITCH = SWITCH_VARIABLES["cublaslt_epilogues"]
LT_TYPES = frozenset({"f16", "bf16", "f32"})
# cublasLtEpilogue_t (cublasLt.h).
EPILOGUES = {"BIAS": 4, "RELU": 2, "RELU_BIAS": 6}


@dataclass(frozen=True)
class LtEpilogue:
    """The epilogue cuBLASLt applies: `name` (a key of EPILOGUES) and the fusion operand
    holding the bias vector (None without a bias)."""

    name: str
    bias_operand: int | None

    @property
    def code(self) -> int:
        return EPILOGUES[self.name]


def enabled() -> bool:
    """The process's `cublaslt_epilogues` option (`TFXLA_LITE_CUBLASLT`; unset: on). Read
    per plan, not cached, so that a benchmark can time both paths in one process."""
    return switch("cublaslt_epilogues")


def lt_epilogue(fusion: Instruction, dot: Instruction) -> LtEpilogue | str:
    """The cuBLASLt epilogue computing `fusion` (a kOutput fusion around `dot`), or why
    it stays a cuBLAS product and a loop kernel."""
    if not enabled():
        return f"cuBLASLt epilogues switched off ({SWITCH})"
    if dot.shape.element_type not in LT_TYPES:
        return (f"{dot.shape.element_type} dot: cuBLASLt epilogues are used for f16, bf16 "
                "and f32 only")
    root = fusion.fused_computation.root
    assert root is not None
    relu = False
    if root.opcode == "maximum":
        zeros = [o for o in root.operands if _is_zero(o)]
        if len(zeros) == 1:
            relu = True
            root = next(o for o in root.operands if o is not zeros[0])
    if root is dot:
        return LtEpilogue("RELU", None) if relu else _not_fused(fusion)
    if root.opcode != "add" or dot not in root.operands or root.operand(0) is root.operand(1):
        return _not_fused(fusion)
    addend = root.operand(1) if root.operand(0) is dot else root.operand(0)
    bias = _minor_bias(addend, dot)
    if isinstance(bias, str):
        return bias
    return LtEpilogue("RELU_BIAS" if relu else "BIAS", bias)


def _not_fused(fusion: Instruction) -> str:
    ops = sorted({i.opcode for i in fusion.fused_computation.instructions} -
                 {"parameter", "dot", "constant", "broadcast"})
    return (f"epilogue ({', '.join(ops) or 'none'}) is not one cuBLASLt computes exactly "
            "(bias along the output's minor dimensions, relu as max(x, 0), or both)")


def _is_zero(inst: Instruction) -> bool:
    """A constant 0 (either sign), or a broadcast of one."""
    if inst.opcode == "broadcast":
        inst = inst.operand(0)
    if inst.opcode != "constant":
        return False
    literal = np.asarray(inst.literal)
    return literal.size > 0 and bool(np.all(literal.astype(np.float64) == 0.0))


def _minor_bias(addend: Instruction, dot: Instruction) -> int | str:
    """The fusion parameter number of a bias vector broadcast along the dot's rhs free
    dimensions (the output's minor ones), or why `addend` is not one."""
    rank = dot.shape.rank
    rhs_free = dot.operand(1).shape.rank - len(dot.attributes.get("rhs_batch_dims", ())) - \
        len(dot.attributes.get("rhs_contracting_dims", ()))
    minor = tuple(range(rank - rhs_free, rank))
    if addend.opcode != "broadcast" or addend.operand(0).opcode != "parameter":
        return "the addend is not a vector parameter broadcast inside the fusion"
    if not minor or tuple(addend.dimensions) != minor:
        return (f"the bias runs along dimensions {tuple(addend.dimensions)} of the output; "
                f"cuBLASLt's bias runs along D's rows, the output's minor dimensions {minor}")
    vector = addend.operand(0)
    if vector.shape.element_type != dot.shape.element_type:
        return "the bias is of another type than the product"
    return vector.parameter_number


def describe(epilogue: LtEpilogue | str) -> str:
    """The kernel plan's words for a dot-epilogue's cuBLASLt decision."""
    if isinstance(epilogue, str):
        return f"not fused by cuBLASLt: {epilogue}"
    bias = "" if epilogue.bias_operand is None else \
        f", bias from fusion operand {epilogue.bias_operand}"
    return (f"fused by cuBLASLt: one cublasLtMatmul with CUBLASLT_EPILOGUE_{epilogue.name}"
            f"{bias}, no scratch product and no loop kernel (the loop kernel is kept for "
            "executables that cannot load cuBLASLt or get no algorithm from it)")
