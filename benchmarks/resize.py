"""Image resizes and space/depth shuffles: tfxla-lite against TF's own kernels.

Run: .venv/bin/python -m benchmarks.resize [--match NAME] [--repeats N]

Each case (a resize forward and, where named, its gradient through `tf.GradientTape`;
DepthToSpace, SpaceToDepth) runs under tf.function, tfxla-lite's must-compile
(`tl.function(jit_compile=True)`) and its auto mode (`tl.function()`, which leaves an op
to TF's kernel where a shape rule says TF's is faster), interleaved in one process
(`tfxla_lite.timing.compare`). Printed: each variant's time over tf.function's (> 1 is
slower) and the load average before and after; only ratios of one run mean something
on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/resize.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from tfxla_lite.timing import compare  # noqa: E402


def _resize(size: tuple[int, int], method: str, grad: bool) -> Callable:
    def step(x: tf.Tensor) -> object:
        if not grad:
            return tf.image.resize(x, size, method=method)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.image.resize(x, size, method=method)
        return y, tape.gradient(y, x, output_gradients=y * 0.5)
    return step


# name: (input NHWC, step)
CASES: dict[str, tuple[tuple[int, ...], Callable]] = {
    "bilinear_x2_up_grad": ((8, 64, 64, 16), _resize((128, 128), "bilinear", True)),
    "bilinear_x4_down_grad": ((8, 128, 128, 16), _resize((32, 32), "bilinear", True)),
    "bilinear_x4_down": ((8, 128, 128, 16), _resize((32, 32), "bilinear", False)),
    "nearest_x2_up": ((8, 64, 64, 16), _resize((128, 128), "nearest", False)),
    "nearest_x2_up_grad": ((8, 64, 64, 16), _resize((128, 128), "nearest", True)),
    "nearest_x3_down": ((8, 96, 96, 16), _resize((32, 32), "nearest", False)),
    "nearest_x3_down_grad": ((8, 96, 96, 16), _resize((32, 32), "nearest", True)),
    "bicubic_x2_up_grad": ((8, 64, 64, 16), _resize((128, 128), "bicubic", True)),
    "bicubic_x4_down_grad": ((8, 128, 128, 16), _resize((32, 32), "bicubic", True)),
    "bicubic_x4_down": ((8, 128, 128, 16), _resize((32, 32), "bicubic", False)),
    "depth_to_space_2": ((8, 32, 32, 64), lambda x: tf.nn.depth_to_space(x, 2)),
    "space_to_depth_2": ((8, 64, 64, 16), lambda x: tf.nn.space_to_depth(x, 2)),
}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--match", default="", help="only cases whose name contains this")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    print(f"load before: {load_average()}")
    rng = np.random.default_rng(0)
    for name, (shape, step) in CASES.items():
        if args.match not in name:
            continue
        x = tf.constant(rng.standard_normal(shape).astype(np.float32))
        variants = {"tf": tf.function(step), "jit": tl.function(step, jit_compile=True),
                    "auto": tl.function(step, min_cluster_size=1)}
        times = compare({k: (lambda f=f, x=x: f(x)) for k, f in variants.items()},
                        repeats=args.repeats)
        base = times["tf"]
        print(f"{name:24s} jit {times['jit'] / base:5.2f}  auto {times['auto'] / base:5.2f}",
              flush=True)
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
