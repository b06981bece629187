"""Tutorial 2: a fusion and the buffer reuse, counted.

Run: .venv/bin/python tutorials/02_fusion_and_buffers.py

The MLP `relu(x@w1+b1)@w2+b2` compiles to two dots (library calls) and the
elementwise work between them fused into loops. Buffer assignment gives every
intermediate a slice of one temporary arena; intermediates whose lifetimes do
not overlap share memory, so the arena is smaller than the sum of the buffers.
"""

import numpy as np
import tensorflow as tf

import tfxla_lite as tl


@tl.function(jit_compile=True)
def mlp(x, w1, b1, w2, b2):
    return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2


rng = np.random.default_rng(0)
args = [rng.standard_normal(s).astype(np.float32)
        for s in [(64, 128), (128, 256), (256,), (256, 32), (32,)]]
ir = mlp.experimental_get_compiler_ir(*args)
optimized = ir(stage="optimized_hlo")
print(optimized)
print("fusion instructions:", sum(" fusion(" in line for line in optimized.splitlines()))
print(ir(stage="buffer_assignment"))
report = tl.explain(mlp, *args)
for cluster in report.compiled_clusters:
    print(f"{cluster.name}: {cluster.kernel_count} kernels; temp arena {cluster.temp_bytes} bytes "
          f"instead of {cluster.temp_bytes_without_reuse} without reuse")
expected = tf.matmul(tf.nn.relu(tf.matmul(args[0], args[1]) + args[2]), args[3]) + args[4]
print("max abs difference from TensorFlow:", float(np.max(np.abs(mlp(*args) - expected))))
