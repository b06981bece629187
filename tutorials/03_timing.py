"""Tutorial 3: time eager, tf.function, TF's XLA and tfxla-lite side by side.

Run: .venv/bin/python tutorials/03_timing.py [size]

Times are medians of interleaved repeats (tfxla_lite.timing.compare): each
variant runs in turn, many times, so all of them see the same machine state.
Compare ratios taken in one run only; absolute times on a shared machine drift.
"""

import sys

import numpy as np
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.examples import gelu
from tfxla_lite.timing import compare

size = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
x = tf.constant(np.random.default_rng(0).standard_normal(size).astype(np.float32))

variants = {
    "eager": lambda: gelu(x),
    "tf.function": tf.function(gelu).__call__,
    "TF XLA": tf.function(gelu, jit_compile=True).__call__,
    "tfxla-lite": tl.function(gelu, jit_compile=True).__call__,
}
times = compare({name: (lambda f=f: f(x)) if name != "eager" else f
                 for name, f in variants.items()}, repeats=7)
for name, seconds in times.items():
    ratio = times["tf.function"] / seconds
    print(f"{name:<12} {seconds * 1e3:8.3f} ms   {ratio:5.2f}x tf.function")
