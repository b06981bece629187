"""Steps with loops compiled as HLO `while`: tfxla-lite against tf.function and TF's XLA.

Run: .venv/bin/python -m benchmarks.loops [--cases lstm,scan] [--repeats 7] [--serial]

Cases: "lstm", a Keras LSTM(128) + Dense SGD step on (32, 50, 64); "scan", the gradient
w.r.t. x of `tf.scan` of tanh(h @ W + x_t) with h 32x512 over 50 steps, W captured.
Each is timed interleaved in one process (`tfxla_lite.timing.compare`):
`tl.function` (the loop compiled into its cluster), `tf.function` and
`tf.function(jit_compile=True)` (TF's XLA); `--serial` adds tfxla-lite with every
parallel region run by the launching thread alone (`set_parallel_runtime("serial")`
around the call: the bound of a policy that keeps every kernel serial). Prints, per
case, tf.function's time and TF XLA's over each variant's (above 1: ours is faster)
and the load average.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import numpy as np
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.timing import compare


def _lstm() -> tuple[Callable[..., tf.Tensor], list[tf.Tensor]]:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((50, 64)), keras.layers.LSTM(128),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(1e-4)

    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    rng = np.random.default_rng(0)
    return step, [tf.constant(rng.normal(size=(32, 50, 64)).astype(np.float32)),
                  tf.constant(rng.normal(size=(32, 1)).astype(np.float32))]


def _scan() -> tuple[Callable[..., tf.Tensor], list[tf.Tensor]]:
    rng = np.random.default_rng(0)
    w = tf.constant(rng.normal(size=(512, 512)).astype(np.float32) / 32)
    h0 = tf.zeros((32, 512))

    def gradient(x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(x)
            hs = tf.scan(lambda h, x_t: tf.tanh(tf.matmul(h, w) + x_t), x, initializer=h0)
            loss = tf.reduce_sum(hs * hs)
        return tape.gradient(loss, x)

    return gradient, [tf.constant(rng.normal(size=(50, 32, 512)).astype(np.float32))]


CASES = {"lstm": _lstm, "scan": _scan}


def run(case: str, repeats: int, serial: bool) -> dict[str, float]:
    fn, args = CASES[case]()
    ours = tl.function(fn)
    plain = tf.function(fn)
    xla = tf.function(fn, jit_compile=True)
    variants: dict[str, Callable[[], object]] = {
        "ours": lambda: ours(*args), "tf.function": lambda: plain(*args),
        "TF XLA": lambda: xla(*args)}
    if serial:
        from tfxla_lite.runtime.loader import set_parallel_runtime

        def ours_serial() -> object:
            previous = set_parallel_runtime("serial")
            try:
                return ours(*args)
            finally:
                set_parallel_runtime(previous)

        variants["ours serial"] = ours_serial
    return compare(variants, repeats=repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="lstm,scan")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--serial", action="store_true")
    options = parser.parse_args()
    for case in options.cases.split(","):
        load = os.getloadavg()[0]
        times = run(case, options.repeats, options.serial)
        load = (load + os.getloadavg()[0]) / 2
        cells = "  ".join(f"{name} {seconds * 1e3:.2f} ms" for name, seconds in times.items())
        ratios = "  ".join(f"{name}: {times['tf.function'] / seconds:.2f}x tf.function, "
                           f"{times['TF XLA'] / seconds:.2f}x XLA"
                           for name, seconds in times.items() if name.startswith("ours"))
        print(f"{case}: {cells}\n  {ratios}  (load {load:.1f})", flush=True)


if __name__ == "__main__":
    main()
