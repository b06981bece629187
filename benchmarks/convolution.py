"""Convolution throughput: tfxla-lite's convolution kernel against TF's Conv2D (oneDNN) and
TF's XLA, interleaved in one process (`tfxla_lite.timing.compare`).

Run: .venv/bin/python benchmarks/convolution.py
Shapes: a ResNet-like 3×3 convolution (16×32×32×64 → 64, SAME) and a 1×1 one (same
input → 256), float32, NHWC. Prints GFLOP/s of each and tfxla-lite's share of TF's
throughput, with the load average (ratios hold on a busy machine; absolute figures do
not).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from benchmarks.workloads import measured_options  # noqa: E402
from tfxla_lite.timing import compare  # noqa: E402

SHAPES = {
    "3x3 16x32x32x64->64": ((16, 32, 32, 64), (3, 3, 64, 64)),
    "1x1 16x32x32x64->256": ((16, 32, 32, 64), (1, 1, 64, 256)),
}


def main() -> None:
    rng = np.random.default_rng(0)
    for name, (x_shape, w_shape) in SHAPES.items():
        x = tf.constant(rng.standard_normal(x_shape).astype(np.float32))
        w = tf.constant(rng.standard_normal(w_shape).astype(np.float32))

        def conv(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
            return tf.nn.conv2d(x, w, 1, "SAME")

        variants = {
            "tf": tf.function(conv),
            "xla": tf.function(conv, jit_compile=True),
            "lite": tl.function(conv, jit_compile=True,
                                options=measured_options(compile_convolutions=True)),
        }
        expected = variants["tf"](x, w).numpy()
        got = variants["lite"](x, w).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
        flops = 2 * np.prod(expected.shape) * np.prod(w_shape[:3])
        load = os.getloadavg()[0]
        seconds = compare({k: (lambda f=f, x=x, w=w: f(x, w).numpy()) for k, f in variants.items()})
        rates = {k: flops / s / 1e9 for k, s in seconds.items()}
        print(f"{name}: load {load:.1f}; " + ", ".join(
            f"{k} {rates[k]:.0f} GFLOP/s ({seconds[k] * 1e3:.2f} ms)" for k in variants)
            + f"; lite/tf {rates['lite'] / rates['tf']:.2f}, lite/xla "
              f"{rates['lite'] / rates['xla']:.2f}")


if __name__ == "__main__":
    main()
