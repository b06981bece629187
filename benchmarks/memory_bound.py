"""Memory-bound kernels against a copy probe: swish, RMSNorm and an Adam update.

Run: .venv/bin/python -m benchmarks.memory_bound [--sizes 4,32,128] [--repeats N]
     [--burst-seconds S] [--quick] [--json PATH]

Each workload, at each size (MB per tensor), runs under tf.function, TF's XLA and
tfxla-lite in one process beside an `np.copyto` copy probe; tfxla-lite in five
output-memory modes (`LITE_MODES`, switched between bursts on the same machine code by
`runtime.set_output_pool`). Each repeat runs every variant in a rotated order; printed
are medians of the time per call, GB/s, the share of the probe and minor page faults
per call, with the load average. What each mode means and the goal (>= 80% of the
probe): docs/benchmarks.md, "Output memory", and docs/buffers.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/memory_bound.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from benchmarks.workloads import measured_options  # noqa: E402
from tfxla_lite.runtime import loader  # noqa: E402

SIZES_MB = (4.0, 32.0, 128.0)
QUICK_SIZES_MB = (0.5, 1.0)
GOAL = 0.8  # of the copy probe's bandwidth, at every size
ROW = 1024  # RMSNorm's row length
PROBE = "copy probe"
# tfxla-lite's output-memory modes: `set_output_pool` arguments (a cap of None: the
# process's own). The fresh-* modes cap the pool at 0 bytes, so that every output is a
# new mapping: what a pool miss costs, with and without the huge-page advice.
LITE_MODES: dict[str, dict[str, Any]] = {
    "pool": {"enabled": True, "huge_pages": True, "cap_bytes": None},
    "pool-4k": {"enabled": True, "huge_pages": False, "cap_bytes": None},
    "fresh-2m": {"enabled": True, "huge_pages": True, "cap_bytes": 0},
    "fresh-4k": {"enabled": True, "huge_pages": False, "cap_bytes": 0},
    "tf-alloc": {"enabled": False, "huge_pages": None, "cap_bytes": None},
}


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def swish(x: tf.Tensor) -> tf.Tensor:
    return x * tf.sigmoid(x)


def rmsnorm(x: tf.Tensor, gamma: tf.Tensor) -> tf.Tensor:
    return x * tf.math.rsqrt(tf.reduce_mean(x * x, axis=-1, keepdims=True) + 1e-6) * gamma


def adam(p: tf.Tensor, m: tf.Tensor, v: tf.Tensor, g: tf.Tensor
         ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return p - 1e-3 * m / (tf.sqrt(v) + 1e-7), m, v


@dataclass(frozen=True)
class Workload:
    name: str
    fn: Callable[..., Any]
    tensors_read: int  # full-size tensors read and written per call
    tensors_written: int

    def arguments(self, elements: int, rng: np.random.Generator) -> list[tf.Tensor]:
        def full() -> tf.Tensor:
            return tf.constant(rng.standard_normal(elements, dtype=np.float32)
                               .reshape(-1, ROW))

        if self.name == "rmsnorm":
            return [full(), tf.constant(rng.standard_normal(ROW, dtype=np.float32))]
        if self.name == "adam":
            p, m, g = full(), full(), full()
            return [p, m, tf.abs(full()), g]
        return [full()]


WORKLOADS = (Workload("swish", swish, 1, 1), Workload("rmsnorm", rmsnorm, 1, 1),
             Workload("adam", adam, 4, 3))


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _burst(call: Callable[[], Any], seconds: float) -> tuple[float, float]:
    """Seconds and minor faults per call over a burst of at least `seconds`."""
    result = call()  # untimed: the previous variant's memory settles first
    del result
    calls, faults = 0, _minor_faults()
    start = time.perf_counter()
    while True:
        result = call()
        del result
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= 3:
            return elapsed / calls, (_minor_faults() - faults) / calls


def _outputs(value: Any) -> list[np.ndarray]:
    return [np.asarray(t) for t in tf.nest.flatten(value)]


def measure(workload: Workload, megabytes: float, repeats: int, burst_seconds: float,
            seed: int = 0) -> dict[str, Any]:
    """Every variant of one workload at one size, interleaved; medians over repeats."""
    elements = max(ROW, int(megabytes * 2**20) // 4 // ROW * ROW)
    args = workload.arguments(elements, np.random.default_rng(seed))
    lite = tl.function(workload.fn, jit_compile=True, options=measured_options())
    plain = tf.function(workload.fn)
    xla = tf.function(workload.fn, jit_compile=True)
    expected = _outputs(plain(*args))
    for got, want in zip(_outputs(lite(*args)), expected):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    source = np.random.default_rng(seed).standard_normal(elements, dtype=np.float32)
    destination = np.empty_like(source)
    np.copyto(destination, source)

    calls: dict[str, Callable[[], Any]] = {
        PROBE: lambda: np.copyto(destination, source),
        "tf.function": lambda: plain(*args),
        "xla": lambda: xla(*args),
    }
    for mode in LITE_MODES:
        calls[f"tfxla-lite {mode}"] = lambda: lite(*args)
    names = list(calls)
    before = loader.output_pool_stats()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    faults: dict[str, list[float]] = {name: [] for name in names}
    try:
        for repeat in range(repeats):
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                if name.startswith("tfxla-lite "):
                    mode = LITE_MODES[name.removeprefix("tfxla-lite ")]
                    cap = before.cap_bytes if mode["cap_bytes"] is None else mode["cap_bytes"]
                    loader.set_output_pool(enabled=mode["enabled"], cap_bytes=cap,
                                           huge_pages=mode["huge_pages"])
                per_call, per_call_faults = _burst(calls[name], burst_seconds)
                seconds[name].append(per_call)
                faults[name].append(per_call_faults)
    finally:
        loader.set_output_pool(enabled=before.enabled, cap_bytes=before.cap_bytes,
                               huge_pages=before.huge_pages)
    after = loader.output_pool_stats()

    probe_bytes = 2 * elements * 4
    moved = (workload.tensors_read + workload.tensors_written) * elements * 4
    rows = {}
    for name in names:
        median = statistics.median(seconds[name])
        bandwidth = (probe_bytes if name == PROBE else moved) / median / 1e9
        rows[name] = {"median_ms": median * 1e3, "best_ms": min(seconds[name]) * 1e3,
                      "gb_per_s": bandwidth,
                      "faults_per_call": statistics.median(faults[name])}
    probe = rows[PROBE]["gb_per_s"]
    for row in rows.values():
        row["of_probe"] = row["gb_per_s"] / probe
    return {"workload": workload.name, "megabytes": megabytes, "elements": elements,
            "bytes_moved": moved, "variants": rows,
            "pool_hits": after.hits - before.hits, "pool_misses": after.misses - before.misses}


def _print(results: list[dict[str, Any]]) -> None:
    names = list(results[0]["variants"])
    print(f"{'workload':<9} {'MB':>6}  " + "  ".join(f"{name:>20}" for name in names))
    for result in results:
        cells = []
        for name in names:
            row = result["variants"][name]
            cells.append(f"{row['gb_per_s']:5.1f} GB/s {row['of_probe']:4.0%} "
                         f"{row['faults_per_call']:5.0f}f")
        print(f"{result['workload']:<9} {result['megabytes']:>6g}  "
              + "  ".join(f"{cell:>20}" for cell in cells))
    print("(each cell: bandwidth, share of the copy probe's, minor page faults per call)")


def goals(results: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """Issue 19's goal per workload and size: tfxla-lite (default mode) >= 80% of the probe."""
    return [(f"{r['workload']} {r['megabytes']:g} MB: tfxla-lite "
             f"{r['variants']['tfxla-lite pool']['of_probe']:.0%} of the copy probe "
             f"(goal >= {GOAL:.0%})", r["variants"]["tfxla-lite pool"]["of_probe"] >= GOAL)
            for r in results]


def _sizes(text: str) -> tuple[float, ...]:
    try:
        sizes = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are MB numbers, got {text!r}") from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_bound",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=_sizes, default=None,
                        help="MB per tensor, comma-separated (default 4,32,128)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--burst-seconds", type=float, default=0.3)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one repeat, short bursts: checks the run, not speed")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    sizes = args.sizes or (QUICK_SIZES_MB if args.quick else SIZES_MB)
    repeats, burst = (1, 0.01) if args.quick else (args.repeats, args.burst_seconds)

    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on for x86 Linux)")
    load_before = load_average()
    print(f"memory-bound kernels; TensorFlow {tf.__version__}, {os.cpu_count()} cores, "
          f"TF_ENABLE_ONEDNN_OPTS={onednn}; load average {load_before}")
    results = [measure(workload, size, repeats, burst)
               for size in sizes for workload in WORKLOADS]
    load_after = load_average()
    _print(results)
    print(f"load average before {load_before}, after {load_after}")
    checked = goals(results)
    print("goals:")
    for text, met in checked:
        print(f"  [{'met' if met else 'MISSED'}] {text}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"tensorflow": tf.__version__, "cores": os.cpu_count(), "onednn": onednn,
             "load_before": load_before, "load_after": load_after, "repeats": repeats,
             "burst_seconds": burst, "results": results,
             "goals": [{"goal": text, "met": met} for text, met in checked]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
