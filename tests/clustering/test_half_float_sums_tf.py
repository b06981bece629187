"""TF's reduce_sum and reduce_prod of float16/bfloat16 through tfxla-lite, against TF's XLA.

TF's XLA bridge sums 2-byte floats in f32 and rounds once (tf2xla's
SumAccumulationType), and so does tfxla-lite (`LoweringContext.reduce`, then the CPU
backend's f32 reduce). TF's own float16 kernel does not: a column of 4096 ones sums to
2048 and ±60000 pairs overflow to NaN there; those cases, a long row of tenths and a
product are checked here against XLA and against the exact result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.options import Options

HALVES = [tf.float16, tf.bfloat16]


def _cancelling() -> np.ndarray:
    # The exact sum is 100, and every f32 partial sum is an integer below 2**24.
    return np.concatenate([np.full(200, 60000.0), np.full(200, -60000.0), np.ones(100)])


CASES: dict[str, tuple[Callable[[], np.ndarray], int]] = {
    "column of 4096 ones": (lambda: np.ones((4096, 3)), 0),
    "row of 10000 tenths": (lambda: np.full((2, 10000), 0.1), 1),
    "cancelling row": (lambda: _cancelling()[None, :], 1),
    "cancelling column": (lambda: _cancelling()[:, None], 0),
}


def _within_one_ulp(actual: np.ndarray, exact: np.ndarray, dtype: tf.DType) -> bool:
    half = dtype.as_numpy_dtype
    nearest = exact.astype(half)
    spacing = np.abs(np.nextafter(nearest, np.asarray(np.inf, half)).astype(np.float64)
                     - nearest.astype(np.float64))
    return bool((np.abs(actual.astype(np.float64) - exact) <= spacing).all())


@pytest.mark.parametrize("dtype", HALVES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES)
def test_half_sums_match_xla(dtype: tf.DType, case: str) -> None:
    make, axis = CASES[case]
    x = make().astype(np.float32)

    def total(a: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.reduce_sum(tf.cast(a, dtype), axis=axis), tf.float32)

    exact = x.astype(dtype.as_numpy_dtype).astype(np.float64).sum(axis=axis)
    ours = tl.function(total, jit_compile=True, options=Options(verify=True))(x).numpy()
    xla = tf.function(total, jit_compile=True)(x).numpy()
    assert _within_one_ulp(ours, exact, dtype), (ours, exact)
    assert _within_one_ulp(xla, exact, dtype), (xla, exact)  # what TF's XLA computes


@pytest.mark.parametrize("dtype", HALVES, ids=["float16", "bfloat16"])
def test_half_products_match_xla(dtype: tf.DType) -> None:
    values = np.random.default_rng(2).choice([1 + 2**-10, 1 - 2**-11, 1 + 2**-9], (2, 600))
    x = values.astype(dtype.as_numpy_dtype).astype(np.float32)

    def product(a: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.reduce_prod(tf.cast(a, dtype), axis=1), tf.float32)

    exact = x.astype(np.float64).prod(axis=1)
    ours = tl.function(product, jit_compile=True, options=Options(verify=True))(x).numpy()
    xla = tf.function(product, jit_compile=True)(x).numpy()
    assert _within_one_ulp(ours, exact, dtype), (ours, exact)
    assert _within_one_ulp(xla, exact, dtype), (xla, exact)
