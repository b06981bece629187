"""Dot throughput: tfxla-lite's dot kernels against tf.matmul and TF's XLA, same run.

Run: .venv/bin/python benchmarks/matmul.py [SHAPE ...]
     SHAPE is N (an N×N×N matmul) or MxKxN; default: 512 1024 2048 64x784x512 1x784x512
     [B*]MxKxN[.ta][.tb]: B products at once (tf.matmul of rank 3), A stored K×M (.ta) or
       B stored N×K (.tb), as the dots of a training step's gradients read them
     --transformer: the GEMM shapes of the model zoo's Transformer step (benchmarks/zoo.py)
     --dense: each shape as a dense layer, relu(x @ w + b) (tfxla-lite: one kOutput kernel)
     --split TMxTN,...: also tfxla-lite's kernel with each split forced (`--split 4x4,2x1`),
       timed in the same interleaved bursts (compiled without the caches)
     --strategy NAME,...: also tfxla-lite's kernel with each strategy of `dot.choose_strategy`
       forced (`--strategy library,blocked,packed`), its units as `dot.schedule` cuts them
       for it ("packed": the emitted packed GEMM, `codegen/cpu/gemm_packed.py`, f32 only)
     --split-cost [--split TMxTN,...]: nothing of TF timed; the CPU time of one thread running
       the shape's units as the kernel does (one OpenBLAS call per tile) against one call
       of the whole product, and the same for each --split given (`--split 4x4,2x2`);
       "(schedule)" marks the tiles `dot.schedule` gives the library (also for shapes
       that register blocks compute)

Prints GFLOP/s of tf.function, TF's XLA and tfxla-lite (float32), tfxla-lite's share of
tf.function's throughput (the goal: at least 95% on large shapes), and the strategy and
units tfxla-lite chose for the shape (`codegen/cpu/dot.py`). Variants are timed in
interleaved bursts (`tfxla_lite.timing.compare`), so ratios hold on a busy machine;
absolute figures do not. With --split, one line per forced split follows each shape's.

--split-cost measures what cutting a dot into tiles costs in CPU time (thread time, so
other jobs on the machine change it little): the split's extra time over one call, best
and median of interleaved repeats, next to `dot.split_overhead`'s estimate.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from benchmarks.workloads import measured_options  # noqa: E402
from tfxla_lite.codegen.cpu import dot as dot_codegen  # noqa: E402
from tfxla_lite.codegen.cpu import engine  # noqa: E402
from tfxla_lite.timing import compare  # noqa: E402

DEFAULT_SHAPES = ["512", "1024", "2048", "64x784x512", "1x784x512"]


# The zoo Transformer step's GEMMs (batch 16 x seq 64 = 1024 rows, 64 features, 4 heads
# of 16, feed-forward 256), forward and gradients, here as MxKxN (kernel_profile labels
# them GEMM MxNxK): the Dense layers and their input gradients (B transposed), the weight
# gradients (A transposed), attention's scores (B transposed, K = 16), probabilities
# times values (N = 16) and their gradients, 64 heads x batch elements.
TRANSFORMER_SHAPES = ["1024x256x64", "1024x64x256", "1024x64x64", "1024x64x256.tb",
                      "1024x256x64.tb", "1024x64x64.tb", "64x1024x256.ta", "256x1024x64.ta",
                      "64x1024x64.ta", "64*64x16x64.tb", "64*64x64x16", "64*64x64x16.ta",
                      "64*16x64x64.ta"]


@dataclass(frozen=True)
class Gemm:
    """C[batch][M,N] = op(A)[M,K] @ op(B)[K,N] in row-major float32."""

    m: int
    k: int
    n: int
    batch: int = 0  # 0: rank 2
    transpose_a: bool = False
    transpose_b: bool = False

    @property
    def plain(self) -> bool:
        return not (self.batch or self.transpose_a or self.transpose_b)

    @property
    def flops(self) -> float:
        return 2.0 * max(self.batch, 1) * self.m * self.k * self.n

    def __str__(self) -> str:
        return (f"{f'{self.batch}*' if self.batch else ''}{self.m}x{self.k}x{self.n}"
                f"{'.ta' if self.transpose_a else ''}{'.tb' if self.transpose_b else ''}")


def parse_gemm(text: str) -> Gemm:
    found = re.fullmatch(r"(?:(\d+)\*)?(\d+)(?:x(\d+)x(\d+))?((?:\.ta|\.tb)*)", text.lower())
    if found is None or (found[3] is None and (found[1] or found[5])):
        raise ValueError(f"shape {text!r}: N, MxKxN or B*MxKxN[.ta][.tb]")
    m = int(found[2])
    k, n = (int(found[3]), int(found[4])) if found[3] else (m, m)
    return Gemm(m, k, n, int(found[1] or 0), ".ta" in found[5], ".tb" in found[5])


def parse_shape(text: str) -> tuple[int, int, int]:
    gemm = parse_gemm(text)
    if not gemm.plain:
        raise ValueError(f"shape {text!r}: N or MxKxN")
    return gemm.m, gemm.k, gemm.n


def parse_split(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SystemExit(f"--split {text!r}: TMxTN, two positive tile counts")
    return int(parts[0]), int(parts[1])


def describe_schedule(m: int, k: int, n: int, gemm: Gemm | None = None) -> str:
    """The strategy and units `dot.py` picks for a row-major m×k by k×n dot (or `gemm`)."""
    gemm = gemm or Gemm(m, k, n)
    batch = (gemm.batch,) if gemm.batch else ()
    plan = dot_codegen.GemmPlan(
        m=gemm.m, n=gemm.n, k=gemm.k, transpose_a=gemm.transpose_a,
        lda=gemm.m if gemm.transpose_a else gemm.k, transpose_b=gemm.transpose_b,
        ldb=gemm.k if gemm.transpose_b else gemm.n, batch_sizes=batch,
        lhs_batch_strides=(gemm.m * gemm.k,) if batch else (),
        rhs_batch_strides=(gemm.k * gemm.n,) if batch else ())
    sched = dot_codegen.schedule(plan)
    return f"{sched.strategy}, {sched.units} x {sched.block_m}x{sched.block_n}"


def _sgemm() -> ctypes._CFuncPtr:
    """NumPy's OpenBLAS sgemm (ILP64, one thread), as the kernels bind it."""
    routine = engine.gemm("f32")
    library = engine._blas_library()
    if routine is None or library is None or routine.int_bits != 64:
        raise RuntimeError("--split-cost needs NumPy's ILP64 OpenBLAS")
    function = getattr(library, routine.symbol)
    blas_int, single = ctypes.c_int64, ctypes.c_float
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, blas_int, blas_int, blas_int,
                         single, ctypes.c_void_p, blas_int, ctypes.c_void_p, blas_int, single,
                         ctypes.c_void_p, blas_int]
    function.restype = None
    return function


def tiled_product(a: np.ndarray, b: np.ndarray, c: np.ndarray, tiles_m: int, tiles_n: int
                  ) -> None:
    """c = a @ b (row-major float32) by one OpenBLAS call per tile of a tiles_m × tiles_n
    split, tiles bounded as `dot.schedule` bounds them (multiples of TILE_ALIGN)."""
    (m, k), n = a.shape, b.shape[1]
    if a.dtype != np.float32 or b.shape[0] != k or c.shape != (m, n):
        raise ValueError(f"float32 m×k @ k×n into m×n, got {a.shape} @ {b.shape} -> {c.shape}")
    if not all(x.flags.c_contiguous for x in (a, b, c)):
        raise ValueError("operands must be C-contiguous")
    sgemm = _sgemm()
    pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
    align = dot_codegen.TILE_ALIGN
    block_m = math.ceil(math.ceil(m / tiles_m) / align) * align
    block_n = math.ceil(math.ceil(n / tiles_n) / align) * align
    for r0 in range(0, m, block_m):
        r1 = min(m, r0 + block_m)
        for c0 in range(0, n, block_n):
            c1 = min(n, c0 + block_n)
            sgemm(101, 111, 111, r1 - r0, c1 - c0, k, 1.0, pa + 4 * r0 * k, k, pb + 4 * c0, n,
                  0.0, pc + 4 * (r0 * n + c0), n)


def split_cost(m: int, k: int, n: int, splits: list[tuple[int, int]], repeats: int = 15
               ) -> dict[tuple[int, int], list[float]]:
    """Thread seconds of each tiles_m × tiles_n split of a row-major m×k by k×n product
    (`tiled_product`), repeats interleaved; (1, 1) is one call of the whole."""
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)

    def run(tiles_m: int, tiles_n: int) -> float:
        start = time.thread_time()
        tiled_product(a, b, c, tiles_m, tiles_n)
        return time.thread_time() - start

    variants = [(1, 1), *[s for s in splits if s != (1, 1)]]
    samples: dict[tuple[int, int], list[float]] = {s: [] for s in variants}
    for split in variants:
        run(*split)  # warm
    for _ in range(repeats):
        for split in variants:
            samples[split].append(run(*split))
    return samples


def main_split_cost(shapes: list[tuple[int, int, int]], extra: list[tuple[int, int]]) -> int:
    print("CPU time of the split over one OpenBLAS call (one thread): best, median; "
          "split_overhead's estimate")
    for m, k, n in shapes:
        plan = dot_codegen.GemmPlan(m=m, n=n, k=k, transpose_a=False, lda=k,
                                    transpose_b=False, ldb=n, batch_sizes=(),
                                    lhs_batch_strides=(), rhs_batch_strides=())
        sched = dot_codegen.schedule(plan, "library")  # the tiles the library would run
        chosen = (sched.tiles_m, sched.tiles_n)
        splits = [chosen, *[s for s in extra if s != chosen]]
        samples = split_cost(m, k, n, splits)
        whole = samples[(1, 1)]
        for split in splits:
            if split == (1, 1):
                continue
            best = min(samples[split]) / min(whole) - 1
            median = statistics.median(samples[split]) / statistics.median(whole) - 1
            model = dot_codegen.split_overhead(m, n, k, *split)
            mark = " (schedule)" if split == chosen else ""
            print(f"{f'{m}x{k}x{n}':>16} {split[0]}x{split[1]} tiles{mark}: {best:+.1%}, "
                  f"{median:+.1%}; estimate {model:+.1%}")
    return 0


def forced_schedule(m: int, k: int, n: int, tiles_m: int, tiles_n: int
                    ) -> Callable[[dot_codegen.GemmPlan], dot_codegen.DotSchedule]:
    """`dot.schedule`, except that an m×k by k×n plan is cut in tiles_m × tiles_n tiles
    (bounded as `tiled_product` bounds them)."""
    chosen = dot_codegen.schedule

    def schedule(plan: dot_codegen.GemmPlan) -> dot_codegen.DotSchedule:
        sched = chosen(plan)
        if (plan.m, plan.k, plan.n, plan.batch_sizes) != (m, k, n, ()):
            return sched
        align = dot_codegen.TILE_ALIGN
        block_m = math.ceil(math.ceil(m / tiles_m) / align) * align
        block_n = math.ceil(math.ceil(n / tiles_n) / align) * align
        tm, tn = math.ceil(m / block_m), math.ceil(n / block_n)
        return dot_codegen.DotSchedule(sched.strategy, block_m, block_n, tm, tn, 1, tm * tn,
                                       sched.flops)
    return schedule


def forced_strategy(m: int, k: int, n: int, strategy: str
                    ) -> Callable[[dot_codegen.GemmPlan], str]:
    """`dot.choose_strategy`, except that an m×k by k×n plan gets `strategy`."""
    chosen = dot_codegen.choose_strategy

    def choose(plan: dot_codegen.GemmPlan) -> str:
        if (plan.m, plan.k, plan.n, plan.batch_sizes) != (m, k, n, ()):
            return chosen(plan)
        return strategy
    return choose


def compile_forced(fn: Callable[..., tf.Tensor], args: tuple[tf.Tensor, ...],
                   m: int, k: int, n: int, split: tuple[int, int] | str
                   ) -> Callable[[], tf.Tensor]:
    """`fn` under tfxla-lite with `split` (tiles, or a strategy's name) forced on its
    m×k by k×n dot, compiled now without the caches (they key by the HLO, not by the
    schedule)."""
    lite = tl.function(fn, jit_compile=True, options=measured_options())
    chosen, choose = dot_codegen.schedule, dot_codegen.choose_strategy
    cache = os.environ.get("TFXLA_LITE_CACHE")
    if isinstance(split, str):
        dot_codegen.choose_strategy = forced_strategy(m, k, n, split)
    else:
        dot_codegen.schedule = forced_schedule(m, k, n, *split)
    os.environ["TFXLA_LITE_CACHE"] = "0"
    try:
        lite(*args)
    finally:
        dot_codegen.schedule, dot_codegen.choose_strategy = chosen, choose
        if cache is None:
            del os.environ["TFXLA_LITE_CACHE"]
        else:
            os.environ["TFXLA_LITE_CACHE"] = cache
    return lambda: lite(*args)


def measure(m: int, k: int, n: int, dense: bool, splits: Sequence[tuple[int, int]] = (),
            strategies: Sequence[str] = ()) -> dict[str, float]:
    """GFLOP/s of each variant (forced splits as "TMxTN", forced strategies by name)."""
    rng = np.random.default_rng(m * n + k)
    a = tf.constant(rng.standard_normal((m, k)).astype(np.float32))
    w = tf.constant(rng.standard_normal((k, n)).astype(np.float32))
    b = tf.constant(rng.standard_normal((n,)).astype(np.float32))

    def layer(x: tf.Tensor, y: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
        product = tf.matmul(x, y)
        return tf.nn.relu(product + bias) if dense else product

    plain = tf.function(layer)
    xla = tf.function(layer, jit_compile=True)
    lite = tl.function(layer, jit_compile=True, options=measured_options())
    reference = plain(a, w, b).numpy()
    tolerance = 4 * k * np.finfo(np.float32).eps  # dot reassociation over K terms
    np.testing.assert_allclose(lite(a, w, b).numpy(), reference, rtol=tolerance,
                               atol=tolerance * np.sqrt(k))
    variants = {"tf": lambda: plain(a, w, b), "xla": lambda: xla(a, w, b),
                "lite": lambda: lite(a, w, b)}
    for split in splits:
        forced = compile_forced(layer, (a, w, b), m, k, n, split)
        np.testing.assert_allclose(forced().numpy(), reference, rtol=tolerance,
                                   atol=tolerance * np.sqrt(k))
        variants[f"{split[0]}x{split[1]}"] = forced
    for strategy in strategies:
        forced = compile_forced(layer, (a, w, b), m, k, n, strategy)
        np.testing.assert_allclose(forced().numpy(), reference, rtol=tolerance,
                                   atol=tolerance * np.sqrt(k))
        variants[strategy] = forced
    wait = getattr(tl, "wait_for_compiles", None)
    if wait is not None:  # time the finished code, not a quick tier's
        wait()
    times = compare(variants, repeats=15)
    flops = 2.0 * m * k * n
    return {name: flops / t / 1e9 for name, t in times.items()}


def measure_gemm(gemm: Gemm) -> dict[str, float]:
    """GFLOP/s of tf.function, TF's XLA and tfxla-lite on a batched or transposed GEMM."""
    rng = np.random.default_rng(gemm.m * gemm.n + gemm.k)
    lead = (gemm.batch,) if gemm.batch else ()
    a_dims = (gemm.k, gemm.m) if gemm.transpose_a else (gemm.m, gemm.k)
    b_dims = (gemm.n, gemm.k) if gemm.transpose_b else (gemm.k, gemm.n)
    a = tf.constant(rng.standard_normal(lead + a_dims).astype(np.float32))
    b = tf.constant(rng.standard_normal(lead + b_dims).astype(np.float32))

    def product(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return tf.matmul(x, y, transpose_a=gemm.transpose_a, transpose_b=gemm.transpose_b)

    plain = tf.function(product)
    xla = tf.function(product, jit_compile=True)
    lite = tl.function(product, jit_compile=True, options=measured_options())
    tolerance = 4 * gemm.k * np.finfo(np.float32).eps
    np.testing.assert_allclose(lite(a, b).numpy(), plain(a, b).numpy(), rtol=tolerance,
                               atol=tolerance * np.sqrt(gemm.k))
    wait = getattr(tl, "wait_for_compiles", None)
    if wait is not None:
        wait()
    times = compare({"tf": lambda: plain(a, b), "xla": lambda: xla(a, b),
                     "lite": lambda: lite(a, b)}, repeats=15)
    return {name: gemm.flops / t / 1e9 for name, t in times.items()}


def main_gemms(gemms: list[Gemm]) -> int:
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"op(A)@op(B), float32, GFLOP/s; lite/xla: tfxla-lite's share of TF XLA's rate; "
          f"load {load}")
    print(f"{'[B*]MxKxN':>18}{'tf':>9}{'TF XLA':>9}{'lite':>9}{'lite/xla':>9}  schedule")
    for gemm in gemms:
        rate = measure_gemm(gemm)
        print(f"{str(gemm):>18}{rate['tf']:>9.1f}{rate['xla']:>9.1f}{rate['lite']:>9.1f}"
              f"{rate['lite'] / rate['xla']:>9.0%}  "
              f"{describe_schedule(gemm.m, gemm.k, gemm.n, gemm)}")
    return 0


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    unknown = [s for s in argv if s.startswith("-") and s not in (
        "--dense", "--split", "--split-cost", "--strategy", "--transformer")]
    if unknown:
        raise SystemExit(f"unknown option {unknown[0]}; --help lists them")
    dense = "--dense" in argv
    extra: list[tuple[int, int]] = []
    if "--split" in argv:
        at = argv.index("--split")
        if at + 1 >= len(argv):
            raise SystemExit("--split needs TMxTN[,TMxTN...], e.g. --split 4x4,2x2")
        extra = [parse_split(s) for s in argv[at + 1].split(",")]
        argv = argv[:at] + argv[at + 2:]
    strategies: list[str] = []
    if "--strategy" in argv:
        at = argv.index("--strategy")
        known = ("library", "blocked", "emitted", "packed")
        if at + 1 >= len(argv) or not set(argv[at + 1].split(",")) <= set(known):
            raise SystemExit(f"--strategy needs names among {', '.join(known)}")
        strategies = argv[at + 1].split(",")
        argv = argv[:at] + argv[at + 2:]
    gemms = [parse_gemm(s) for s in argv if not s.startswith("-")]
    if "--transformer" in argv or any(not g.plain for g in gemms):
        if extra or strategies or len(argv) > len(gemms) + ("--transformer" in argv):
            raise SystemExit("batched or transposed shapes take no other option")
        preset = [parse_gemm(s) for s in TRANSFORMER_SHAPES] if "--transformer" in argv else []
        return main_gemms(gemms + preset)
    names = [s for s in argv if s not in ("--dense", "--split-cost")]
    shapes = [parse_shape(s) for s in names] or [parse_shape(s) for s in DEFAULT_SHAPES]
    if "--split-cost" in argv:
        return main_split_cost(shapes, extra)
    what = "relu(x@w+b)" if dense else "x@w"
    print(f"{what}, float32, GFLOP/s; lite/tf: tfxla-lite's share of tf.function's rate")
    print(f"{'M x K x N':>16}{'tf':>9}{'TF XLA':>9}{'lite':>9}{'lite/tf':>9}  schedule")
    for m, k, n in shapes:
        rate = measure(m, k, n, dense, extra, strategies)
        print(f"{f'{m}x{k}x{n}':>16}{rate['tf']:>9.1f}{rate['xla']:>9.1f}{rate['lite']:>9.1f}"
              f"{rate['lite'] / rate['tf']:>9.0%}  {describe_schedule(m, k, n)}")
        for split in extra:
            name = f"{split[0]}x{split[1]}"
            print(f"{'':>16}{'':>9}{'':>9}{rate[name]:>9.1f}{rate[name] / rate['tf']:>9.0%}"
                  f"  forced {name} tiles")
        for strategy in strategies:
            print(f"{'':>16}{'':>9}{'':>9}{rate[strategy]:>9.1f}"
                  f"{rate[strategy] / rate['tf']:>9.0%}  forced {strategy}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
