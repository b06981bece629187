"""Tutorial 1: see the HLO of a compiled function, before and after optimization.

Run: .venv/bin/python tutorials/01_inspect_hlo.py

`experimental_get_compiler_ir` works as in TensorFlow: 'hlo' is the cluster as
lowered from the TF ops (one HLO instruction group per TF op, with the TF op
name and your source line in `metadata`), 'optimized_hlo' is what the passes
made of it: the elementwise ops and the reduction now sit in one fusion.
"""

import numpy as np
import tensorflow as tf

import tfxla_lite as tl


@tl.function(jit_compile=True)
def f(x, y, z):
    return tf.reduce_sum(x + y * z)


x, y, z = (np.random.default_rng(i).standard_normal(1000).astype(np.float32) for i in range(3))
ir = f.experimental_get_compiler_ir(x, y, z)
print("---- HLO as lowered from TensorFlow ----")
print(ir(stage="hlo"))
print("---- HLO after simplification and fusion ----")
print(ir(stage="optimized_hlo"))
print("result:", float(f(x, y, z)), " TensorFlow:", float(tf.reduce_sum(x + y * z)))
