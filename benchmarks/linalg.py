"""Cholesky and triangular solve: tfxla-lite's CPU kernels against tf.function and TF's XLA.

Run: .venv/bin/python -m benchmarks.linalg [--sizes 4,8,16] [--batches 1,64]
     [--repeats 5] [--rounds 1] [--columns 8] [--variants] [--solve-only] [--ops 1]

Each case is one op, `tf.linalg.cholesky(a)` or `tf.linalg.triangular_solve(l, b)` in
f32 (`b` of `--columns` columns, n of them when 0), timed three ways interleaved in one process
(`tfxla_lite.timing.compare`): `tl.function(jit_compile=True)` (always compiled, whatever
the auto-clustering rule says), `tf.function` (TF's kernels: Eigen's LLT and its blocked
triangular solve) and `tf.function(jit_compile=True)` (TF's XLA). `--variants` adds the
triangular solve's upper and adjoint forms. TF's MatrixTriangularSolve has only the left
side: HLO's right side is not reachable from TF and not timed here. On a loaded machine
`--rounds` repeats each comparison and keeps the median of its ratios. `--ops K` makes
each call K independent solves of the same matrix (K right-hand sides, K outputs), so
that the call's fixed cost, alike in all three, weighs less against the kernels'. Prints one row per
case: ours / tf.function and ours / TF XLA (times; below 1 is faster here), the rows
`docs/benchmarks.md` quotes and `clustering/rules_linalg.py`'s cost rule comes from.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import numpy as np
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.timing import compare


def _spd(batch: int, n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((batch, n, n)).astype(np.float32)
    return x @ np.swapaxes(x, -1, -2) / n + np.eye(n, dtype=np.float32)


def _case(name: str, fn: Callable[..., tf.Tensor], args: list[tf.Tensor],
          repeats: int, rounds: int) -> tuple[str, float, float]:
    ours = tl.function(fn, jit_compile=True)
    plain = tf.function(fn)
    xla = tf.function(fn, jit_compile=True)
    to_tf, to_xla = [], []
    for _ in range(rounds):
        times = compare({"ours": lambda: ours(*args), "tf": lambda: plain(*args),
                         "xla": lambda: xla(*args)}, repeats=repeats, min_burst_seconds=0.01)
        to_tf.append(times["ours"] / times["tf"])
        to_xla.append(times["ours"] / times["xla"])
    return name, statistics.median(to_tf), statistics.median(to_xla)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,8,16,32,64,128,256")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--columns", type=int, default=8)
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--solve-only", action="store_true")
    parser.add_argument("--ops", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| op | batch | n | b columns | ours / tf.function | ours / TF XLA |")
    print("| --- | --- | --- | --- | --- | --- |")
    for batch in (int(b) for b in args.batches.split(",")):
        for n in (int(s) for s in args.sizes.split(",")):
            a = _spd(batch, n, rng)
            lower = tf.constant(np.linalg.cholesky(a.astype(np.float64)).astype(np.float32))
            columns = args.columns or n
            rhs = tf.constant(rng.standard_normal((batch, n, columns)).astype(np.float32))
            cases = [("Cholesky", tf.linalg.cholesky, [tf.constant(a)]),
                     ("solve lower", tf.linalg.triangular_solve, [lower, rhs])]
            if args.solve_only:
                cases = cases[1:]
            if args.ops > 1:
                many = [tf.constant(rng.standard_normal(rhs.shape).astype(np.float32))
                        for _ in range(args.ops)]
                cases = [(f"{args.ops} solves lower",
                          lambda m, *rs: [tf.linalg.triangular_solve(m, r) for r in rs],
                          [lower, *many])]
            if args.variants:
                upper = tf.linalg.matrix_transpose(lower)
                cases += [
                    ("solve upper", lambda m, r: tf.linalg.triangular_solve(m, r, lower=False),
                     [upper, rhs]),
                    ("solve lower adjoint",
                     lambda m, r: tf.linalg.triangular_solve(m, r, adjoint=True),
                     [lower, rhs]),
                ]
            for name, fn, tensors in cases:
                label, to_tf, to_xla = _case(name, fn, tensors, args.repeats,
                                             args.rounds)
                width = "" if name == "Cholesky" else str(columns)
                print(f"| {label} | {batch} | {n} | {width} | {to_tf:.2f} | {to_xla:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
