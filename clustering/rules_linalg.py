"""Lowering rules of TF's Cholesky, MatrixTriangularSolve and Bitcast.

Registered into `registry.OP_RULES` on import; the HLO opcodes they lower to are
`tfxla_lite/hlo/linalg.py`'s and `bit_ops.py`'s. As tf2xla does:

- `Cholesky(x)` is HLO `cholesky(x), lower=true` with the upper triangle set to zero
  (tf2xla's `Triangle`; HLO leaves that triangle to the implementation, and the StableHLO
  this project exports is read by others). A matrix that is not positive definite gives
  NaN in its lower triangle and zeros above, as TF's XLA; TF's CPU kernel fills the lower
  triangle with NaN too but leaves the upper one unwritten (TF 2.21 raises no error).
- `MatrixTriangularSolve(matrix, rhs, lower, adjoint)` broadcasts the batch dimensions
  (NumPy's rules, as the V2 kernel) and solves on the left, `transpose_a=ADJOINT` when
  `adjoint`. A zero on the diagonal divides by zero as TF's CPU kernel does (inf, -inf,
  NaN by substitution); TF's XLA, which inverts diagonal blocks, gives NaN there.
- `Bitcast(x, type)` is `bitcast-convert`, whose width rule is TF's: to a narrower type a
  minor dimension is added, from one the minor dimension is consumed.

TF has CPU kernels of Cholesky and MatrixTriangularSolve for float32 and float64 only
(and complex types, which HLO here lacks).

In auto-clustering a Cholesky of at least CHOLESKY_TF_SIZE rows stays on TF's kernel
(`tf_linalg_faster`, applied by `clustering/mark.py`'s `tf_kernels` gate), where Eigen's
blocked LLT catches up with ours (`codegen/cpu/linalg.py`); MatrixTriangularSolve always
compiles, ahead of TF's at every shape measured; `jit_compile=True` compiles both. Shapes
not known statically stay on TF. docs/benchmarks.md has the measurements
(`benchmarks/linalg.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfxla_lite.clustering.registry import (
    INTEGER,
    LoweringContext,
    attribute,
    register,
)
from tfxla_lite.hlo import Instruction, Shape

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]

LINALG = frozenset({"float32", "float64"})
# The op types of the cost rule (`tf_linalg_faster`).
LINALG_OPS = frozenset({"Cholesky", "MatrixTriangularSolve"})
CHOLESKY_TF_SIZE = 768
BITCAST = frozenset({"float16", "bfloat16", "float32", "float64", "int8", "int16", "uint8",
                     "uint16", "uint32", "uint64"}) | INTEGER


@register("Cholesky", dtypes=LINALG,
          note="a matrix that is not positive definite gives NaN below the diagonal and "
               "zeros above, as TF's XLA (TF's CPU kernel leaves the upper triangle "
               f"unwritten); auto-clustering leaves matrices from {CHOLESKY_TF_SIZE}×"
               f"{CHOLESKY_TF_SIZE} up to TF's kernel, faster there (`jit_compile=True` "
               "compiles every size)")
def _lower_cholesky(ctx: LoweringContext, op: tf.Operation, operands: Operands
                    ) -> list[Instruction]:
    (x,) = operands
    factor = ctx.emit("cholesky", [x], lower=True)
    rank = x.shape.rank
    index = Shape("s32", x.shape.dims)
    rows = ctx.emit("iota", [], shape=index, iota_dimension=rank - 2)
    columns = ctx.emit("iota", [], shape=index, iota_dimension=rank - 1)
    below = ctx.emit("compare", [rows, columns], direction="GE")
    return [ctx.emit("select", [below, factor, ctx.full(0, x.shape)])]


@register("MatrixTriangularSolve", dtypes=LINALG,
          note="a zero on the diagonal gives inf/NaN by substitution, as TF's CPU kernel "
               "(TF's XLA gives NaN)")
def _lower_matrix_triangular_solve(ctx: LoweringContext, op: tf.Operation, operands: Operands
                                   ) -> list[Instruction]:
    matrix, rhs = operands
    dims = ctx.output_shape(0).dims
    batch = dims[:-2]
    m = matrix.shape.dims[-1]
    a = ctx.broadcast_to(matrix, batch + (m, m))
    b = ctx.broadcast_to(rhs, dims)
    adjoint = bool(attribute(op, "adjoint", False))
    return [ctx.emit("triangular-solve", [a, b], left_side=True,
                     lower=bool(attribute(op, "lower", True)), unit_diagonal=False,
                     transpose_a="ADJOINT" if adjoint else "NO_TRANSPOSE")]


@register("Bitcast", dtypes=BITCAST)
def _lower_bitcast(ctx: LoweringContext, op: tf.Operation, operands: Operands
                   ) -> list[Instruction]:
    (x,) = operands
    shape = ctx.output_shape(0)
    if shape == x.shape:
        return [x]
    return [ctx.emit("bitcast-convert", [x], shape=shape)]


def tf_linalg_faster(op: tf.Operation) -> bool:
    """Whether TF's kernel is expected faster than tfxla-lite's for `op`, a Cholesky or
    MatrixTriangularSolve (the module's rule, per matrix of the batch)."""
    matrix = op.inputs[0].shape
    if matrix.rank is None or matrix.rank < 2 or matrix[-1] is None:
        return True
    if op.type == "Cholesky":
        return int(matrix[-1]) >= CHOLESKY_TF_SIZE
    rhs = op.inputs[1].shape
    return rhs.rank is None or rhs.rank < 2 or rhs[-1] is None
