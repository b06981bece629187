"""The demo, the project's main job: compile the seed models and show what happened.

For each seed example: the clusters tfxla-lite formed, the optimized HLO with its
fusions, the buffer reuse (temp bytes with and without it), the largest error
against TensorFlow, and the time per call of tf.function, TF's own XLA
(`tf.function(jit_compile=True)`) and tfxla-lite, measured side by side in this
run. `python -m tfxla_lite.demo --help` lists the options.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from tfxla_lite.examples import EXAMPLES, Example  # noqa: E402
from tfxla_lite.timing import compare, time_first_call  # noqa: E402


def _rule(title: str) -> str:
    return f"\n{'=' * 100}\n{title}\n{'=' * 100}"


def _max_relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(expected))), 1e-30) if expected.size else 1.0
    return float(np.max(np.abs(actual - expected))) / scale if expected.size else 0.0


def run_example(example: Example, show_hlo: bool, repeats: int) -> dict[str, float]:
    print(_rule(f"{example.name}: {example.description}"))
    inputs = [tf.constant(a) for a in example.inputs()]
    plain = tf.function(example.fn)
    xla = tf.function(example.fn, jit_compile=True)
    lite = tl.function(example.fn, jit_compile=True)

    first = {"TF XLA": time_first_call(lambda: xla(*inputs)),
             "tfxla-lite": time_first_call(lambda: lite(*inputs))}
    expected = plain(*inputs).numpy()
    error = _max_relative_error(lite(*inputs).numpy(), expected)

    print(tl.explain(lite, *inputs))
    hlo = lite.experimental_get_compiler_ir(*inputs)(stage="optimized_hlo")
    fusions = sum(1 for line in hlo.splitlines() if " fusion(" in line)
    if show_hlo:
        print("\n-- optimized HLO --")
        print(hlo)
    report = lite.explain(*inputs)
    before = sum(c.temp_bytes_without_reuse for c in report.compiled_clusters)
    after = sum(c.temp_bytes for c in report.compiled_clusters)
    print(f"\nfusion instructions in the optimized HLO: {fusions}")
    print(f"temp buffers: {before:,} bytes without reuse -> {after:,} bytes with reuse")
    print(f"max relative error vs tf.function: {error:.2e}")
    print(f"first call (trace + compile): TF XLA {first['TF XLA'] * 1e3:.0f} ms, "
          f"tfxla-lite {first['tfxla-lite'] * 1e3:.0f} ms")

    times = compare({"tf.function": lambda: plain(*inputs), "TF XLA": lambda: xla(*inputs),
                     "tfxla-lite": lambda: lite(*inputs)}, repeats=repeats)
    base = times["tf.function"]
    print("time per call (median of interleaved repeats):")
    for name, seconds in times.items():
        extra = ""
        if example.flops:
            extra = f", {example.flops / seconds / 1e9:6.1f} GFLOP/s"
        elif example.bytes:
            extra = f", {example.bytes / seconds / 1e9:6.1f} GB/s"
        print(f"  {name:<12} {seconds * 1e3:9.3f} ms  ({base / seconds:4.2f}x tf.function"
              f"{extra})")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("examples", nargs="*", metavar="EXAMPLE",
                        help=f"which seed examples (default: all of {', '.join(EXAMPLES)})")
    parser.add_argument("--no-hlo", action="store_true", help="do not print optimized HLO")
    parser.add_argument("--repeats", type=int, default=11, help="timing repeats")
    args = parser.parse_args(argv)
    names = args.examples or list(EXAMPLES)
    unknown = [n for n in names if n not in EXAMPLES]
    if unknown:
        parser.error(f"unknown example(s) {', '.join(unknown)}; choose from {', '.join(EXAMPLES)}")
    print(f"tfxla-lite {tl.__version__} on TensorFlow {tf.__version__}, "
          f"{os.cpu_count()} CPU cores")
    summary = {}
    for name in names:
        summary[name] = run_example(EXAMPLES[name], not args.no_hlo, args.repeats)
    print(_rule("summary: ms per call, and speed-up of tfxla-lite"))
    print(f"{'example':<16}{'tf.function':>12}{'TF XLA':>10}{'tfxla-lite':>12}"
          f"{'vs tf.fn':>10}{'vs XLA':>8}")
    for name, t in summary.items():
        print(f"{name:<16}{t['tf.function'] * 1e3:>12.3f}{t['TF XLA'] * 1e3:>10.3f}"
              f"{t['tfxla-lite'] * 1e3:>12.3f}{t['tf.function'] / t['tfxla-lite']:>9.2f}x"
              f"{t['TF XLA'] / t['tfxla-lite']:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
