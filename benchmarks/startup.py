"""First-call time in fresh processes: `python -m benchmarks.startup [--repeats N] [NAME ...]`.

Per workload and in turn, each in a fresh subprocess after a trivial warm-up of its own
kind: plain tf.function, TF's XLA, tfxla-lite with an empty cache ("cold") and with the
cache the cold process left ("warm"). Goals: cold <= XLA's first call; warm <= 10% of
cold. Medians over `--repeats`; only ratios within one run mean anything.
`--overlap-ab` and `--tiered-ab` alternate cold children with background LLVM or tiered
compiles off and on. docs/benchmarks.md, "First call and warm start".
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
    from benchmarks.workloads import by_name, measured_options
    from tfxla_lite.codegen import cache

    (workload,) = by_name([name], quick)
    if variant in ("xla", "tf"):
        tf.function(lambda x: x * 2.0 + 1.0, jit_compile=variant == "xla")(tf.ones((3,)))
    else:
        tl.function(lambda x: x * 2.0 + 1.0, jit_compile=True)(tf.ones((3,)))
    fn, args = workload.make()
    before = cache.stats()
    started, cpu_started = time.perf_counter(), time.thread_time()
    if variant in ("xla", "tf"):
        tf.function(fn, jit_compile=variant == "xla")(*args)
    else:
        try:
            tl.function(fn, jit_compile=True, options=measured_options())(*args)
        except tl.CompilationError:  # as benchmarks/run.py: auto-clustering then
            tl.function(fn, min_cluster_size=1)(*args)
    seconds = time.perf_counter() - started
    cpu_seconds = time.thread_time() - cpu_started
    after = cache.stats()
    from tfxla_lite import rewrite_cache

    # The source hashes this process's caches were keyed with (computed once, at its
    # first compile): a tree edited between a cold and a warm process misses, rightly.
    sources = {k: v for k, v in rewrite_cache.environment().items() if k.endswith("_sources")}
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "sources": sources,
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
    """Run one child; its JSON, with `exit_seconds` (from its last statement to its
    end)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TFXLA_LITE_CACHE", None)
    if cache is not None:
        env["TFXLA_LITE_CACHE_DIR"] = str(cache)
    command = [sys.executable, "-m", "benchmarks.startup", "--child", variant, name]
    command += ["--quick"] if quick else []
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=900)
    exited_at = time.time()
    if result.returncode != 0:
        raise RuntimeError(f"{variant} {name} failed:\n{result.stderr[-3000:]}")
    found = json.loads(result.stdout.strip().splitlines()[-1])
    return {**found, "exit_seconds": exited_at - found.get("ended_at", exited_at)}


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
    return compare_switch("TFXLA_LITE_OVERLAP_LLVM", "LLVM on the calling thread (off) or "
                          "in the background (on)", names, repeats, quick)


def compare_tiered(names: list[str], repeats: int, quick: bool) -> str:
    """Cold first calls with tiered compiles off ("0") and on ("1"), interleaved, with
    XLA's first call in the same rounds; also each child's whole run (exit included)."""
    return compare_switch("TFXLA_LITE_TIERED", "tiered compiles off or on (the first call "
                          "on quick-tier code)", names, repeats, quick, with_xla=True)


def compare_switch(variable: str, what: str, names: list[str], repeats: int, quick: bool,
                   with_xla: bool = False) -> str:
    """Cold first calls with the environment switch `variable` at "0" and "1", each in a
    fresh process with an empty cache, the order alternating per repeat."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {"0": [], "1": [], "xla": []} for name in names}
    loads = [os.getloadavg()[0]]
    saved = os.environ.get(variable)
    try:
        for repeat in range(repeats):
            for name in names:
                if with_xla:
                    runs[name]["xla"].append(_spawn("xla", name, quick, None))
                for variant in ("0", "1") if repeat % 2 == 0 else ("1", "0"):
                    os.environ[variable] = variant
                    runs[name][variant].append(_spawn("lite", name, quick, _fresh_cache()))
                loads.append(os.getloadavg()[0])
    finally:
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved

    def median(results: list[dict[str, Any]], field: str = "seconds") -> float:
        return statistics.median(r[field] for r in results) * 1e3

    lines = [f"Cold first calls, {what}, {repeats} interleaved repeats; load average "
             f"{min(loads):.2f}-{max(loads):.2f}.", "",
             "| workload | off median ms | on median ms | off best | on best | on faster "
             + ("| XLA ms | off / XLA | on / XLA | off exit ms | on exit ms | off thread CPU ms "
                "| on thread CPU ms " if with_xla else "")
             + "|", "| --- " + "| ---: " * (5 + (7 if with_xla else 0)) + "|"]
    ratios: dict[str, list[float]] = {"0": [], "1": []}
    for name, r in runs.items():
        off, on = ([x["seconds"] * 1e3 for x in r[v]] for v in ("0", "1"))
        won = sum(b < a for a, b in zip(off, on))
        line = (f"| {name} | {statistics.median(off):.0f} | {statistics.median(on):.0f} | "
                f"{min(off):.0f} | {min(on):.0f} | {won} of {repeats} ")
        if with_xla:
            xla = median(r["xla"])
            for v in ("0", "1"):
                ratios[v].append(median(r[v]) / xla)
            line += (f"| {xla:.0f} | {ratios['0'][-1]:.2f} | {ratios['1'][-1]:.2f} | "
                     f"{median(r['0'], 'exit_seconds'):.0f} | "
                     f"{median(r['1'], 'exit_seconds'):.0f} | "
                     f"{median(r['0'], 'cpu_seconds'):.0f} | {median(r['1'], 'cpu_seconds'):.0f} ")
        lines.append(line + "|")
    if with_xla:
        lines += ["", "(exit: from the child's last statement to its end, the interpreter's exit "
                  "with any background compile it waits for; thread CPU: the calling thread's "
                  "CPU time during the first call, which the load moves least)"]
        lines += ["", f"cold/XLA geometric mean: off {statistics.geometric_mean(ratios['0']):.2f}, "
                  f"on {statistics.geometric_mean(ratios['1']):.2f}"]
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
    parser.add_argument("--tiered-ab", action="store_true",
                        help="cold first calls only, tiered compiles off and on, beside XLA's")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "NAME"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        # `ended_at`: what is left after it (interpreter exit, with any background
        # compile it waits for) is the parent's `exit_seconds`.
        print(json.dumps({**child(args.child[0], args.child[1], args.quick),
                          "ended_at": time.time()}), flush=True)
        return
    names = args.names or (QUICK_WORKLOADS if args.quick else DEFAULT_WORKLOADS)
    if args.overlap_ab:
        print(compare_overlap(names, args.repeats, args.quick))
        return
    if args.tiered_ab:
        print(compare_tiered(names, args.repeats, args.quick))
        return
    results = measure(names, args.repeats, args.quick)
    print(report(results, args.repeats))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
