"""Bad inputs: wrong shapes and dtypes raise the error plain TF raises, and NaN, inf and
empty tensors give TF's values; never a crash or a hang. Sizes past int64 are
tests/api/test_reliability_sizes.py's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl

_SIGNATURE = [tf.TensorSpec([2, 3], tf.float32)]


def _body(x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.exp(x) * 2.0, axis=-1)


def _outcome(call: Callable[[], Any]) -> type[BaseException] | np.ndarray:
    try:
        return np.asarray(call())
    except (TypeError, ValueError, tf.errors.OpError) as error:
        return type(error)


_BAD_CALLS = {
    "wrong shape": lambda: tf.zeros([3, 2]),
    "wrong rank": lambda: tf.zeros([6]),
    "wrong dtype": lambda: tf.zeros([2, 3], tf.int32),
    "float64 for float32": lambda: tf.zeros([2, 3], tf.float64),
    "a string": lambda: tf.constant([["a", "b", "c"]] * 2),
    "a Python list of the wrong length": lambda: [[1.0, 2.0]],
}


@pytest.mark.parametrize("case", sorted(_BAD_CALLS))
@pytest.mark.parametrize("jit_compile", [None, True])
def test_a_signature_mismatch_raises_what_tf_raises(case: str, jit_compile: bool | None
                                                    ) -> None:
    tf_fn = tf.function(_body, input_signature=_SIGNATURE)
    ours = tl.function(_body, input_signature=_SIGNATURE, jit_compile=jit_compile,
                       min_cluster_size=1)
    expected = _outcome(lambda: tf_fn(_BAD_CALLS[case]()))
    actual = _outcome(lambda: ours(_BAD_CALLS[case]()))
    assert isinstance(expected, type), f"TF accepted {case}"
    assert isinstance(actual, type) and issubclass(actual, (TypeError, ValueError)), actual
    assert issubclass(actual, expected) or issubclass(expected, actual), (actual, expected)


def _matmul(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    return tf.matmul(a, b) + 1.0


@pytest.mark.parametrize("jit_compile", [None, True])
def test_incompatible_shapes_raise_what_tf_raises(jit_compile: bool | None) -> None:
    a, b = tf.zeros([2, 3]), tf.zeros([4, 5])
    expected = _outcome(lambda: tf.function(_matmul)(a, b))
    actual = _outcome(lambda: tl.function(_matmul, jit_compile=jit_compile,
                                          min_cluster_size=1)(a, b))
    assert isinstance(expected, type) and isinstance(actual, type)
    assert issubclass(actual, expected) or issubclass(expected, actual), (actual, expected)


_VALUES = {
    "NaN and inf": np.array([[np.nan, np.inf, -np.inf], [-0.0, 0.0, 1e30]], np.float32),
    "empty rows": np.zeros([0, 3], np.float32),
    "empty columns": np.zeros([2, 0], np.float32),
    "subnormals": np.full([2, 3], 1e-45, np.float32),
}


@pytest.mark.parametrize("case", sorted(_VALUES))
@pytest.mark.parametrize("jit_compile", [None, True])
def test_edge_values_give_tf_values(case: str, jit_compile: bool | None) -> None:
    x = tf.constant(_VALUES[case])
    expected = tf.function(_body)(x).numpy()
    actual = tl.function(_body, jit_compile=jit_compile, min_cluster_size=1)(x).numpy()
    assert_close(actual, expected, "Sum", case)
