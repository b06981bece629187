"""First-call time in fresh processes: `python -m benchmarks.startup [--repeats N] [NAME ...]`.

Issue #5's start-up goals, each measured in its own fresh subprocess (TF imported and a
trivial function of the same kind compiled first, so that importing TF, building or
loading the launch op and initializing LLVM or XLA are not counted):

- **tf.function**: TF's first call of plain `tf.function(fn)` (trace + graph
  optimization + run), which every variant pays in some form: the baseline of the
  overhead view below;
- **XLA**: TF's first call of `tf.function(fn, jit_compile=True)` (trace + XLA compile +
  run; XLA keeps no compile cache across processes);
- **cold**: tfxla-lite's first call with an empty cache folder (`TFXLA_LITE_CACHE_DIR`,
  a fresh one per repeat that shares only the built launch op);
- **warm**: the same again in a new process, with the cache the cold process left
  (optimized modules and machine code, `codegen/cache.py`).

Goals: cold <= XLA's first call; warm <= 10% of cold. Medians over `--repeats`, with
tf.function, XLA, cold and warm taken in turn for each workload so that all see the same load; the
machine is shared, so only the ratios within one run mean anything. The tfxla-lite
processes also report how many pass pipelines and LLVM compilations they ran and
whether the whole-rewrite cache hit (`tfxla_lite/rewrite_cache.py`).

`--overlap-ab` measures only cold first calls, with LLVM in the background
(`TFXLA_LITE_OVERLAP_LLVM=1`) and on the calling thread (`=0`, the default), the two
alternating in order from repeat to repeat, each in a fresh process with an empty cache.

An added view, not a goal of the issue: tfxla-lite's *overhead* over plain tf.function's
first call (cold - tf.function, warm - tf.function), i.e. what tfxla-lite adds on top
of the trace and first run that TF pays anyway.
Default workloads: the seed examples and the Keras MLP training step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/startup.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKLOADS = ["reduce_sum_fma", "mlp", "gelu", "softmax", "self_attention",
                     "mlp_train_b128"]
QUICK_WORKLOADS = ["reduce_sum_fma", "mlp_train_b8"]  # test sizes (`--quick`)
WARM_GOAL = 0.10  # warm start at most this fraction of the cold first call


def child(variant: str, name: str, quick: bool) -> dict[str, Any]:
    """In the subprocess: warm up, then time the first call of workload `name`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import tfxla_lite as tl
    from benchmarks.workloads import by_name
    from tfxla_lite.codegen import cache

    (workload,) = by_name([name], quick)
    if variant in ("xla", "tf"):
        tf.function(lambda x: x * 2.0 + 1.0, jit_compile=variant == "xla")(tf.ones((3,)))
    else:
        tl.function(lambda x: x * 2.0 + 1.0, jit_compile=True)(tf.ones((3,)))
    fn, args = workload.make()
    before = cache.stats()
    started = time.perf_counter()
    if variant in ("xla", "tf"):
        tf.function(fn, jit_compile=variant == "xla")(*args)
    else:
        try:
            tl.function(fn, jit_compile=True)(*args)
        except tl.CompilationError:  # as benchmarks/run.py: auto-clustering then
            tl.function(fn, min_cluster_size=1)(*args)
    seconds = time.perf_counter() - started
    after = cache.stats()
    from tfxla_lite import rewrite_cache

    # The source hashes this process's caches were keyed with (computed once, at its
    # first compile): a tree edited between a cold and a warm process misses, rightly.
    sources = {k: v for k, v in rewrite_cache.environment().items() if k.endswith("_sources")}
    return {"seconds": seconds, "sources": sources,
            "pipeline_runs": after.pipeline_runs - before.pipeline_runs,
            "llvm_compilations": after.llvm_compilations - before.llvm_compilations,
            "rewrite_hits": after.rewrite_hits - before.rewrite_hits}


def _fresh_cache() -> Path:
    """An empty cache root sharing the built launch op (not part of a first call)."""
    from tfxla_lite.cache_dir import cache_root

    folder = Path(tempfile.mkdtemp(prefix="tfxla_lite_startup_"))
    ops = cache_root() / "ops"
    if ops.exists():
        (folder / "ops").symlink_to(ops, target_is_directory=True)
    return folder


def _spawn(variant: str, name: str, quick: bool, cache: Path | None) -> dict[str, Any]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TFXLA_LITE_CACHE", None)
    if cache is not None:
        env["TFXLA_LITE_CACHE_DIR"] = str(cache)
    command = [sys.executable, "-m", "benchmarks.startup", "--child", variant, name]
    command += ["--quick"] if quick else []
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"{variant} {name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(names: list[str], repeats: int, quick: bool) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {"tf": [], "xla": [], "cold": [], "warm": []} for name in names}
    for _ in range(repeats):
        for name in names:
            folder = _fresh_cache()
            runs[name]["tf"].append(_spawn("tf", name, quick, None))
            runs[name]["xla"].append(_spawn("xla", name, quick, None))
            runs[name]["cold"].append(_spawn("lite", name, quick, folder))
            runs[name]["warm"].append(_spawn("lite", name, quick, folder))
    results = {}
    for name, variants in runs.items():
        row: dict[str, Any] = {f"{v}_ms": statistics.median(r["seconds"] for r in rs) * 1e3
                               for v, rs in variants.items()}
        for v in ("cold", "warm"):  # per repeat: a warm miss shows (sources edited between)
            row[f"{v}_pipelines"] = [r["pipeline_runs"] for r in variants[v]]
            row[f"{v}_llvm"] = [r["llvm_compilations"] for r in variants[v]]
            row[f"{v}_rewrite_hits"] = [r["rewrite_hits"] for r in variants[v]]
        row["sources_edited"] = [
            sorted(k for k, v in c["sources"].items() if w["sources"].get(k) != v)
            for c, w in zip(variants["cold"], variants["warm"])]
        row["cold_vs_xla"] = row["cold_ms"] / row["xla_ms"]
        row["warm_vs_cold"] = row["warm_ms"] / row["cold_ms"]
        row["warm_vs_xla"] = row["warm_ms"] / row["xla_ms"]
        row["cold_overhead_ms"] = row["cold_ms"] - row["tf_ms"]
        row["warm_overhead_ms"] = row["warm_ms"] - row["tf_ms"]
        results[name] = row
    return results


def compare_overlap(names: list[str], repeats: int, quick: bool) -> str:
    """Cold first calls with LLVM on the calling thread ("0") and in the background ("1"),
    interleaved (the order alternates per repeat); medians, bests and pairs won."""
    runs: dict[str, dict[str, list[float]]] = {name: {"0": [], "1": []} for name in names}
    loads = []
    saved = os.environ.get("TFXLA_LITE_OVERLAP_LLVM")
    try:
        for repeat in range(repeats):
            for name in names:
                for variant in ("0", "1") if repeat % 2 == 0 else ("1", "0"):
                    os.environ["TFXLA_LITE_OVERLAP_LLVM"] = variant
                    result = _spawn("lite", name, quick, _fresh_cache())
                    runs[name][variant].append(result["seconds"] * 1e3)
                loads.append(os.getloadavg()[0])
    finally:
        if saved is None:
            os.environ.pop("TFXLA_LITE_OVERLAP_LLVM", None)
        else:
            os.environ["TFXLA_LITE_OVERLAP_LLVM"] = saved
    lines = [f"Cold first calls, LLVM on the calling thread (off) or in the background (on), "
             f"{repeats} interleaved repeats; load average {min(loads):.2f}-{max(loads):.2f}.",
             "", "| workload | off median ms | on median ms | off best | on best | on faster |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in runs.items():
        won = sum(on < off for off, on in zip(r["0"], r["1"]))
        lines.append(f"| {name} | {statistics.median(r['0']):.0f} | "
                     f"{statistics.median(r['1']):.0f} | {min(r['0']):.0f} | {min(r['1']):.0f} "
                     f"| {won} of {repeats} |")
    return "\n".join(lines)


def report(results: dict[str, dict[str, Any]], repeats: int) -> str:
    lines = [f"First calls in fresh processes, median of {repeats}; load average "
             f"{os.getloadavg()[0]:.2f} at the end.", "",
             "| workload | tf.function ms | XLA ms | cold ms | warm ms | cold / XLA "
             "| warm / cold | warm / XLA | warm pipelines, LLVM runs, rewrite hits |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['tf_ms']:.0f} | {r['xla_ms']:.0f} | {r['cold_ms']:.0f} "
                     f"| {r['warm_ms']:.0f} | {r['cold_vs_xla']:.2f} | {r['warm_vs_cold']:.0%} "
                     f"| {r['warm_vs_xla']:.0%} | {_counts(r['warm_pipelines'])}, "
                     f"{_counts(r['warm_llvm'])}, {_counts(r['warm_rewrite_hits'])} |")
    for name, r in results.items():  # not a cache bug: the caches key on the sources
        for repeat, edited in enumerate(r["sources_edited"], 1):
            if edited:
                lines.append(f"\n{name}, repeat {repeat}: sources edited between the cold and "
                             f"the warm process ({', '.join(edited)}): its warm start "
                             "compiles again")
    cold = [r["cold_vs_xla"] for r in results.values()]
    warm = [r["warm_vs_cold"] for r in results.values()]
    slower = [n for n, r in results.items() if r["cold_vs_xla"] > 1.0]
    over = [n for n, r in results.items() if r["warm_vs_cold"] > WARM_GOAL]
    lines += ["", "| goal | met | measured |", "| --- | --- | --- |",
              f"| first call no slower than TF's XLA first call | "
              f"{'yes' if not slower else '**no**'} | cold/XLA geometric mean "
              f"{statistics.geometric_mean(cold):.2f}; slower on {len(slower)} of "
              f"{len(cold)}{': ' + ', '.join(slower) if slower else ''} |",
              f"| warm start <= {WARM_GOAL:.0%} of the cold first call | "
              f"{'yes' if not over else '**no**'} | warm/cold geometric mean "
              f"{statistics.geometric_mean(warm):.0%}, worst {max(warm):.0%} |"]
    # Not a goal: what tfxla-lite adds to the first call that TF pays anyway (its trace,
    # graph optimization and first run). Negative: faster than tf.function's first call.
    lines += ["", "Added view (not an issue goal): tfxla-lite's overhead over plain "
              "tf.function's first call, in ms (variant - tf.function).", "",
              "| workload | cold overhead ms | warm overhead ms | warm overhead / cold overhead |",
              "| --- | ---: | ---: | ---: |"]
    for name, r in results.items():
        ratio = (f"{r['warm_overhead_ms'] / r['cold_overhead_ms']:.0%}"
                 if r["cold_overhead_ms"] > 0 else "n/a")
        lines.append(f"| {name} | {r['cold_overhead_ms']:+.0f} | {r['warm_overhead_ms']:+.0f} "
                     f"| {ratio} |")
    return "\n".join(lines)


def _counts(values: list[int]) -> str:
    return "/".join(map(str, values))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="workloads (default: seeds and the MLP step)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="test sizes")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--overlap-ab", action="store_true",
                        help="cold first calls only, LLVM in the background off and on")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "NAME"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.quick)))
        return
    names = args.names or (QUICK_WORKLOADS if args.quick else DEFAULT_WORKLOADS)
    if args.overlap_ab:
        print(compare_overlap(names, args.repeats, args.quick))
        return
    results = measure(names, args.repeats, args.quick)
    print(report(results, args.repeats))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
