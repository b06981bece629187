"""The benchmark suite's quick mode runs end to end and writes complete JSON.

No timing is asserted: CI machines are noisy; only the shape of the results is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD_FIELDS = {"name", "kind", "description", "lite_mode", "max_relative_error", "ms",
                   "speedup_vs_xla", "speedup_vs_tf_function", "first_call_ms", "coverage",
                   "xla_temp_bytes", "gbps", "gflops", "fraction_of_peak", "start_ms"}
COVERAGE_FIELDS = {"compiled_ops", "total_ops", "left_in_tf", "clusters", "kernels",
                   "temp_bytes", "temp_bytes_without_reuse"}


def test_quick_benchmark_writes_every_field(tmp_path: Path) -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out",
                             str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=170)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    document = json.loads((tmp_path / "latest.json").read_text())
    assert document["mode"] == "quick"
    assert {"machine", "load_average", "peaks", "workloads", "goals", "seconds"} <= set(document)
    assert document["peaks"]["bandwidth_gbps"] > 0 and document["peaks"]["matmul_gflops"] > 0
    kinds = set()
    for workload in document["workloads"]:
        assert WORKLOAD_FIELDS <= set(workload), workload["name"]
        assert COVERAGE_FIELDS <= set(workload["coverage"])
        assert set(workload["ms"]) == {"tf_function", "xla", "lite"}
        assert all(v > 0 for v in workload["ms"].values())
        assert set(workload["first_call_ms"]) == {"xla", "lite"}
        kinds.add(workload["kind"])
    assert {"train", "latency"} <= kinds
    assert any(w["start_ms"] for w in document["workloads"])  # warm start measured
    assert len(document["goals"]) == 5 and all("met" in g for g in document["goals"])
    assert "| workload |" in result.stdout and "goals met:" in result.stdout


def _converted_by_autograph(fn) -> int:
    """How many times AutoGraph converts `fn`'s source for a fresh tf.function."""
    import tensorflow as tf
    from tensorflow.python.autograph.impl import api as autograph

    converted = []
    original = autograph._TRANSPILER.transform_function

    def counting(function, context):
        if function is fn:
            converted.append(autograph._TRANSPILER._cache.has(function, context.options))
        return original(function, context)

    autograph._TRANSPILER.transform_function = counting
    try:
        tf.function(fn)(tf.ones((2,)))
    finally:
        autograph._TRANSPILER.transform_function = original
    return sum(1 for cached in converted if not cached)


def _first_call_fairness_probe(x):
    return x * 3.0 - 1.0


def test_each_first_call_converts_the_source_itself() -> None:
    """The benchmark forgets TF's in-process conversions before each first call, so the
    compiler timed second does not get the first one's AutoGraph conversion for free."""
    from benchmarks.run import forget_conversions

    assert _converted_by_autograph(_first_call_fairness_probe) == 1
    assert _converted_by_autograph(_first_call_fairness_probe) == 0, "TF's cache hit"
    forget_conversions()
    assert _converted_by_autograph(_first_call_fairness_probe) == 1
