"""The default per-op choice between TF's Cholesky and MatrixTriangularSolve kernels and
tfxla-lite's (`clustering/rules_linalg.py`'s `tf_linalg_faster`, applied by mark.py's
`tf_kernels` gate in auto-clustering): Cholesky by the matrices' order, the solve by its
order and right-hand sides, unknown shapes left to TF, and `jit_compile=True` compiling
every shape."""

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
    SOLVE_TF_COLUMNS,
    SOLVE_TF_SIZE,
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
def test_triangular_solve_by_order_and_right_hand_sides(lower: bool, adjoint: bool) -> None:
    n, columns = SOLVE_TF_SIZE, SOLVE_TF_COLUMNS
    wide, graph = _solve((n, n), (n, columns), lower=lower, adjoint=adjoint)
    assert tf_linalg_faster(wide)
    decision = mark(graph, GATED)[wide.name]
    assert not decision.compilable and "rules_linalg.py" in decision.reason
    for a_dims, b_dims in [((3, n, n), (3, n, columns - 1)),  # few right-hand sides
                           ((n - 1, n - 1), (n - 1, 4 * columns)),  # a smaller matrix
                           ((1, 4 * n, 4 * n), (64, 4 * n, 8))]:  # per matrix, broadcast
        narrow, graph = _solve(a_dims, b_dims, lower=lower, adjoint=adjoint)
        assert not tf_linalg_faster(narrow), (a_dims, b_dims)
        assert mark(graph, GATED)[narrow.name].compilable


def test_ungated_and_unknown_orders() -> None:
    large, graph = _cholesky((CHOLESKY_TF_SIZE,) * 2)
    assert mark(graph)[large.name].compilable  # the gate is off unless asked for

    @tf.function(input_signature=[tf.TensorSpec([None, None, None])])
    def unknown(x: tf.Tensor) -> tf.Tensor:
        return tf.linalg.cholesky(x)

    (op,) = [op for op in unknown.get_concrete_function().graph.get_operations()
             if op.type == "Cholesky"]
    assert tf_linalg_faster(op)


def test_auto_mode_leaves_large_ones_to_tf_and_jit_compile_compiles_them() -> None:
    n = CHOLESKY_TF_SIZE
    columns = SOLVE_TF_COLUMNS
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
    assert set(left) >= LINALG_OPS, report
    assert all(TF_KERNEL_REASON in left[t] for t in LINALG_OPS)
    assert report.clusters  # the multiply and the add still compile

    must = tl.function(fn, jit_compile=True, options=options)
    assert_close(must(a, b).numpy(), expected, "MatrixTriangularSolve", "jit_compile")
    report = must.explain(a, b)
    assert not report.runs_on_xla
    assert not {f.op_type for f in report.fallbacks} & LINALG_OPS, report
