"""Parallel runtimes side by side: TF's intra-op pool, libgomp, and the caller alone.

Run: .venv/bin/python -m benchmarks.parallel_runtime [WORKLOAD|zoo:MODEL[:MODE] ...] [--repeats N]
     [--runtimes tf,tf_team,openmp,serial] [--xla] [--load N] [--json PATH]

Each workload is compiled once; its kernels read the process's parallel runtime at
every region (`tfxla_lite.runtime.set_parallel_runtime`), so one process checks that
every runtime gives identical outputs, then times them on the same machine code in
rotated interleaved bursts (`--xla` adds TF's XLA as a reference). Only ratios within
one run mean anything. docs/benchmarks.md, "Parallel runtimes".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def busy_load(processes: int) -> Iterator[None]:
    """`processes` busy-loop processes running for the block's duration: a controlled
    load, so that runs under load compare with one another. Stopped (killed) on exit."""
    workers = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(processes)]
    try:
        yield
    finally:
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.wait()


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
            with_xla: bool, load: int = 0) -> dict[str, Any]:
    fn, args = workload.make()
    lite = _compiled(fn, args)
    xla: Callable[[], Any] | None = None
    if with_xla:
        compiled = tf.function(fn, jit_compile=True)
        compiled(*args)
        xla = lambda: compiled(*args)  # noqa: E731
    return _rotate(workload.name, lite, xla, workload.kind != "train", runtimes, repeats,
                   burst_seconds, load)


def measure_zoo(step: Any, runtimes: list[str], repeats: int, burst_seconds: float,
                with_xla: bool, load: int = 0) -> dict[str, Any]:
    """A model-zoo step (`benchmarks.zoo`): its tfxla-lite variant, as the zoo makes it."""
    variant = step.prepare()
    lite = variant("lite").call
    lite()
    xla = None
    if with_xla:
        xla = variant("xla").call
        xla()
    return _rotate(f"zoo:{step.model}:{step.mode}", lite, xla, step.mode == "infer",
                   runtimes, repeats, burst_seconds, load)


def _rotate(label: str, lite: Callable[[], Any], xla: Callable[[], Any] | None,
            check_bits: bool, runtimes: list[str], repeats: int, burst_seconds: float,
            load: int) -> dict[str, Any]:
    """Times `lite` under every runtime (and `xla`) in rotated interleaved bursts."""
    if check_bits:
        _check_same_bits(lite, runtimes)
    variants: dict[str, Callable[[], Any]] = {runtime: lite for runtime in runtimes}
    if xla is not None:
        variants[XLA] = xla

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
    schedules: dict[str, int] = {name: 0 for name in names}
    regions: dict[str, int] = {name: 0 for name in names}
    schedule_ns: dict[str, int] = {name: 0 for name in names}
    join_ns: dict[str, int] = {name: 0 for name in names}
    before = loader.parallel_stats()
    with busy_load(load):
        load_during = load_average()
        for repeat in range(repeats):
            for offset in range(len(names)):
                name = names[(repeat + offset) % len(names)]
                select(name)
                variants[name]()  # untimed: the switch, and a sleeping worker's wake-up
                stats, timing = loader.parallel_stats(), loader.launch_timing()
                start, start_cpu = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    variants[name]()
                samples[name].append((time.perf_counter() - start) / calls)
                cpu[name].append((time.process_time() - start_cpu) / calls)
                ran, timed = loader.parallel_stats(), loader.launch_timing()
                schedule_ns[name] += timed.schedule_ns - timing.schedule_ns
                join_ns[name] += timed.join_ns - timing.join_ns
                schedules[name] += ran.workers_scheduled - stats.workers_scheduled
                regions[name] += ran.on_pool - stats.on_pool
        load_during = f"{load_during} -> {load_average()}"
    after = loader.parallel_stats()
    loader.set_parallel_runtime(tl.get_options().parallel_runtime)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    entered = after.workers_entered - before.workers_entered
    late = after.workers_late - before.workers_late
    return {
        "name": label,
        "calls_per_burst": calls,
        "busy_processes": load,
        "load_average": load_during,
        "median_ms": {name: t * 1e3 for name, t in medians.items()},
        "best_ms": {name: min(values) * 1e3 for name, values in samples.items()},
        "median_vs_first": {name: t / medians[runtimes[0]] for name, t in medians.items()},
        "cpu_ms": {name: statistics.median(values) * 1e3 for name, values in cpu.items()},
        # pool regions and pool closures scheduled (wake-ups) per call, by runtime
        "regions_per_call": {name: n / (calls * repeats) for name, n in regions.items()},
        "schedules_per_call": {name: n / (calls * repeats) for name, n in schedules.items()},
        # the launching threads' time in Schedule and in joins, per call
        "schedule_ms": {name: n / (calls * repeats) / 1e6 for name, n in schedule_ns.items()},
        "join_ms": {name: n / (calls * repeats) / 1e6 for name, n in join_ns.items()},
        "pool_regions": after.on_pool - before.on_pool,
        "late_worker_share": late / (entered + late) if entered + late else None,
    }


def _print(result: dict[str, Any], names: list[str]) -> None:
    print(f"{result['name']}  ({result['calls_per_burst']} calls per burst; "
          f"late pool workers {_share(result['late_worker_share'])}; "
          f"{result['busy_processes']} busy processes, load {result['load_average']})")
    for name in names:
        print(f"  {name:<8} median {result['median_ms'][name]:9.3f} ms   "
              f"best {result['best_ms'][name]:9.3f} ms   "
              f"{result['median_vs_first'][name]:5.2f}x {names[0]}'s median   "
              f"CPU {result['cpu_ms'][name]:8.3f} ms   "
              f"regions {result['regions_per_call'][name]:5.0f}, "
              f"schedules {result['schedules_per_call'][name]:5.0f} per call "
              f"({result['schedule_ms'][name]:.2f} ms), "
              f"joins {result['join_ms'][name]:.2f} ms")
    sys.stdout.flush()


def _zoo_steps(names: list[str]) -> list[Any]:
    """`zoo:MODEL` (its train and infer steps) or `zoo:MODEL:MODE` as `benchmarks.zoo`
    builds them; KeyError for an unknown one."""
    if not names:
        return []
    from benchmarks import zoo

    steps = []
    for name in names:
        _, model, *mode = name.split(":")
        if model not in zoo.MODELS:
            raise KeyError(name)
        chosen = [s for s in zoo.zoo([model], quick=False)
                  if (s.mode == mode[0] if mode else s.mode in ("train", "infer"))]
        if not chosen:
            raise KeyError(name)
        steps.extend(chosen)
    return steps


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
    parser.add_argument("--load", type=int, default=0,
                        help="busy-loop processes running around the timed bursts")
    parser.add_argument("--team-idle", type=float,
                        help="microseconds a tf_team runtime helper waits for its launch's next "
                             "region (loader.set_team_idle)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown or not runtimes:
        parser.error(f"unknown runtime(s) {', '.join(unknown) or '(none)'}; "
                     f"runtimes are {', '.join(RUNTIMES)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.load < 0:
        parser.error("--load must be at least 0")
    zoo_names = [w for w in args.workloads if w.startswith("zoo:")]
    try:
        workloads = by_name([w for w in args.workloads if w not in zoo_names], quick=False)
        steps = _zoo_steps(zoo_names)
    except KeyError as error:
        parser.error(f"unknown workload {error}")

    if args.team_idle is not None:
        loader.set_team_idle(args.team_idle)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load_before = load_average()
    print(f"{cores} cores; load average {load_before}; TF intra-op threads "
          f"{tf.config.threading.get_intra_op_parallelism_threads() or 'default'}")
    names = runtimes + ([XLA] if args.xla else [])
    started = time.perf_counter()
    results = []
    for workload in workloads:
        result = measure(workload, runtimes, args.repeats, args.burst_seconds, args.xla,
                         args.load)
        results.append(result)
        _print(result, names)
    for step in steps:
        result = measure_zoo(step, runtimes, args.repeats, args.burst_seconds, args.xla,
                             args.load)
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
