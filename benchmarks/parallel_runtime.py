"""Parallel runtimes side by side: TF's intra-op pool, libgomp, and the caller alone.

Run: .venv/bin/python -m benchmarks.parallel_runtime [WORKLOAD ...] [--repeats N]
     [--runtimes tf,openmp,serial] [--xla] [--json PATH]

Each workload is compiled once; its kernels read the process's parallel runtime at
every region (`tfxla_lite.runtime.set_parallel_runtime`), so one process checks that
every runtime gives identical outputs, then times them on the same machine code in
rotated interleaved bursts (`--xla` adds TF's XLA as a reference). Only ratios within
one run mean anything. docs/benchmarks.md, "Parallel runtimes".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/parallel_runtime.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from benchmarks.workloads import Workload, by_name, measured_options  # noqa: E402
from tfxla_lite.runtime import loader  # noqa: E402

DEFAULT_WORKLOADS = ("mlp", "mlp_infer_b64", "mlp_train_b128", "softmax_4096x1024",
                     "layer_norm_4096x1024", "gelu")
RUNTIMES = tuple(loader.PARALLEL_RUNTIMES)
XLA = "xla"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _compiled(fn: Callable, args: list[tf.Tensor]) -> Callable[[], Any]:
    """tfxla-lite's variant, as the benchmark suite makes it: must-compile, else auto."""
    lite = tl.function(fn, jit_compile=True, options=measured_options())
    try:
        lite(*args)
    except tl.CompilationError:
        lite = tl.function(fn, min_cluster_size=1)
        lite(*args)
    return lambda: lite(*args)


def _check_same_bits(call: Callable[[], Any], runtimes: list[str]) -> None:
    results = {}
    for runtime in runtimes:
        loader.set_parallel_runtime(runtime)
        results[runtime] = [np.asarray(t) for t in tf.nest.flatten(call())]
    first, *others = runtimes
    for runtime in others:
        for a, b in zip(results[first], results[runtime]):
            if not np.array_equal(a, b, equal_nan=True):
                raise AssertionError(f"outputs differ between runtimes {first} and {runtime}")


def measure(workload: Workload, runtimes: list[str], repeats: int, burst_seconds: float,
            with_xla: bool) -> dict[str, Any]:
    fn, args = workload.make()
    lite = _compiled(fn, args)
    if workload.kind != "train":
        _check_same_bits(lite, runtimes)
    variants: dict[str, Callable[[], Any]] = {runtime: lite for runtime in runtimes}
    if with_xla:
        xla = tf.function(fn, jit_compile=True)
        xla(*args)
        variants[XLA] = lambda: xla(*args)

    def select(name: str) -> None:
        if name != XLA:
            loader.set_parallel_runtime(name)

    # A burst as long as `burst_seconds` under the first runtime; every variant makes the
    # same number of calls per burst, so that all see bursts of about one length.
    select(runtimes[0])
    lite()
    start = time.perf_counter()
    lite()
    calls = max(1, int(burst_seconds / max(time.perf_counter() - start, 1e-6)))
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    before = loader.parallel_stats()
    for repeat in range(repeats):
        for offset in range(len(names)):
            name = names[(repeat + offset) % len(names)]
            select(name)
            variants[name]()  # untimed: the switch, and a sleeping worker's wake-up
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                variants[name]()
            samples[name].append((time.perf_counter() - start) / calls)
            cpu[name].append((time.process_time() - start_cpu) / calls)
    after = loader.parallel_stats()
    loader.set_parallel_runtime(tl.get_options().parallel_runtime)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    entered = after.workers_entered - before.workers_entered
    late = after.workers_late - before.workers_late
    return {
        "name": workload.name,
        "calls_per_burst": calls,
        "median_ms": {name: t * 1e3 for name, t in medians.items()},
        "best_ms": {name: min(values) * 1e3 for name, values in samples.items()},
        "median_vs_first": {name: t / medians[runtimes[0]] for name, t in medians.items()},
        "cpu_ms": {name: statistics.median(values) * 1e3 for name, values in cpu.items()},
        "pool_regions": after.on_pool - before.on_pool,
        "late_worker_share": late / (entered + late) if entered + late else None,
    }


def _print(result: dict[str, Any], names: list[str]) -> None:
    print(f"{result['name']}  ({result['calls_per_burst']} calls per burst; "
          f"late pool workers {_share(result['late_worker_share'])})")
    for name in names:
        print(f"  {name:<8} median {result['median_ms'][name]:9.3f} ms   "
              f"best {result['best_ms'][name]:9.3f} ms   "
              f"{result['median_vs_first'][name]:5.2f}x {names[0]}'s median   "
              f"CPU {result['cpu_ms'][name]:8.3f} ms")
    sys.stdout.flush()


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.parallel_runtime",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(DEFAULT_WORKLOADS))
    parser.add_argument("--runtimes", default=",".join(RUNTIMES),
                        help="comma-separated, from " + ", ".join(RUNTIMES))
    parser.add_argument("--repeats", type=int, default=15, help="bursts per runtime")
    parser.add_argument("--burst-seconds", type=float, default=0.05)
    parser.add_argument("--xla", action="store_true", help="time TF's XLA in the rotation")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown or not runtimes:
        parser.error(f"unknown runtime(s) {', '.join(unknown) or '(none)'}; "
                     f"runtimes are {', '.join(RUNTIMES)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    try:
        workloads = by_name(args.workloads, quick=False)
    except KeyError as error:
        parser.error(f"unknown workload {error}")

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load_before = load_average()
    print(f"{cores} cores; load average {load_before}; TF intra-op threads "
          f"{tf.config.threading.get_intra_op_parallelism_threads() or 'default'}")
    names = runtimes + ([XLA] if args.xla else [])
    started = time.perf_counter()
    results = []
    for workload in workloads:
        result = measure(workload, runtimes, args.repeats, args.burst_seconds, args.xla)
        results.append(result)
        _print(result, names)
    load_after = load_average()
    print(f"load average {load_after}; {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cores": cores, "load_before": load_before,
                                         "load_after": load_after, "results": results},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
