"""Benchmarks of CPU codegen against NumPy (a script, not a test: timings are noisy).

    .venv/bin/python tests/codegen/bench_codegen.py

Reports a 512x512x512 f32 dot through `compile_module` (OpenBLAS GEMM) against
`numpy.matmul` in GFLOP/s, and the fused `reduce_sum(x + y*z)` over 4M floats.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen_helpers import build  # noqa: E402

from tfxla_lite.codegen import compile_module  # noqa: E402
from tfxla_lite.hlo.shape import Shape  # noqa: E402


def best_time(fn: Callable[[], object], repeats: int = 30) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_dot(n: int = 512) -> None:
    shape = Shape("f32", (n, n))
    module = build("dot", [shape, shape], lambda c, ps: [c.create(
        "dot", ps, lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))])
    start = time.perf_counter()
    executable = compile_module(module)
    compile_ms = (time.perf_counter() - start) * 1e3
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    np.testing.assert_allclose(executable(a, b)[0], a @ b, rtol=1e-4, atol=1e-3)
    flops = 2.0 * n**3
    ours = flops / best_time(lambda: executable(a, b)) / 1e9
    numpy = flops / best_time(lambda: np.matmul(a, b)) / 1e9
    print(f"dot {n}^3 f32: compile_module {ours:.1f} GFLOP/s, numpy.matmul {numpy:.1f} "
          f"GFLOP/s ({ours / numpy:.0%}); compile {compile_ms:.0f} ms")


def bench_reduce_sum(n: int = 1 << 22) -> None:
    shape = Shape("f32", (n,))

    def body(c, ps):  # type: ignore[no-untyped-def]
        total = c.create("add", [ps[0], c.create("multiply", [ps[1], ps[2]])])
        reducer = c.module.reduction_computation("add", "f32")
        return [c.create("reduce", [total, c.add_constant(0.0, "f32")], dimensions=(0,),
                         called_computations=[reducer])]

    executable = compile_module(build("reduce_sum", [shape] * 3, body))
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
    ours = best_time(lambda: executable(x, y, z), 10) * 1e3
    numpy = best_time(lambda: np.sum(x + y * z), 10) * 1e3
    print(f"reduce_sum(x+y*z) 4M f32: compile_module {ours:.2f} ms, numpy {numpy:.2f} ms; "
          f"kernels {executable.kernel_count}")


if __name__ == "__main__":
    bench_dot()
    bench_reduce_sum()
