"""HLO `cholesky` and `triangular-solve`: shape rules and NumPy references, as XLA defines them.

Both substitute in the operand's type, row by row in the order the CPU kernels
(`codegen/cpu/linalg.py`) use, so the two agree to rounding. A matrix that is not
positive definite gives NaN throughout (XLA's `CholeskyExpander`); a zero on a diagonal
gives inf and NaN, never an error. The attributes and their meaning: docs/hlo_text.md,
"Linear algebra, bits and random numbers".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.hlo.shape import Shape

if TYPE_CHECKING:  # ir imports opcodes, which imports this module
    from tfxla_lite.hlo.ir import Instruction

LINALG_TYPES = ("f32", "f64")
TRANSPOSE_KINDS = ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT")


class LinalgShapeError(ValueError):
    """Operands or attributes cholesky or triangular-solve do not take."""


def _square_batches(shape: Shape, opcode: str, what: str) -> int:
    if shape.is_tuple or shape.rank < 2 or shape.dims[-1] != shape.dims[-2]:
        raise LinalgShapeError(f"{opcode} takes {what} of square matrices [..., n, n], "
                               f"got {shape}")
    if shape.element_type not in LINALG_TYPES:
        raise LinalgShapeError(f"not supported: {opcode} of {shape.element_type} "
                               f"(f32 and f64 only)")
    return shape.dims[-1]


def _flag(attributes: Mapping[str, Any], key: str, opcode: str) -> bool:
    value = attributes.get(key, False)
    if not isinstance(value, bool):
        raise LinalgShapeError(f"{opcode}'s {key} is true or false, got {value!r}")
    return value


def cholesky_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    if len(shapes) != 1:
        raise LinalgShapeError(f"cholesky takes one operand, got {len(shapes)}")
    _square_batches(shapes[0], "cholesky", "an array")
    _flag(attributes, "lower", "cholesky")
    return shapes[0]


def transpose_kind(attributes: Mapping[str, Any]) -> str:
    kind = str(attributes.get("transpose_a", "NO_TRANSPOSE"))
    if kind not in TRANSPOSE_KINDS:
        raise LinalgShapeError(f"triangular-solve transpose_a is one of "
                               f"{', '.join(TRANSPOSE_KINDS)}, got {kind}")
    return kind


def triangular_solve_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    if len(shapes) != 2:
        raise LinalgShapeError(f"triangular-solve takes a and b, got {len(shapes)} operands")
    a, b = shapes
    k = _square_batches(a, "triangular-solve", "a")
    for key in ("left_side", "lower", "unit_diagonal"):
        _flag(attributes, key, "triangular-solve")
    transpose_kind(attributes)
    left = bool(attributes.get("left_side", False))
    if b.is_tuple or b.rank != a.rank or b.element_type != a.element_type \
            or b.dims[:-2] != a.dims[:-2] or b.dims[-2 if left else -1] != k:
        side = "rows" if left else "columns"
        raise LinalgShapeError(f"triangular-solve b {b} must have a's type and batch dims "
                               f"and {k} {side} (a is {a}, left_side={str(left).lower()})")
    return b


def cholesky_reference(a: np.ndarray, lower: bool) -> np.ndarray:
    a = np.asarray(a)
    x = a if lower else np.swapaxes(a, -1, -2)
    n = x.shape[-1]
    result = np.zeros_like(x)
    failed = np.zeros(x.shape[:-2], dtype=bool)
    with np.errstate(all="ignore"):
        for j in range(n):
            row = result[..., j, :j]
            pivot = np.sqrt(x[..., j, j] - np.einsum("...k,...k->...", row, row))
            failed |= np.isnan(pivot)
            result[..., j, j] = pivot
            if j + 1 < n:
                below = x[..., j + 1:, j] - np.einsum("...ik,...k->...i",
                                                     result[..., j + 1:, :j], row)
                result[..., j + 1:, j] = below / pivot[..., None]
    result[failed] = np.nan
    return result if lower else np.swapaxes(result, -1, -2).copy()


def triangular_solve_reference(a: np.ndarray, b: np.ndarray, left_side: bool, lower: bool,
                               unit_diagonal: bool, transpose_a: str) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    k = a.shape[-1]
    keep = np.tril(np.ones((k, k), bool)) if lower else np.triu(np.ones((k, k), bool))
    t = np.where(keep, a, np.zeros((), a.dtype))
    if unit_diagonal:
        t = np.where(np.eye(k, dtype=bool), np.ones((), a.dtype), t)
    if transpose_a != "NO_TRANSPOSE":
        t = np.swapaxes(t, -1, -2)
    # x op(a) = b is op(a)ᵀ xᵀ = bᵀ: one left-side solve.
    if not left_side:
        t, b = np.swapaxes(t, -1, -2), np.swapaxes(b, -1, -2)
    t_lower = lower != (transpose_a != "NO_TRANSPOSE")
    t_lower = t_lower if left_side else not t_lower
    x = np.zeros_like(b)
    order = range(k) if t_lower else range(k - 1, -1, -1)
    solved: list[int] = []
    with np.errstate(all="ignore"):
        for i in order:
            row = b[..., i, :].copy()
            for j in solved:
                row = row - t[..., i, j][..., None] * x[..., j, :]
            x[..., i, :] = row if unit_diagonal else row / t[..., i, i][..., None]
            solved.append(i)
    return x if left_side else np.swapaxes(x, -1, -2).copy()


def _cholesky(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    return cholesky_reference(operands[0], bool(inst.attributes.get("lower", False)))


def _triangular_solve(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    a = inst.attributes
    return triangular_solve_reference(operands[0], operands[1],
                                      bool(a.get("left_side", False)),
                                      bool(a.get("lower", False)),
                                      bool(a.get("unit_diagonal", False)), transpose_kind(a))


# The evaluator's references of these opcodes (`evaluator.REFERENCES`).
REFERENCES = {"cholesky": _cholesky, "triangular-solve": _triangular_solve}
