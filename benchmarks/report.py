"""What the benchmark run prints and writes: one line per workload, the goals, the
markdown table (docs/benchmarks.md, between its results markers) and the plot."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

START, END = "<!-- results:start -->", "<!-- results:end -->"


def geomean(values: list[float]) -> float:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def _rate(result: dict[str, Any]) -> str:
    if result["gbps"]:
        return f"{result['gbps']['lite']:.1f} GB/s"
    if result["gflops"]:
        return f"{result['gflops']['lite']:.1f} GFLOP/s"
    return "-"


def line(result: dict[str, Any]) -> str:
    ms = result["ms"]
    return (f"{result['name']:<24} tf.function {ms['tf_function']:8.3f} ms  XLA "
            f"{ms['xla']:8.3f} ms  tfxla-lite {ms['lite']:8.3f} ms  "
            f"x{result['speedup_vs_xla']:.2f} vs XLA  x{result['speedup_vs_tf_function']:.2f} "
            f"vs tf.function  {_rate(result)}  first call XLA "
            f"{result['first_call_ms']['xla']:.0f} ms, "
            f"lite {result['first_call_ms']['lite']:.0f} ms")


def goals(document: dict[str, Any]) -> list[dict[str, Any]]:
    results = document["workloads"]
    vs_xla = geomean([r["speedup_vs_xla"] for r in results])
    vs_tf = geomean([r["speedup_vs_tf_function"] for r in results])
    memory = [r for r in results if r["kind"] == "memory" and r["fraction_of_peak"]]
    below = [f"{r['name']} {r['fraction_of_peak']:.0%}" for r in memory
             if r["fraction_of_peak"] < 0.8]
    first = [r["first_call_ms"]["lite"] / r["first_call_ms"]["xla"] for r in results]
    slower = [r["name"] for r, ratio in zip(results, first) if ratio > 1.0]
    starts = [r for r in results if r.get("start_ms")]
    warm = [r["start_ms"]["warm_ms"] / r["start_ms"]["cold_ms"] for r in starts]
    return [
        {"goal": "geometric-mean speedup over TF's XLA >= 1.25x", "value": vs_xla,
         "met": vs_xla >= 1.25, "detail": f"{vs_xla:.2f}x over {len(results)} workloads"},
        {"goal": "geometric-mean speedup over tf.function >= 1.5x", "value": vs_tf,
         "met": vs_tf >= 1.5, "detail": f"{vs_tf:.2f}x over {len(results)} workloads"},
        {"goal": "every memory-bound workload >= 80% of measured bandwidth",
         "value": min((r["fraction_of_peak"] for r in memory), default=None),
         "met": bool(memory) and not below,
         "detail": ("below: " + ", ".join(below)) if below else f"all {len(memory)} at >= 80%"},
        {"goal": "first call no slower than TF's XLA first call", "value": geomean(first),
         "met": not slower,
         "detail": f"lite/XLA geometric mean {geomean(first):.2f}; slower on "
                   f"{len(slower)} of {len(results)}"},
        {"goal": "warm start from the disk cache <= 10% of the cold first call",
         "value": max(warm, default=None), "met": bool(warm) and max(warm) <= 0.10,
         "detail": (f"warm/cold geometric mean {geomean(warm):.0%}, worst {max(warm):.0%}"
                    if warm else "not measured")},
    ]


def _probes(document: dict[str, Any]) -> str:
    rates = [r["probe_gbps"] for r in document["workloads"] if r.get("probe_gbps")]
    return f" ({min(rates):.1f} to {max(rates):.1f} GB/s)" if rates else ""


def markdown(document: dict[str, Any]) -> str:
    peaks, m = document["peaks"], document["machine"]
    load = document["load_average"]
    rows = [
        f"Machine: {m['cpu']}, {m['cores']} cores, TensorFlow {m['tensorflow']}, LLVM "
        f"{m['llvm']}; load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} "
        f"after ({document['mode']} run, {document['seconds']:.0f} s). Peaks measured in "
        f"the same run: {peaks['bandwidth_gbps']:.1f} GB/s (NumPy copy/add), "
        f"{peaks['matmul_gflops']:.0f} GFLOP/s (tf.matmul {peaks['matmul_n']}³); "
        f"memory-bound workloads against a NumPy copy (128 MiB arrays) timed in their own "
        f"bursts{_probes(document)}.",
        "",
        "| workload | tf.function ms | XLA ms | tfxla-lite ms | vs XLA | vs tf.function "
        "| tfxla-lite rate | % of peak | first call XLA / lite ms | start cold / warm ms "
        "| temp KiB | compiled ops |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in document["workloads"]:
        ms, first, start, cov = r["ms"], r["first_call_ms"], r.get("start_ms"), r["coverage"]
        peak = f"{r['fraction_of_peak']:.0%}" if r["fraction_of_peak"] else "-"
        starts = f"{start['cold_ms']:.0f} / {start['warm_ms']:.0f}" if start else "-"
        mode = "" if r["lite_mode"] == "jit_compile=True" else " (auto)"
        rows.append(
            f"| {r['name']} | {ms['tf_function']:.3f} | {ms['xla']:.3f} | {ms['lite']:.3f} "
            f"| {r['speedup_vs_xla']:.2f}x | {r['speedup_vs_tf_function']:.2f}x "
            f"| {_rate(r)} | {peak} | {first['xla']:.0f} / {first['lite']:.0f} | {starts} "
            f"| {cov['temp_bytes'] / 1024:.0f} | {cov['compiled_ops']}/{cov['total_ops']}{mode} |")
    rows += ["", "| goal | met | measured |", "| --- | --- | --- |"]
    for goal in document["goals"]:
        rows.append(f"| {goal['goal']} | {'yes' if goal['met'] else '**no**'} "
                    f"| {goal['detail']} |")
    return "\n".join(rows)


def write_docs(document: dict[str, Any], path: Path) -> None:
    """Replace the results section of `path` (between its markers), keeping the rest."""
    section = f"{START}\n{markdown(document)}\n{END}"
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        text += f"\n{START}\n{END}\n"
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + section + tail)


def plot(document: dict[str, Any], path: Path) -> bool:
    """Bar chart of tfxla-lite's speed-ups; False when matplotlib is not installed
    (`pip install -e .[bench]`)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = document["workloads"]
    names = [r["name"] for r in results]
    positions = range(len(names))
    figure, axes = plt.subplots(figsize=(max(8, 0.55 * len(names) + 2), 4.5))
    width = 0.4
    axes.bar([p - width / 2 for p in positions], [r["speedup_vs_tf_function"] for r in results],
             width, label="tfxla-lite vs tf.function", color="#4c72b0")
    axes.bar([p + width / 2 for p in positions], [r["speedup_vs_xla"] for r in results],
             width, label="tfxla-lite vs TF's XLA", color="#dd8452")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_yscale("log")
    axes.set_ylabel("speed-up (x, log scale)")
    axes.set_xticks(list(positions), names, rotation=45, ha="right", fontsize=8)
    load = document["load_average"]["before"][0]
    axes.set_title(f"tfxla-lite speed-ups, {document['machine']['cores']} cores "
                   f"({document['machine']['cpu']}), load {load:.1f}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True
