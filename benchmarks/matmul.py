"""Dot throughput: tfxla-lite's dot kernels against tf.matmul and TF's XLA, same run.

Run: .venv/bin/python benchmarks/matmul.py [SHAPE ...]
     SHAPE is N (an N×N×N matmul) or MxKxN; default: 512 1024 2048 64x784x512 1x784x512
     --dense: each shape as a dense layer, relu(x @ w + b) (tfxla-lite: one kOutput kernel)

Prints GFLOP/s of tf.function, TF's XLA and tfxla-lite (float32), tfxla-lite's share of
tf.function's throughput (the goal: at least 95% on large shapes), and the strategy and
units tfxla-lite chose for the shape (`codegen/cpu/dot.py`). Variants are timed in
interleaved bursts (`tfxla_lite.timing.compare`), so ratios hold on a busy machine;
absolute figures do not.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from tfxla_lite.codegen.cpu import dot as dot_codegen  # noqa: E402
from tfxla_lite.timing import compare  # noqa: E402

DEFAULT_SHAPES = ["512", "1024", "2048", "64x784x512", "1x784x512"]


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in text.lower().split("x")]
    if len(parts) == 1:
        return parts[0], parts[0], parts[0]
    if len(parts) != 3:
        raise ValueError(f"shape {text!r}: N or MxKxN")
    m, k, n = parts
    return m, k, n


def describe_schedule(m: int, k: int, n: int) -> str:
    """The strategy and units `dot.py` picks for a row-major m×k by k×n dot."""
    plan = dot_codegen.GemmPlan(m=m, n=n, k=k, transpose_a=False, lda=k, transpose_b=False,
                                ldb=n, batch_sizes=(), lhs_batch_strides=(),
                                rhs_batch_strides=())
    sched = dot_codegen.schedule(plan)
    return f"{sched.strategy}, {sched.units} x {sched.block_m}x{sched.block_n}"


def measure(m: int, k: int, n: int, dense: bool) -> dict[str, float]:
    """GFLOP/s of each variant."""
    rng = np.random.default_rng(m * n + k)
    a = tf.constant(rng.standard_normal((m, k)).astype(np.float32))
    w = tf.constant(rng.standard_normal((k, n)).astype(np.float32))
    b = tf.constant(rng.standard_normal((n,)).astype(np.float32))

    def layer(x: tf.Tensor, y: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
        product = tf.matmul(x, y)
        return tf.nn.relu(product + bias) if dense else product

    plain = tf.function(layer)
    xla = tf.function(layer, jit_compile=True)
    lite = tl.function(layer, jit_compile=True)
    reference = plain(a, w, b).numpy()
    tolerance = 4 * k * np.finfo(np.float32).eps  # dot reassociation over K terms
    np.testing.assert_allclose(lite(a, w, b).numpy(), reference, rtol=tolerance,
                               atol=tolerance * np.sqrt(k))
    times = compare({"tf": lambda: plain(a, w, b), "xla": lambda: xla(a, w, b),
                     "lite": lambda: lite(a, w, b)}, repeats=15)
    flops = 2.0 * m * k * n
    return {name: flops / t / 1e9 for name, t in times.items()}


def main(argv: list[str]) -> int:
    dense = "--dense" in argv
    shapes = [parse_shape(s) for s in argv if s != "--dense"] or [
        parse_shape(s) for s in DEFAULT_SHAPES]
    what = "relu(x@w+b)" if dense else "x@w"
    print(f"{what}, float32, GFLOP/s; lite/tf: tfxla-lite's share of tf.function's rate")
    print(f"{'M x K x N':>16}{'tf':>9}{'TF XLA':>9}{'lite':>9}{'lite/tf':>9}  schedule")
    for m, k, n in shapes:
        rate = measure(m, k, n, dense)
        print(f"{f'{m}x{k}x{n}':>16}{rate['tf']:>9.1f}{rate['xla']:>9.1f}{rate['lite']:>9.1f}"
              f"{rate['lite'] / rate['tf']:>9.0%}  {describe_schedule(m, k, n)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
