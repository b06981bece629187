"""Where XLA's semantics differ from TF's kernels, tfxla-lite computes what TF's XLA does.

TF's CPU kernels raise on an index out of range (gathers, scatters, segment ids,
sparse labels) and on an integer division by zero; XLA clamps a gather's index, drops
an out-of-range scatter update, gives a NaN loss for a bad label and -1 (or the
dividend, for a remainder) for a zero divisor, and its float-to-integer Cast saturates
where TF's gives INT_MIN. TF's own auto-clustering (`--tf_xla_auto_jit=2`) compiles these
ops and so has XLA's semantics too (measured with TF 2.21 on the development machine; see
docs/supported_ops.md, "Semantics that differ from TF"). Each case runs in TF (which
raises or differs), in TF's XLA (`jit_compile=True`, the reference) and in tfxla-lite's
auto-clustering and must-compile modes, which must give XLA's values.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.options import Options

I32 = np.int32
FIVE = np.arange(5, dtype=np.float32) + 1
NUMERATORS, DIVISORS = np.array([7, -7], I32), np.array([0, 2], I32)

# name: (function, inputs, TF's error message or None when TF returns other values)
CASES: dict[str, tuple[Callable[..., Any], list[np.ndarray], str | None]] = {
    "GatherV2 index past the end": (
        lambda p, i: tf.gather(p, i), [FIVE, np.array([1, 7], I32)], "is not in [0, 5)"),
    "GatherV2 negative index": (
        lambda p, i: tf.gather(p, i), [FIVE, np.array([1, -1], I32)], "is not in [0, 5)"),
    "GatherNd index past the end": (
        lambda p, i: tf.gather_nd(p, i),
        [np.arange(10, dtype=np.float32).reshape(5, 2), np.array([[1], [9]], I32)],
        "does not index into param shape"),
    "UnsortedSegmentSum id past num_segments": (
        lambda d, s: tf.math.unsorted_segment_sum(d, s, 3),
        [np.ones(4, np.float32), np.array([0, 1, 5, 2], I32)], "is out of range [0, 3)"),
    "ScatterNd index past the end": (
        lambda i, u: tf.scatter_nd(i, u, [5]), [np.array([[1], [7]], I32),
                                                np.ones(2, np.float32)],
        "does not index into shape"),
    "TensorScatterUpdate index past the end": (
        lambda t, i: tf.tensor_scatter_nd_update(t, i, tf.ones([2])),
        [np.zeros(5, np.float32), np.array([[1], [7]], I32)], "does not index into shape"),
    "FloorDiv by zero": (lambda x, y: x // y, [NUMERATORS, DIVISORS],
                         "Integer division by zero"),
    "FloorMod by zero": (lambda x, y: tf.math.floormod(x, y), [NUMERATORS, DIVISORS],
                         "Integer division by zero"),
    # TF 2.21's kernels report these as an InternalError.
    "TruncateDiv by zero": (lambda x, y: tf.raw_ops.TruncateDiv(x=x, y=y),
                            [NUMERATORS, DIVISORS], "Unexpected error in binary operator"),
    "TruncateMod by zero": (lambda x, y: tf.raw_ops.TruncateMod(x=x, y=y),
                            [NUMERATORS, DIVISORS], "Unexpected error in binary operator"),
    "Div by zero": (lambda x, y: tf.raw_ops.Div(x=x, y=y), [NUMERATORS, DIVISORS],
                    "Integer division by zero"),
    "SparseSoftmaxCrossEntropyWithLogits label out of range": (
        lambda logits, y: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                        logits=logits),
        [np.zeros((2, 5), np.float32), np.array([1, 7], I32)], "outside the valid range"),
    "Cast of NaN, inf and out-of-range floats to int32": (
        lambda x: tf.cast(x, tf.int32),
        [np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.7], np.float32)], None),
    "Pow of integers to a negative exponent": (
        lambda x, y: tf.pow(x, y), [np.array([2, -1, -1, 1, 3], I32),
                                    np.array([-1, -2, -3, -5, 2], I32)],
        "Integers to negative integer powers are not allowed"),
    "integer Mean over an empty axis": (
        lambda x: tf.reduce_mean(x, axis=1), [np.zeros((2, 0), I32)], None),
}


def _run(fn: Callable[..., Any], args: list[np.ndarray], **kwargs: Any) -> np.ndarray:
    return np.asarray(tf.function(fn, **kwargs)(*[tf.constant(a) for a in args]))


@pytest.mark.parametrize("case", CASES)
def test_tfxla_lite_follows_xla_where_tf_differs(case: str) -> None:
    fn, args, tf_error = CASES[case]
    xla = _run(fn, args, jit_compile=True)
    if tf_error is not None:
        with pytest.raises(tf.errors.OpError, match=re.escape(tf_error)):
            _run(fn, args)
    else:
        assert not np.array_equal(_run(fn, args), xla)  # TF's kernel computes other values
    tensors = [tf.constant(a) for a in args]
    for jit_compile in (None, True):  # auto-clustering, must-compile
        compiled = tl.function(fn, jit_compile=jit_compile,
                               options=Options(min_cluster_size=1, verify=True))
        np.testing.assert_array_equal(np.asarray(compiled(*tensors)), xla,
                                      err_msg=f"{case}, jit_compile={jit_compile}")


def test_sign_of_negative_zero_follows_xla() -> None:
    def sign(x: tf.Tensor) -> tf.Tensor:
        return tf.sign(x)

    x = tf.constant([-0.0, 0.0, -2.0], tf.float32)
    xla = _run(sign, [x.numpy()], jit_compile=True)
    assert list(np.signbit(_run(sign, [x.numpy()]))) == [False, False, True]  # TF: +0.0
    compiled = tl.function(sign, options=Options(min_cluster_size=1, verify=True))(x).numpy()
    np.testing.assert_array_equal(np.signbit(compiled), np.signbit(xla))
    np.testing.assert_array_equal(compiled, xla)


@pytest.mark.parametrize("case", ["max over NaN", "float16 cumsum"])
def test_where_tfxla_lite_follows_tf_instead(case: str) -> None:
    """NaN-propagating Max (TF's XLA on the CPU can drop the NaN) and 2-byte Cumsum
    (TF's XLA accumulates in float32): tfxla-lite gives TF's kernel's values."""
    if case == "max over NaN":
        def fn(x: tf.Tensor) -> tf.Tensor:
            return tf.reduce_max(x)

        x = np.array([1.0, np.nan, 3.0], np.float32)
    else:
        def fn(x: tf.Tensor) -> tf.Tensor:
            return tf.cast(tf.cumsum(tf.cast(x, tf.float16))[-1:], tf.float32)

        x = np.ones(4096, np.float32)  # float16 steps stick at 2048
    expected = _run(fn, [x])
    compiled = tl.function(fn, options=Options(min_cluster_size=1, verify=True))
    np.testing.assert_array_equal(np.asarray(compiled(tf.constant(x))), expected)
    hlo = compiled.experimental_get_compiler_ir(tf.constant(x))(stage="hlo")
    assert ("reduce(" if case == "max over NaN" else "reduce-window(") in hlo  # compiled
