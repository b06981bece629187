"""A plain TensorFlow script that never imports tfxla_lite (run by tests/flags).

A tf.function reads and writes a tf.Variable; the results are printed so that a
run with TFXLA_LITE_FLAGS can be compared with a run without.
"""

import numpy as np
import tensorflow as tf

v = tf.Variable(np.linspace(0.0, 1.0, 12, dtype=np.float32).reshape(3, 4))


@tf.function
def step(x):
    new = tf.tanh(v * 0.5 + x) * 2.0 - 0.25
    v.assign(new)
    return tf.reduce_sum(tf.exp(new) * v)


x = np.full((3, 4), 0.125, np.float32)
for _ in range(3):
    print(f"result {step(x).numpy():.6f}")
print("variable", " ".join(f"{value:.6f}" for value in v.numpy().ravel()))
