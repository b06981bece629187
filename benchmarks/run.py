"""Run the benchmark suite: `python -m benchmarks [--quick] [--out DIR] [WORKLOAD ...]`.

For every workload (`benchmarks/workloads.py`), in one process: first calls of TF's XLA
and tfxla-lite with a cold kernel cache (after `warm_up`), interleaved time per call of
tf.function, TF's XLA and tfxla-lite (`tfxla_lite.timing.compare`), achieved rates
against peaks measured in the same run (`BandwidthProbe` for memory-bound work), the
temp arena and the compiled share; then cold and warm starts in subprocesses. Results
go to `<out>/latest.json`; a full run also writes the results section of
`docs/benchmarks.md` and `docs/benchmarks.png`. Each column's meaning: the top of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from benchmarks import report  # noqa: E402
from benchmarks.workloads import Workload, by_name, measured_options, workloads  # noqa: E402
from tfxla_lite.cache_dir import cache_root  # noqa: E402
from tfxla_lite.timing import compare, time_first_call  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOT_COMPUTE = frozenset({"Placeholder", "ReadVariableOp", "AssignVariableOp",
                         "AssignAddVariableOp", "AssignSubVariableOp", "VarHandleOp",
                         "Identity", "IdentityN", "NoOp", "Const"})


def private_cache() -> Path:
    """A fresh tfxla-lite cache root that shares the built C++ op but no kernels."""
    folder = Path(tempfile.mkdtemp(prefix="tfxla_lite_bench_"))
    ops = cache_root() / "ops"
    if ops.exists():
        (folder / "ops").symlink_to(ops, target_is_directory=True)
    return folder


# -- peaks ---------------------------------------------------------------------------------

def bandwidth_peak(elements: int, repeats: int) -> dict[str, float]:
    """GB/s of NumPy copy and add over arrays far beyond the caches, 1 and all cores
    (NumPy releases the GIL, so threads on halves of the arrays run in parallel)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    a, b = np.ones(elements, np.float32), np.ones(elements, np.float32)
    c = np.empty(elements, np.float32)
    pool = concurrent.futures.ThreadPoolExecutor(cores)

    def split(fn: Any) -> Any:
        bounds = np.linspace(0, elements, cores + 1).astype(int)
        return lambda: list(pool.map(lambda i: fn(slice(bounds[i], bounds[i + 1])),
                                     range(cores)))

    def copy(s: slice) -> None:
        np.copyto(c[s], a[s])

    def add(s: slice) -> None:
        np.add(a[s], b[s], out=c[s])

    full = slice(0, elements)
    times = compare({"copy_1": lambda: copy(full), "add_1": lambda: add(full),
                     f"copy_{cores}": split(copy), f"add_{cores}": split(add)},
                    repeats=repeats)
    pool.shutdown()
    rates = {name: (8 if name.startswith("copy") else 12) * elements / t / 1e9
             for name, t in times.items()}
    rates["peak"] = max(rates.values())
    return rates


class BandwidthProbe:
    """A NumPy copy on all cores of two 128 MiB arrays (far beyond the caches, as the
    run's peak): the DRAM bandwidth at the moment, timed in the same interleaved bursts
    as a memory-bound workload, so that on a machine shared with other jobs both are
    measured under one load. (A copy of the workload's own size would run partly from
    the L3 cache, which holds 32 MiB on the development machine.)"""

    ELEMENTS = 32 << 20  # float32: 128 MiB per array

    def __init__(self) -> None:
        elements = self.ELEMENTS
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.source = np.ones(elements, np.float32)
        self.target = np.empty(elements, np.float32)
        self.bounds = np.linspace(0, elements, self.cores + 1).astype(int)
        self.pool = concurrent.futures.ThreadPoolExecutor(self.cores)
        self.moved = 8.0 * elements

    def _copy(self, part: int) -> None:
        s = slice(self.bounds[part], self.bounds[part + 1])
        np.copyto(self.target[s], self.source[s])

    def __call__(self) -> None:
        list(self.pool.map(self._copy, range(self.cores)))

    def close(self) -> None:
        self.pool.shutdown()


def matmul_peak(n: int, repeats: int) -> float:
    """GFLOP/s of tf.matmul (oneDNN) on n×n×n float32."""
    a, b = (tf.constant(np.random.default_rng(i).standard_normal((n, n)).astype(np.float32))
            for i in range(2))
    matmul = tf.function(tf.matmul)
    seconds = compare({"matmul": lambda: matmul(a, b)}, repeats=repeats)["matmul"]
    return 2.0 * n ** 3 / seconds / 1e9


# -- one workload --------------------------------------------------------------------------

def forget_conversions() -> None:
    """Empty TF's in-process cache of AutoGraph conversions (by code object): each
    first call then converts the workload's source itself, as in a fresh process.
    Without this the second compiler timed got the first one's conversion for free
    (16-40 ms per function here)."""
    from tensorflow.python.autograph.impl import api as autograph
    from tensorflow.python.autograph.pyct import cache as conversions

    autograph._TRANSPILER._cache = conversions.CodeObjectCache()


def _lite(fn: Any, args: list[tf.Tensor]) -> tuple[Any, str, float]:
    """tfxla-lite's variant: must-compile if it can, else auto-clustering; its mode and
    first-call seconds."""
    # Strict: a trace tfxla-lite cannot compile whole must raise here, not run on TF's
    # XLA (the jit_compile=True fallback), or this column would time TF's XLA.
    lite = tl.function(fn, jit_compile=True, options=measured_options())
    start = time.perf_counter()
    try:
        lite(*args)
        return lite, "jit_compile=True", time.perf_counter() - start
    except tl.CompilationError:
        lite = tl.function(fn, min_cluster_size=1)
        return lite, "auto", time_first_call(lambda: lite(*args))


def _coverage(lite: Any, args: list[tf.Tensor]) -> dict[str, Any]:
    explained = lite.explain(*args)
    compiled = [c for c in explained.compiled_clusters]
    compiled_ops = sum(1 for c in compiled for _, op_type in c.ops if op_type not in NOT_COMPUTE)
    left = [f.op_type for f in explained.fallbacks if f.op_type not in NOT_COMPUTE]
    return {"compiled_ops": compiled_ops, "total_ops": compiled_ops + len(left),
            "left_in_tf": sorted(set(left)), "clusters": len(compiled),
            "kernels": sum(c.kernel_count for c in compiled),
            "temp_bytes": sum(c.temp_bytes for c in compiled),
            "temp_bytes_without_reuse": sum(c.temp_bytes_without_reuse for c in compiled)}


def _relative_error(actual: Any, expected: Any) -> float:
    worst = 0.0
    for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
        a, e = np.asarray(a), np.asarray(e)
        scale = max(float(np.max(np.abs(e))), 1e-30) if e.size else 1.0
        worst = max(worst, float(np.max(np.abs(a - e))) / scale if e.size else 0.0)
    return worst


def measure(workload: Workload, repeats: int, peaks: dict[str, float]) -> dict[str, Any]:
    fn, args = workload.make()
    plain = tf.function(fn)
    xla = tf.function(fn, jit_compile=True)
    forget_conversions()
    first_xla = time_first_call(lambda: xla(*args))
    forget_conversions()
    lite, mode, first_lite = _lite(fn, args)
    # A tiered compile's first call ran quick-tier code; steady state is the O3 code's.
    tl.wait_for_compiles()
    error = None
    if workload.kind != "train":  # a training step changes its variables at every call
        error = _relative_error(lite(*args), plain(*args))
    coverage = _coverage(lite, args)
    variants = {"tf_function": lambda: plain(*args), "xla": lambda: xla(*args),
                "lite": lambda: lite(*args)}
    probe = BandwidthProbe() if workload.kind == "memory" else None
    if probe is not None:
        variants["bandwidth_probe"] = probe
    try:
        times = compare(variants, repeats=repeats)
    finally:
        if probe is not None:
            probe.close()
    probe_seconds = times.pop("bandwidth_probe", None)
    result: dict[str, Any] = {
        "name": workload.name, "kind": workload.kind, "description": workload.description,
        "lite_mode": mode, "max_relative_error": error,
        "ms": {k: v * 1e3 for k, v in times.items()},
        "speedup_vs_xla": times["xla"] / times["lite"],
        "speedup_vs_tf_function": times["tf_function"] / times["lite"],
        "first_call_ms": {"xla": first_xla * 1e3, "lite": first_lite * 1e3},
        "coverage": coverage, "xla_temp_bytes": None,
        "gbps": None, "gflops": None, "fraction_of_peak": None,
        "probe_gbps": None, "fraction_of_run_peak": None,
    }
    if workload.bytes:
        result["gbps"] = {k: workload.bytes / v / 1e9 for k, v in times.items()}
        result["fraction_of_run_peak"] = result["gbps"]["lite"] / peaks["bandwidth_gbps"]
        result["fraction_of_peak"] = result["fraction_of_run_peak"]
        if probe is not None and probe_seconds:
            # Memory-bound: against the copy timed in the same bursts (same load).
            result["probe_gbps"] = probe.moved / probe_seconds / 1e9
            result["fraction_of_peak"] = result["gbps"]["lite"] / result["probe_gbps"]
    elif workload.flops:
        result["gflops"] = {k: workload.flops / v / 1e9 for k, v in times.items()}
        result["fraction_of_peak"] = result["gflops"]["lite"] / peaks["matmul_gflops"]
    return result


# -- warm start, in subprocesses -------------------------------------------------------------

def warm_up(xla: bool = True) -> None:
    """Pay each compiler's one-time costs with an unrelated trivial function (TF's XLA
    runtime, tfxla-lite's launch op library, LLVM and the thread pools), so that a
    workload's first call measures its own trace and compile only."""
    x = tf.ones((3,))
    if xla:
        tf.function(lambda x: x * 2.0 + 1.0, jit_compile=True)(x)
    tl.function(lambda x: x * 2.0 + 1.0, jit_compile=True)(x)
    tl.wait_for_compiles()  # its O3 compile (TFXLA_LITE_TIERED) is no first call's load


def first_calls(names: list[str], quick: bool) -> dict[str, float]:
    """Seconds of tfxla-lite's first call of each workload, after a generic warm-up
    (TF, the launch op and LLVM loaded by an unrelated function)."""
    warm_up(xla=False)
    seconds = {}
    for workload in by_name(names, quick):
        fn, args = workload.make()
        seconds[workload.name] = _lite(fn, args)[2]
    return seconds


def warm_start(names: list[str], quick: bool) -> dict[str, dict[str, float]]:
    """First-call ms in a fresh process with an empty kernel cache, then with the cache
    the first process left."""
    env = {**os.environ, "TFXLA_LITE_CACHE_DIR": str(private_cache())}
    env.pop("TFXLA_LITE_CACHE", None)
    command = [sys.executable, "-m", "benchmarks.run", "--first-calls", *names]
    command += ["--quick"] if quick else []
    runs = []
    for _ in range(2):
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT,
                                timeout=1800)
        if result.returncode != 0:
            raise RuntimeError(f"first-call subprocess failed:\n{result.stderr[-3000:]}")
        runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    return {name: {"cold_ms": runs[0][name] * 1e3, "warm_ms": runs[1][name] * 1e3}
            for name in names}


# -- the run -------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    import llvmlite.binding as llvm

    return {"cpu": llvm.get_host_cpu_name(), "cores": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version(),
            "tensorflow": tf.__version__, "tfxla_lite": tl.__version__,
            "llvm": ".".join(map(str, llvm.llvm_version_info))}


def run(quick: bool, names: list[str] | None, out: Path, write_docs: bool) -> dict[str, Any]:
    os.environ["TFXLA_LITE_CACHE_DIR"] = str(private_cache())  # cold first calls
    selected = by_name(names, quick) if names else workloads(quick)
    repeats = 3 if quick else 15
    load_before = os.getloadavg()
    started = time.time()
    print(f"machine: {machine()}\nload average: {load_before}", flush=True)
    bandwidth = bandwidth_peak(1 << (22 if quick else 25), repeats)
    peaks = {"bandwidth_gbps": bandwidth["peak"], "bandwidth": bandwidth,
             "matmul_n": 256 if quick else 1024,
             "matmul_gflops": matmul_peak(256 if quick else 1024, repeats)}
    print(f"peaks: {peaks['bandwidth_gbps']:.1f} GB/s, {peaks['matmul_gflops']:.0f} GFLOP/s",
          flush=True)
    warm_up()  # the first workload's first call pays no compiler's one-time costs
    results = []
    for workload in selected:
        result = measure(workload, repeats, peaks)
        results.append(result)
        print(report.line(result), flush=True)
    starts = warm_start([w.name for w in selected][:1 if quick else None], quick)
    for result in results:
        result["start_ms"] = starts.get(result["name"])
    document = {
        "mode": "quick" if quick else "full", "machine": machine(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "seconds": time.time() - started, "peaks": peaks, "workloads": results,
    }
    document["goals"] = report.goals(document)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(document, indent=1) + "\n")
    table = report.markdown(document)
    print("\n" + table)
    if write_docs:
        report.write_docs(document, ROOT / "docs" / "benchmarks.md")
        report.plot(document, ROOT / "docs" / "benchmarks.png")
    else:
        report.plot(document, out / "benchmarks.png")
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", help="names (default: all)")
    parser.add_argument("--quick", action="store_true", help="test sizes, 3 repeats")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results",
                        help="folder of latest.json (default benchmarks/results)")
    parser.add_argument("--no-docs", action="store_true",
                        help="do not rewrite docs/benchmarks.md and docs/benchmarks.png")
    parser.add_argument("--first-calls", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_calls:
        print(json.dumps(first_calls(args.workloads, args.quick)))
        return 0
    document = run(args.quick, args.workloads or None, args.out,
                   write_docs=not (args.quick or args.no_docs or args.workloads))
    missed = [g for g in document["goals"] if not g["met"]]
    print(f"\ngoals met: {len(document['goals']) - len(missed)} of {len(document['goals'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
