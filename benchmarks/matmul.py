"""Dot throughput: tfxla-lite's library dot against tf.matmul and TF's XLA, same run.

Run: .venv/bin/python benchmarks/matmul.py [N ...]   (default 512; square N×N×N, float32)

Prints GFLOP/s of tf.function(tf.matmul), TF's XLA and tfxla-lite, and tfxla-lite's
share of tf.matmul's throughput (the end-to-end core's goal: at least 80% at 512).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from tfxla_lite.timing import compare  # noqa: E402


def measure(n: int) -> dict[str, float]:
    """GFLOP/s of each variant on an n×n×n float32 matmul."""
    rng = np.random.default_rng(n)
    a = tf.constant(rng.standard_normal((n, n)).astype(np.float32))
    b = tf.constant(rng.standard_normal((n, n)).astype(np.float32))
    plain = tf.function(tf.matmul)
    xla = tf.function(tf.matmul, jit_compile=True)
    lite = tl.function(lambda x, y: tf.matmul(x, y), jit_compile=True)
    np.testing.assert_allclose(lite(a, b).numpy(), plain(a, b).numpy(), rtol=1e-3, atol=1e-3)
    times = compare({"tf": lambda: plain(a, b), "xla": lambda: xla(a, b),
                     "lite": lambda: lite(a, b)}, repeats=15)
    flops = 2.0 * n ** 3
    return {k: flops / t / 1e9 for k, t in times.items()}


def main(sizes: list[int]) -> int:
    print(f"{'N':>6}{'tf.matmul':>12}{'TF XLA':>10}{'tfxla-lite':>12}  GFLOP/s   lite/tf.matmul")
    for n in sizes:
        rate = measure(n)
        print(f"{n:>6}{rate['tf']:>12.1f}{rate['xla']:>10.1f}{rate['lite']:>12.1f}"
              f"{'':>11}{rate['lite'] / rate['tf']:>6.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [512]))
