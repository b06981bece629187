"""Tutorial 4: auto-clustering with ops tfxla-lite cannot compile.

Run: .venv/bin/python tutorials/04_fallback.py

In auto mode (`jit_compile` left at None) unsupported ops (here `tf.unique`
and `tf.print`) stay in TensorFlow and the rest is compiled; `tl.explain`
says which node went where and why. Under `jit_compile=True` the same
function raises `tl.CompilationError` naming each offending op, its node
name and your source line.
"""

import numpy as np
import tensorflow as tf

import tfxla_lite as tl


def f(x):
    y = tf.nn.relu(x * 2.0 + 1.0) - 0.5
    tf.print("sum of y:", tf.reduce_sum(y))
    values, _ = tf.unique(tf.cast(y > 0, tf.int32))
    return tf.exp(y) * 3.0, values


x = np.linspace(-2, 2, 16).astype(np.float32)
auto = tl.function(f)
print(auto(x)[0].numpy()[:4])
print(tl.explain(auto, x))
try:
    tl.function(f, jit_compile=True)(x)
except tl.CompilationError as error:
    print("\njit_compile=True refused, as it should:\n" + str(error.message))
