"""`tf.debugging.assert_*` under tfxla-lite: auto mode keeps the assertion in TF, so it
fires as plain TF's does; `jit_compile=True` runs it as TF's XLA does, which compiles an
Assert to nothing (tf2xla's Assert kernel only logs 'Ignoring Assert operator')."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl


def _checked(x: tf.Tensor) -> tf.Tensor:
    tf.debugging.assert_positive(x)
    return x * 2.0


_BAD = np.array([1.0, -2.0], np.float32)


def test_auto_mode_fires_the_assertion_as_plain_tf_does() -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match="did not hold"):
        tf.function(_checked)(tf.constant(_BAD))
    with pytest.raises(tf.errors.InvalidArgumentError, match="did not hold"):
        tl.function(_checked, min_cluster_size=1)(tf.constant(_BAD))


def test_jit_compile_drops_the_assertion_as_tfs_xla_does() -> None:
    expected = tf.function(_checked, jit_compile=True)(tf.constant(_BAD)).numpy()
    np.testing.assert_array_equal(expected, _BAD * 2)  # TF's XLA: no assertion
    actual = tl.function(_checked, jit_compile=True)(tf.constant(_BAD)).numpy()
    np.testing.assert_array_equal(actual, expected)
