"""TruncateDiv of floats (float16, bfloat16, float32, float64) against TF's kernel: the
quotient rounded to the type, then toward zero, with -0.0, NaN, the infinities and a
zero divisor as TF gives them, in the evaluator, the CPU backend and both modes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_harness import check_against_tf, inputs, over_shapes
from tolerances import assert_close

import tfxla_lite as tl

BF16 = tf.bfloat16.as_numpy_dtype
FLOATS = [np.float16, BF16, np.float32, np.float64]
SHAPES = [[(), ()], [(3, 4), (3, 4)], [(3, 1), (1, 4)], [(2, 3, 4), (4,)], [(0, 3), (1, 3)]]
# Each x with each y: signed zeros, infinities, NaN, a zero divisor, halves, and a
# quotient the 2-byte types round before truncating (10000 / 3).
_X = [7.5, -7.5, 0.5, -0.5, 0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e4, 3.0, -6.0]
_Y = [2.0, -2.0, 3.0, -3.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]


def _truncate_div(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    return tf.raw_ops.TruncateDiv(x=x, y=y)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_over_shapes_against_tf(dtype: type) -> None:
    check_against_tf(over_shapes(_truncate_div, 2), inputs(SHAPES, [dtype, dtype]),
                     "TruncateDiv")


@pytest.mark.parametrize("jit_compile", [True, None], ids=["jit_compile", "auto"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_edge_values_against_tf(dtype: type, jit_compile: bool | None) -> None:
    x = tf.constant(np.array(_X, np.float64).reshape(-1, 1).astype(dtype))
    y = tf.constant(np.array(_Y, np.float64).reshape(1, -1).astype(dtype))
    expected = _truncate_div(x, y).numpy()
    options = tl.Options(strict_jit_compile=True) if jit_compile else None
    compiled = tl.function(_truncate_div, jit_compile=jit_compile, min_cluster_size=1,
                           options=options)
    actual = compiled(x, y).numpy()
    (program,) = compiled._programs.values()
    assert program.compiled, "TruncateDiv compiled"
    assert_close(actual, expected, "TruncateDiv")
    wide, want = actual.astype(np.float64), expected.astype(np.float64)
    numbers = ~np.isnan(want)  # every sign but a NaN's (assert_close checks zeros' only)
    np.testing.assert_array_equal(np.signbit(wide[numbers]), np.signbit(want[numbers]))
