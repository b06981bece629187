"""Where a memory-bound launch's time goes through TF, per call, and A/B of the pool join.

Run: .venv/bin/python -m benchmarks.launch_timeline [WORKLOAD ...] [--repeats N]
     [--spins 20,200] [--parts 4,16] [--kernel-alone]   (default workloads:
     softmax_4096x1024, layer_norm_4096x1024)

For each workload, one process compiles tfxla-lite's variant once per `--parts` value
(`codegen/cpu/parallel.py` `_PARTS_PER_THREAD`, compiled with the caches off and the
kernels' cycle counters of `benchmarks/kernel_profile.py`) and times, in interleaved
bursts of one fixed order as the benchmark suite does (`tfxla_lite.timing.compare`;
here tf.function, XLA, the suite's bandwidth probe, then tfxla-lite's variants), every
(parts, join spin) pair. The join spin (how long a pool region's caller spins for its
last workers before it sleeps, `loader.set_join_spin`) is read per region, so it
switches between bursts. Printed per variant: the median and best burst's time per
call; for tfxla-lite also, from `loader.launch_timing()`, the op's prologue (output
allocation, temp arena), `entry` and the rest of the call (TF dispatch, Python), per
pool region the caller's time in `Schedule`, in its own task and waiting for the
workers that entered, a closure's delay from scheduling to its start, the share of
closures that started after their region was done, the minor page faults per call
(getrusage: is the output buffer fresh memory?), and the kernel's mean and minimum time
by the cycle counter. Then the first
variant's calls one at a time, alone and each right after a call of TF's XLA: the 10th
percentile, median and 90th percentile of the same quantities per call.

`--kernel-alone` instead compiles the workload's cluster from its HLO for one and two
threads and calls the entry on preallocated buffers, interleaved call by call, with the
inputs cycled through 128 MiB so that each call reads from DRAM
(`kernel_profile.thread_scaling`): best and median per thread count, and the same over
the calls on which both threads really worked (process CPU time at least 1.6x the wall
time), which is what the kernel gives when the second core is free; then one thread's
kernel alone and while a second copy runs beside it on other buffers (thread CPU time:
does one thread's rate drop when two stream from DRAM at once?).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # `python benchmarks/launch_timeline.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TFXLA_LITE_CACHE"] = "0"  # each --parts value must compile its own kernels

import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from benchmarks.kernel_profile import (  # noqa: E402
    Profile,
    concurrent_streams,
    profiling,
    scaling_report,
    thread_scaling,
)
from benchmarks.run import BandwidthProbe  # noqa: E402
from benchmarks.workloads import by_name, measured_options  # noqa: E402
from tfxla_lite.codegen.cpu import parallel  # noqa: E402
from tfxla_lite.hlo.parser import parse_module  # noqa: E402
from tfxla_lite.runtime import loader  # noqa: E402

DEFAULT_WORKLOADS = ("softmax_4096x1024", "layer_norm_4096x1024")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Counters:
    """Per-variant sums of the library's counters over that variant's bursts."""

    def __init__(self) -> None:
        # calls, caller task, join, closure start, schedule, entered, late, regions,
        # faults, launches, prologue, entry, seconds
        self.sums = [0.0] * 13

    def add(self, calls: int, seconds: float, before: tuple, after: tuple) -> None:
        delta = [b - a for a, b in zip(before, after)]
        self.sums[0] += calls
        self.sums[12] += seconds
        for n, value in enumerate(delta):
            self.sums[n + 1] += value


def _snapshot() -> tuple:
    stats, t = loader.parallel_stats(), loader.launch_timing()
    return (t.caller_task_ns, t.join_ns, t.closure_start_ns, t.schedule_ns,
            stats.workers_entered, stats.workers_late, stats.on_pool, _faults(),
            t.launches, t.prologue_ns, t.entry_ns)


def measure(name: str, repeats: int, spins: list[int], parts: list[int],
            burst_seconds: float) -> None:
    (workload,) = by_name([name], quick=False)
    fn, args = workload.make()
    lites: dict[int, tuple[Callable[[], Any], Profile]] = {}
    saved = parallel._PARTS_PER_THREAD
    try:
        for count in parts:
            parallel._PARTS_PER_THREAD = count
            with profiling() as profile:
                lite = tl.function(fn, jit_compile=True, options=measured_options())
                lite(*args)
            lites[count] = (lambda lite=lite: lite(*args), profile)
    finally:
        parallel._PARTS_PER_THREAD = saved
    xla = tf.function(fn, jit_compile=True)
    plain = tf.function(fn)
    probe = BandwidthProbe()
    variants: dict[str, Callable[[], Any]] = {
        "tf_function": lambda: plain(*args), "xla": lambda: xla(*args), "probe": probe}
    for count in parts:
        for spin in spins:
            variants[f"lite p{count} s{spin}"] = lites[count][0]
    names = list(variants)

    def select(variant: str) -> None:
        if variant.startswith("lite"):
            loader.set_join_spin(int(variant.rsplit("s", 1)[1]))

    calls: dict[str, int] = {}
    for variant in names:
        select(variant)
        variants[variant]()
        start = time.perf_counter()
        variants[variant]()
        calls[variant] = max(1, int(burst_seconds / max(time.perf_counter() - start, 1e-6)))
    for _, profile in lites.values():
        profile.reset()
    samples: dict[str, list[float]] = {variant: [] for variant in names}
    counters = {variant: Counters() for variant in names}
    for _ in range(repeats):
        for variant in names:
            select(variant)
            before = _snapshot()
            start = time.perf_counter()
            for _ in range(calls[variant]):
                variants[variant]()
            seconds = time.perf_counter() - start
            samples[variant].append(seconds / calls[variant])
            counters[variant].add(calls[variant], seconds, before, _snapshot())
    probe.close()
    loader.set_join_spin(20)

    kernels = {}
    for count, (_, profile) in lites.items():  # before the per-call pass adds calls
        lite_calls = sum(counters[v].sums[0] for v in names if v.startswith(f"lite p{count} "))
        kernels[count] = profile.kernels(int(lite_calls))
    per_call = {mode: _per_call(lites[parts[0]][0], before)
                for mode, before in (("alone", None), ("after xla", lambda: xla(*args)))}

    print(f"{name}  ({repeats} bursts each; load {_load()})")
    moved = workload.bytes
    probe_gbps = probe.moved / statistics.median(samples["probe"]) / 1e9
    for variant in names:
        median, best = statistics.median(samples[variant]), min(samples[variant])
        line = f"  {variant:<16} median {median * 1e3:7.3f} ms  best {best * 1e3:7.3f} ms"
        if variant != "probe" and moved:
            line += f"  {100 * moved / median / 1e9 / probe_gbps:4.0f}% of probe"
        print(line)
    for variant in names:
        if not variant.startswith("lite"):
            continue
        count = int(variant.split()[1][1:])
        (total_calls, task, join, start_delay, schedule, entered, late, regions, faults,
         launches, prologue, entry, seconds) = counters[variant].sums
        print(f"  {variant:<16} per call: {seconds / total_calls * 1e6:7.1f} us, of which the "
              f"op's prologue {prologue / max(launches, 1) / 1e3:6.1f} us, entry "
              f"{entry / max(launches, 1) / 1e3:7.1f} us, outside the op "
              f"{(seconds * 1e9 - prologue - entry) / total_calls / 1e3:6.1f} us "
              f"({launches / total_calls:.0f} launch per call)")
        print(f"  {variant:<16} per region: Schedule {schedule / max(regions, 1) / 1e3:6.1f} us,"
              f" caller task {task / max(regions, 1) / 1e3:7.1f} us,"
              f" join {join / max(regions, 1) / 1e3:6.1f} us; closure start "
              f"{start_delay / max(entered + late, 1) / 1e3:7.1f} us, late "
              f"{100 * late / max(entered + late, 1):3.0f}%; faults/call "
              f"{faults / total_calls:.1f}")
    print(f"  per call, lite p{parts[0]} s20, {PER_CALL} calls (10th percentile / median / "
          f"90th, us):")
    for mode, columns in per_call.items():
        print(f"    {mode:<9} " + "  ".join(
            f"{label} {_quantiles(values)}" for label, values in columns.items()
            if label != "late") + f"  late {100 * statistics.mean(columns['late']):.0f}%")
    for count, rows in kernels.items():
        for kernel in rows:
            print(f"  kernel p{count}: mean {kernel.total_seconds * 1e3:.3f} ms, min "
                  f"{kernel.min_seconds * 1e3:.3f} ms  {kernel.label[:60]}")
    sys.stdout.flush()


PER_CALL = 200


def kernel_alone(name: str, repeats: int) -> None:
    """The workload's one cluster, compiled from its HLO for 1 and 2 threads and timed
    without TF on preallocated buffers (`kernel_profile.thread_scaling`)."""
    (workload,) = by_name([name], quick=False)
    fn, args = workload.make()
    lite = tl.function(fn, jit_compile=True, options=measured_options())
    text = lite.experimental_get_compiler_ir(*args)(stage="hlo")
    if text.count("HloModule ") != 1:
        print(f"{name}: --kernel-alone needs exactly one compiled cluster")
        return
    arrays = [np.asarray(a) for a in args]
    samples, outputs = thread_scaling(lambda: parse_module(text), arrays, (1, 2), repeats)
    expected = tf.nest.flatten(lite(*args))
    same = all(np.array_equal(got, np.asarray(want), equal_nan=True)
               for got, want in zip(outputs, expected, strict=True))
    print(f"{name} kernel alone, {repeats} calls per thread count, inputs from DRAM; load "
          f"{_load()}; bits as through TF: {same}")
    print(scaling_report(samples, workload.bytes))
    alone, pairs = concurrent_streams(lambda: parse_module(text), arrays, max(repeats // 4, 10))
    both = sorted(cpu for pair in pairs for cpu in pair)
    if both:
        print(f"  one thread's kernel, thread CPU ms, best / median: alone "
              f"{min(alone) * 1e3:.3f} / {statistics.median(alone) * 1e3:.3f}; while a second "
              f"runs beside it ({len(pairs)} pairs overlapped) {both[0] * 1e3:.3f} / "
              f"{statistics.median(both) * 1e3:.3f}")
    else:
        print(f"  one thread's kernel alone {min(alone) * 1e3:.3f} ms; no two runs overlapped")
    sys.stdout.flush()


def _per_call(lite: Callable[[], Any], before: Callable[[], Any] | None
              ) -> dict[str, list[float]]:
    """Each of `PER_CALL` calls on its own (join spin 20 us), optionally right after a call
    of `before`: its wall time and the library's counters, microseconds."""
    loader.set_join_spin(20)
    columns: dict[str, list[float]] = {label: [] for label in (
        "wall", "entry", "Schedule", "task", "join", "closure start", "late")}
    for _ in range(PER_CALL):
        if before is not None:
            before()
        stats, timing = loader.parallel_stats(), loader.launch_timing()
        start = time.perf_counter()
        lite()
        wall = time.perf_counter() - start
        stats_after, after = loader.parallel_stats(), loader.launch_timing()
        columns["wall"].append(wall * 1e6)
        columns["entry"].append((after.entry_ns - timing.entry_ns) / 1e3)
        columns["Schedule"].append((after.schedule_ns - timing.schedule_ns) / 1e3)
        columns["task"].append((after.caller_task_ns - timing.caller_task_ns) / 1e3)
        columns["join"].append((after.join_ns - timing.join_ns) / 1e3)
        # A late closure may count in the next call: both columns are rough per call.
        columns["closure start"].append((after.closure_start_ns - timing.closure_start_ns) / 1e3)
        columns["late"].append(float(stats_after.workers_late > stats.workers_late))
    return columns


def _quantiles(values: list[float]) -> str:
    ordered = sorted(values)
    return "/".join(f"{ordered[int(q * (len(ordered) - 1))]:.0f}" for q in (0.1, 0.5, 0.9))


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launch_timeline",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(DEFAULT_WORKLOADS))
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--spins", default="20", help="join spins to A/B, microseconds")
    parser.add_argument("--parts", default=str(parallel._PARTS_PER_THREAD),
                        help="parts per thread to A/B")
    parser.add_argument("--kernel-alone", action="store_true",
                        help="time the cluster's kernels without TF on 1 and 2 threads")
    parser.add_argument("--burst-seconds", type=float, default=0.02)
    args = parser.parse_args(argv)
    spins = [int(s) for s in args.spins.split(",")]
    parts = [int(p) for p in args.parts.split(",")]
    if args.repeats < 1 or min(spins) < 0 or min(parts) < 1:
        parser.error("--repeats and --parts must be at least 1, --spins at least 0")
    print(f"{os.cpu_count()} CPUs; load {_load()}")
    for name in args.workloads:
        if args.kernel_alone:
            kernel_alone(name, max(args.repeats, 100))
        else:
            measure(name, args.repeats, spins, parts, args.burst_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
