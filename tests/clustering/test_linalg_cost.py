"""The default per-op choice between TF's Cholesky and MatrixTriangularSolve kernels and
tfxla-lite's (`clustering/rules_linalg.py`'s `tf_linalg_faster`, applied by mark.py's
`tf_kernels` gate in auto-clustering): Cholesky by the matrices' order, the solve compiled
at every known shape, unknown shapes left to TF, and `jit_compile=True` compiling every
shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import trace
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.clustering.mark import TF_KERNEL_REASON, MarkOptions, mark
from tfxla_lite.clustering.rules_linalg import (
    CHOLESKY_TF_SIZE,
    LINALG_OPS,
    tf_linalg_faster,
)

GATED = MarkOptions(tf_kernels=LINALG_OPS)


def _spd(dims: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = dims[-1]
    x = rng.standard_normal(dims)
    return (x @ np.swapaxes(x, -1, -2) / n + np.eye(n)).astype(np.float32)


def _op(fn: Callable[..., Any], shapes: list[tuple[int, ...]], op_type: str
        ) -> tuple[tf.Operation, Any]:
    concrete = trace(fn, [np.zeros(s, np.float32) for s in shapes])
    (op,) = [op for op in concrete.graph.get_operations() if op.type == op_type]
    return op, concrete.graph


def _cholesky(dims: tuple[int, ...]) -> tuple[tf.Operation, Any]:
    return _op(tf.linalg.cholesky, [dims], "Cholesky")


def _solve(a_dims: tuple[int, ...], b_dims: tuple[int, ...], **flags: bool
           ) -> tuple[tf.Operation, Any]:
    return _op(lambda m, r: tf.linalg.triangular_solve(m, r, **flags), [a_dims, b_dims],
               "MatrixTriangularSolve")


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_cholesky_by_order(batch: tuple[int, ...]) -> None:
    small, graph = _cholesky(batch + (CHOLESKY_TF_SIZE - 1,) * 2)
    assert not tf_linalg_faster(small)
    assert mark(graph, GATED)[small.name].compilable
    large, graph = _cholesky(batch + (CHOLESKY_TF_SIZE,) * 2)
    assert tf_linalg_faster(large)
    decision = mark(graph, GATED)[large.name]
    assert not decision.compilable and TF_KERNEL_REASON in decision.reason
    assert "rules_linalg.py" in decision.reason


@pytest.mark.parametrize("lower, adjoint", [(True, False), (False, True)])
def test_triangular_solve_of_known_shape_compiles(lower: bool, adjoint: bool) -> None:
    for a_dims, b_dims in [((3, 16, 16), (3, 16, 8)), ((1024, 1024), (1024, 256)),
                           ((1, 512, 512), (4, 512, 512))]:
        op, graph = _solve(a_dims, b_dims, lower=lower, adjoint=adjoint)
        assert not tf_linalg_faster(op), (a_dims, b_dims)
        assert mark(graph, GATED)[op.name].compilable


def test_ungated_and_unknown_orders() -> None:
    large, graph = _cholesky((CHOLESKY_TF_SIZE,) * 2)
    assert mark(graph)[large.name].compilable  # the gate is off unless asked for

    @tf.function(input_signature=[tf.TensorSpec([None, None, None]),
                                  tf.TensorSpec([2, 4, None])])
    def unknown(x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        return [tf.linalg.cholesky(x), tf.linalg.triangular_solve(tf.ones([2, 4, 4]), y)]

    ops = [op for op in unknown.get_concrete_function().graph.get_operations()
           if op.type in LINALG_OPS]
    assert len(ops) == 2 and all(tf_linalg_faster(op) for op in ops)


def test_auto_mode_leaves_large_ones_to_tf_and_jit_compile_compiles_them() -> None:
    n, columns = CHOLESKY_TF_SIZE, 40
    a = tf.constant(_spd((2, n, n)))
    b = tf.constant(np.random.default_rng(1).standard_normal((2, n, columns))
                    .astype(np.float32))

    def fn(matrix: tf.Tensor, rhs: tf.Tensor) -> tf.Tensor:
        return tf.linalg.triangular_solve(tf.linalg.cholesky(matrix * 2.0), rhs) + 1.0

    expected = fn(a, b).numpy()
    options = tl.Options(min_cluster_size=1, verify=True)
    auto = tl.function(fn, options=options)
    assert_close(auto(a, b).numpy(), expected, "MatrixTriangularSolve", "auto")
    report = auto.explain(a, b)
    left = {f.op_type: f.reason for f in report.fallbacks}
    assert "Cholesky" in left and TF_KERNEL_REASON in left["Cholesky"], report
    assert "MatrixTriangularSolve" not in left, report  # compiled, with the add
    assert report.clusters

    must = tl.function(fn, jit_compile=True, options=options)
    assert_close(must(a, b).numpy(), expected, "MatrixTriangularSolve", "jit_compile")
    report = must.explain(a, b)
    assert not report.runs_on_xla
    assert not {f.op_type for f in report.fallbacks} & LINALG_OPS, report
