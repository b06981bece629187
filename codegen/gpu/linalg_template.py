"""The CUDA text of the `cholesky` and `triangular-solve` kernels (`linalg.py` plans them
and says how they work): `emit_linalg`, the template of the `linalg` plan kind.
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.cuda_source import Writer, literal, storage_type
from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.linalg import THREADS
from tfxla_lite.codegen.gpu.templates import KernelSource, _header, _signature
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.linalg import transpose_kind

# Products that nvcc must not contract into an FMA with the next subtraction.
_MULTIPLY = {"f32": "__fmul_rn", "f64": "__dmul_rn"}
_SQRT = {"f32": "sqrtf", "f64": "sqrt"}


def emit_linalg(plan: KernelPlan, assignment: Any, tables: Any) -> KernelSource:
    """The CUDA text of a `linalg` plan."""
    (inst,) = plan.members
    params, names = _signature(plan, assignment)
    output = names[id(inst)]
    inputs = [names[id(o)] for o in inst.operands]
    w = Writer()
    w.open(_header(plan.name, params, THREADS))
    if plan.rows:
        w.open(f"for (long long u = blockIdx.x * (long long)blockDim.x + threadIdx.x; "
               f"u < {plan.rows}LL; u += (long long)gridDim.x * blockDim.x)")
        if inst.opcode == "cholesky":
            _cholesky(w, inst, output, inputs[0])
        else:
            _triangular_solve(w, inst, output, inputs)
        w.close()
    w.close()
    return KernelSource(plan, [plan.name], w.text())


def _cholesky(w: Writer, inst: Instruction, output: str, operand: str) -> None:
    element_type = inst.shape.element_type
    t, mul = storage_type(element_type), _MULTIPLY[element_type]
    n = inst.shape.dims[-1]
    lower = bool(inst.attributes.get("lower", False))

    def at(i: str, j: str) -> str:  # factor element (i, j), i >= j, in either buffer
        return f"{i} * {n} + {j}" if lower else f"{j} * {n} + {i}"

    w.line(f"{t}* const o = {output} + u * {n * n};")
    w.line(f"const {t}* const a = {operand} + u * {n * n};")
    w.line(f"for (int e = 0; e < {n * n}; e++) o[e] = {literal(element_type, 0)};")
    w.line("bool failed = false;")
    w.open(f"for (int j = 0; j < {n}; j++)")
    w.line(f"{t} dot = {literal(element_type, 0)};")
    w.line(f"for (int k = 0; k < j; k++) dot = dot + {mul}(o[{at('j', 'k')}], "
           f"o[{at('j', 'k')}]);")
    w.line(f"const {t} pivot = {_SQRT[element_type]}(a[{at('j', 'j')}] - dot);")
    w.line("failed = failed || pivot != pivot;")
    w.line(f"o[{at('j', 'j')}] = pivot;")
    w.open(f"for (int i = j + 1; i < {n}; i++)")
    w.line(f"{t} d = {literal(element_type, 0)};")
    w.line(f"for (int k = 0; k < j; k++) d = d + {mul}(o[{at('i', 'k')}], o[{at('j', 'k')}]);")
    w.line(f"o[{at('i', 'j')}] = (a[{at('i', 'j')}] - d) / pivot;")
    w.close()
    w.close()
    w.line(f"if (failed) for (int e = 0; e < {n * n}; e++) o[e] = "
           f"{literal(element_type, float('nan'))};")


def _triangular_solve(w: Writer, inst: Instruction, output: str, inputs: list[str]) -> None:
    element_type = inst.shape.element_type
    t, mul = storage_type(element_type), _MULTIPLY[element_type]
    attributes = inst.attributes
    left = bool(attributes.get("left_side", False))
    lower = bool(attributes.get("lower", False))
    unit = bool(attributes.get("unit_diagonal", False))
    transposed = transpose_kind(attributes) != "NO_TRANSPOSE"  # ADJOINT of reals: TRANSPOSE
    k = inst.operand(0).shape.dims[-1]
    columns = inst.shape.dims[-1 if left else -2]  # right-hand sides per matrix
    # The reference solves t x = b on the left: t = op(a), transposed again (and b with
    # it) for a right-side solve; forward when that t is lower.
    swap = transposed != (not left)
    forward = (lower != transposed) if left else not (lower != transposed)

    def a_at(i: str, j: str) -> str:  # t(i, j): a's masked element
        p, q = (j, i) if swap else (i, j)
        keep = f"{p} >= {q}" if lower else f"{p} <= {q}"
        value = f"(({keep}) ? a[{p} * {k} + {q}] : {literal(element_type, 0)})"
        return f"({p} == {q} ? {literal(element_type, 1)} : {value})" if unit else value

    def b_at(i: str) -> str:  # element i of this thread's right-hand side in b or x
        return f"{i} * {columns} + c" if left else f"c * {k} + {i}"

    w.line(f"const long long m = u / {columns}, c = u % {columns};")
    w.line(f"const {t}* const a = {inputs[0]} + m * {k * k};")
    w.line(f"const {t}* const b = {inputs[1]} + m * {k * columns};")
    w.line(f"{t}* const x = {output} + m * {k * columns};")
    w.open(f"for (int s = 0; s < {k}; s++)")
    w.line(f"const int i = {'s' if forward else f'{k - 1} - s'};")
    w.line(f"{t} v = b[{b_at('i')}];")
    w.open("for (int r = 0; r < s; r++)")
    w.line(f"const int j = {'r' if forward else f'{k - 1} - r'};")
    w.line(f"v = v - {mul}({a_at('i', 'j')}, x[{b_at('j')}]);")
    w.close()
    solved = "v" if unit else f"v / {a_at('i', 'i')}"
    w.line(f"x[{b_at('i')}] = {solved};")
    w.close()
