"""Lowering rules of TF's Cholesky, MatrixTriangularSolve and Bitcast.

Registered into `registry.OP_RULES` on import, as tf2xla lowers them, onto the opcodes of
`tfxla_lite/hlo/linalg.py` and `bit_ops.py`. Cholesky zeroes the upper triangle (HLO
leaves it to the implementation). In auto-clustering a Cholesky of at least
`CHOLESKY_TF_SIZE` rows stays on TF's kernel (`tf_linalg_faster`), faster there. Each
op's values against TF's: docs/supported_ops.md; measurements: docs/benchmarks.md.
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
