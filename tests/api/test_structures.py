"""Arguments and results of any structure pass through as with tf.function."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tfxla_lite as tl


def test_nested_outputs_kwargs_and_python_values() -> None:
    def fn(x, y, scale=2.0, extra=None):
        s = tf.nn.relu(x * scale + y)
        return {"sum": tf.reduce_sum(s, axis=0), "pair": (s - 1.0, tf.cast(s > 1.0, tf.int32)),
                "none": None}

    compiled = tl.function(fn, jit_compile=True)
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 6.0
    y = np.ones(4, np.float32)
    for kwargs in ({}, {"scale": 3.0}, {"scale": 3.0, "extra": None}):
        expected = tf.function(fn)(x, y=y, **kwargs)
        actual = compiled(x, y=y, **kwargs)
        assert actual["none"] is None
        np.testing.assert_allclose(actual["sum"].numpy(), expected["sum"].numpy(), rtol=1e-6)
        np.testing.assert_allclose(actual["pair"][0].numpy(), expected["pair"][0].numpy())
        assert actual["pair"][1].dtype == tf.int32
        np.testing.assert_array_equal(actual["pair"][1].numpy(), expected["pair"][1].numpy())
    # scale is a Python value: each distinct value is its own program, as with tf.function
    assert len(compiled._programs) == 2


def test_method_and_integer_ops() -> None:
    class Model:
        def __init__(self) -> None:
            self.offset = tf.constant([1, 2, 3], tf.int32)

        @tl.function(jit_compile=True)
        def __call__(self, x):
            return tf.maximum(x * 3 - self.offset, 0), tf.reduce_max(x, axis=-1)

    model = Model()
    x = tf.constant([[1, -2, 3], [4, 5, -6]], tf.int32)
    product, biggest = model(x)
    np.testing.assert_array_equal(product.numpy(), np.maximum(x.numpy() * 3 - [1, 2, 3], 0))
    np.testing.assert_array_equal(biggest.numpy(), [3, 5])


def test_tensor_and_numpy_inputs_give_equal_results() -> None:
    f = tl.function(lambda a: tf.tanh(a) * 0.5 + 0.5, jit_compile=True)
    a = np.linspace(-4, 4, 33).astype(np.float32)
    np.testing.assert_array_equal(f(a).numpy(), f(tf.constant(a)).numpy())
