"""Cholesky, MatrixTriangularSolve and Bitcast lowered to HLO, against TF: float32 and
float64, batch dims (broadcast ones for the solve), 0- and 1-sized matrices, matrices that
are not positive definite, singular and NaN-holding ones, both modes of `tl.function`;
and rng-bit-generator's reference bit for bit against the HLO TF's XLA runs for
stateless random bits (Philox and ThreeFry)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, check_in_both_modes
from tolerances import assert_close

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

# Read by test_clustering_ops.test_every_registered_op_is_tested.
TESTED_OPS = frozenset({"Cholesky", "MatrixTriangularSolve", "Bitcast"})


def _spd(dims: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = dims[-1]
    x = rng.standard_normal(dims)
    return (x @ np.swapaxes(x, -1, -2) + n * np.eye(n)).astype(dtype)




@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dims", [(4, 4), (3, 5, 5), (2, 2, 1, 1), (0, 0), (2, 0, 0), (0, 3, 3),
                                  (24, 24)])
def test_cholesky(dtype: Any, dims: tuple[int, ...]) -> None:
    check_against_tf(lambda x: tf.linalg.cholesky(x), [_spd(dims, dtype)], "Cholesky")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cholesky_bad_matrices_match_tf(dtype: Any) -> None:
    a = _spd((5, 4, 4), dtype)
    a[1] = 0.0
    a[2, -1, -1] = -5.0  # not positive definite at the last pivot
    a[3, 0, 0] = np.nan
    a[4] = np.array([[1, 2, 0, 0], [2, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype)
    # TF's CPU kernel fills a failed matrix's lower triangle with NaN and leaves the upper
    # one unwritten (whatever the buffer held); TF's XLA, and this lowering, zero it.
    eager = tf.linalg.cholesky(tf.constant(a)).numpy()
    xla = tf.function(tf.linalg.cholesky, jit_compile=True)(tf.constant(a)).numpy()
    expected = np.tril(eager)
    assert_close(xla, expected, "Cholesky", "TF's XLA")
    check_against_tf(lambda x: tf.linalg.cholesky(x), [a], "Cholesky", expected=[expected])


@pytest.mark.parametrize("lower, adjoint", [(True, False), (False, True), (True, True),
                                            (False, False)])
@pytest.mark.parametrize("dtype, a_dims, b_dims", [
    (np.float32, (4, 4), (4, 3)), (np.float64, (2, 5, 5), (2, 5, 1)),
    (np.float32, (3, 1, 4, 4), (2, 4, 2)), (np.float64, (1, 1), (1, 0)),
    (np.float32, (0, 0), (0, 2)), (np.float64, (2, 3, 3), (3, 2))])
def test_matrix_triangular_solve(dtype: Any, lower: bool, adjoint: bool,
                                 a_dims: tuple[int, ...], b_dims: tuple[int, ...]) -> None:
    a = _spd(a_dims, dtype) if a_dims[-1] else np.zeros(a_dims, dtype)
    b = np.random.default_rng(1).standard_normal(b_dims).astype(dtype)

    def fn(matrix: tf.Tensor, rhs: tf.Tensor) -> tf.Tensor:
        return tf.linalg.triangular_solve(matrix, rhs, lower=lower, adjoint=adjoint)

    check_against_tf(fn, [a, b], "MatrixTriangularSolve")


def test_matrix_triangular_solve_singular_matches_tf_kernel() -> None:
    a = np.array([[[0.0, 0.0], [1.0, 2.0]], [[1.0, 0.0], [np.nan, 3.0]]], np.float32)
    b = np.ones((2, 2, 1), np.float32)
    check_against_tf(lambda m, r: tf.linalg.triangular_solve(m, r), [a, b],
                     "MatrixTriangularSolve")


# (input, bitcast to, then to, dims): clusters give out only the types they hold in
# TF's Identity (no uint8, uint16, uint32), so the narrow ones are bitcast on.
@pytest.mark.parametrize("source, middle, final, dims", [
    (np.float32, tf.int32, tf.float32, (3, 4)), (np.float32, tf.uint8, tf.int32, (2, 3)),
    (np.int64, tf.uint16, tf.float64, (5,)), (np.float64, tf.uint32, tf.int64, (3,)),
    (np.int32, tf.float16, tf.float16, (2, 2)), (np.float32, tf.bfloat16, tf.bfloat16, (7,)),
    (np.int64, tf.float32, tf.float32, (0, 3)), (np.int64, tf.float64, tf.float64, (4,))])
def test_bitcast(source: Any, middle: tf.DType, final: tf.DType, dims: tuple[int, ...]) -> None:
    rng = np.random.default_rng(2)
    size = int(np.prod(dims)) * np.dtype(source).itemsize
    x = rng.integers(0, 256, size, dtype=np.uint8).view(source).reshape(dims)
    if np.dtype(source).kind == "f":
        x = np.where(np.isfinite(x), x, np.zeros((), source))

    def compare(actual: np.ndarray, expected: np.ndarray, op_type: str, context: str) -> None:
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, context
        np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8), context)

    check_against_tf(lambda t: tf.bitcast(tf.bitcast(t, middle), final), [x], "Bitcast",
                     compare=compare)


def test_linear_algebra_in_both_modes() -> None:
    a = _spd((3, 4, 4), np.float32)
    b = np.random.default_rng(3).standard_normal((3, 4, 2)).astype(np.float32)

    def fn(matrix: tf.Tensor, rhs: tf.Tensor) -> tf.Tensor:
        factor = tf.linalg.cholesky(matrix)
        y = tf.linalg.triangular_solve(factor, rhs, lower=True)
        return tf.linalg.triangular_solve(factor, y, lower=True, adjoint=True)

    check_in_both_modes(fn, [tf.constant(a), tf.constant(b)], "MatrixTriangularSolve",
                        {"Cholesky", "MatrixTriangularSolve"})
    x = fn(tf.constant(a), tf.constant(b)).numpy()
    assert_close(np.einsum("bij,bjk->bik", a, x), b, "MatrixTriangularSolve")


@pytest.mark.parametrize("alg", [1, 2])  # Philox, ThreeFry
@pytest.mark.parametrize("dtype, dims", [(tf.uint32, [5]), (tf.uint64, [3, 3]),
                                         (tf.uint32, [3, 5]), (tf.uint32, []),
                                         (tf.int32, [7, 3]), (tf.uint64, [1]),
                                         (tf.int64, [0, 2])])
def test_rng_bit_generator_matches_tf_xla(alg: int, dtype: tf.DType, dims: list[int]) -> None:
    key = tf.constant([0x123456789ABCDEF0], tf.uint64)
    counter = tf.constant([2**64 - 2, 7], tf.uint64)  # the low word carries

    @tf.function(jit_compile=True)
    def bits(key: tf.Tensor, counter: tf.Tensor) -> tf.Tensor:
        return tf.raw_ops.StatelessRandomUniformFullIntV2(shape=dims, key=key, counter=counter,
                                                          alg=alg, dtype=dtype)

    text = bits.experimental_get_compiler_ir(key, counter)(stage="hlo")
    assert "rng-bit-generator" in text
    result = evaluate(parse_module(text), key.numpy(), counter.numpy())
    result = result[0] if isinstance(result, tuple) else result
    np.testing.assert_array_equal(np.asarray(result), bits(key, counter).numpy())
