"""Warm starts through the API: a function compiled in an earlier process (or by another
`tl.function` in this one) runs no HLO pass and no LLVM, and computes the same bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.codegen import cache, module_cache
from tfxla_lite.codegen.cpu.kernel_cache import without_metadata
from tfxla_lite.examples import EXAMPLES
from tfxla_lite.options import Options

# The cache is skipped under `verify=True` (the verifier is asked to check every pass),
# so these tests compile with the default options rather than the directory's.
NO_VERIFY = Options(verify=False)


def test_second_function_in_the_process_runs_no_pass(cache_root: Path) -> None:
    example = EXAMPLES["self_attention"].small()
    inputs = example.inputs(seed=2)
    before = cache.stats()
    first = tl.function(example.fn, jit_compile=True, options=NO_VERIFY)(*inputs).numpy()
    middle = cache.stats()
    second = tl.function(example.fn, jit_compile=True, options=NO_VERIFY)(*inputs).numpy()
    after = cache.stats()
    assert middle.pipeline_runs == before.pipeline_runs + 1
    assert after.pipeline_runs == middle.pipeline_runs
    assert after.llvm_compilations == middle.llvm_compilations
    assert after.optimized_memory_hits == middle.optimized_memory_hits + 1
    np.testing.assert_array_equal(second, first)


def test_report_of_a_cached_compile_matches_the_cold_one(cache_root: Path) -> None:
    example = EXAMPLES["softmax"].small()
    inputs = example.inputs(seed=3)
    cold = tl.function(example.fn, jit_compile=True, options=NO_VERIFY)
    cold_report = cold.explain(*inputs)
    cache.clear_memory()  # the disk entries then
    warm = tl.function(example.fn, jit_compile=True, options=NO_VERIFY)
    warm_report = warm.explain(*inputs)
    assert ([(c.kernel_count, c.temp_bytes, c.temp_bytes_without_reuse)
             for c in warm_report.clusters]
            == [(c.kernel_count, c.temp_bytes, c.temp_bytes_without_reuse)
                for c in cold_report.clusters])
    # Called from another line: the same compile but for the metadata's source lines.
    for stage in ("hlo", "optimized_hlo", "buffer_assignment", "llvm"):
        texts = [f.experimental_get_compiler_ir(*inputs)(stage=stage) for f in (warm, cold)]
        assert without_metadata(texts[0]) == without_metadata(texts[1]), stage


PROCESS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tfxla_lite as tl
    from tfxla_lite.codegen import cache
    from tfxla_lite.examples import EXAMPLES
    from tfxla_lite.options import Options

    results, names = {}, sys.argv[2:]
    for name in names:
        example = EXAMPLES[name].small()
        f = tl.function(example.fn, jit_compile=True, options=Options(verify=False))
        results[name] = f(*example.inputs(seed=4)).numpy()
    np.savez(sys.argv[1], **results)
    stats = cache.stats()
    print(json.dumps({"pipeline_runs": stats.pipeline_runs,
                      "llvm_compilations": stats.llvm_compilations,
                      "optimized_disk_hits": stats.optimized_disk_hits,
                      "optimized_disk_rejected": stats.optimized_disk_rejected}))
""")


def _run(tmp_path: Path, n: int, names: list[str]) -> dict[str, int]:
    env = {**os.environ, "TFXLA_LITE_CACHE_DIR": str(tmp_path / "cache"),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TFXLA_LITE_CACHE", None)
    result = subprocess.run([sys.executable, "-c", PROCESS, str(tmp_path / f"{n}.npz"), *names],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _same_results(tmp_path: Path, a: int, b: int) -> None:
    with np.load(tmp_path / f"{a}.npz") as first, np.load(tmp_path / f"{b}.npz") as second:
        assert sorted(first) == sorted(second)
        for name in first:
            np.testing.assert_array_equal(second[name], first[name])


def test_second_process_runs_no_pass_and_no_llvm(tmp_path: Path) -> None:
    names = ["mlp", "softmax", "self_attention"]
    cold = _run(tmp_path, 0, names)
    assert cold["pipeline_runs"] == len(names) and cold["llvm_compilations"] >= len(names)
    warm = _run(tmp_path, 1, names)
    assert warm == {"pipeline_runs": 0, "llvm_compilations": 0,
                    "optimized_disk_hits": len(names), "optimized_disk_rejected": 0}
    _same_results(tmp_path, 0, 1)
    # Damaged entries are refused, compiled afresh (same bits) and rewritten.
    for entry in (tmp_path / "cache" / "optimized").glob("*" + module_cache.STAGE.suffix):
        data = entry.read_bytes()
        entry.write_bytes(data[:-1] + bytes([data[-1] ^ 0x55]))
    damaged = _run(tmp_path, 2, names)
    assert damaged["optimized_disk_rejected"] == len(names)
    assert damaged["pipeline_runs"] == len(names)
    _same_results(tmp_path, 0, 2)
    assert _run(tmp_path, 3, names)["pipeline_runs"] == 0


def test_dynamic_cluster_specializations_are_cached_too(cache_root: Path) -> None:
    def scale(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(x * 2.0 + 1.0) - x

    spec = [tf.TensorSpec([None, 8], tf.float32)]
    x = np.arange(24, dtype=np.float32).reshape(3, 8) - 10
    cold = tl.function(scale, jit_compile=True, input_signature=spec, options=NO_VERIFY)
    expected = cold(x).numpy()
    cache.clear_memory()
    before = cache.stats()
    warm = tl.function(scale, jit_compile=True, input_signature=spec, options=NO_VERIFY)
    np.testing.assert_array_equal(warm(x).numpy(), expected)
    after = cache.stats()
    assert after.pipeline_runs == before.pipeline_runs
    assert after.llvm_compilations == before.llvm_compilations
    assert after.optimized_disk_hits == before.optimized_disk_hits + 1


def test_collector_is_paused_during_a_compile_and_restored_after() -> None:
    import gc

    seen = []

    def probe(x: tf.Tensor) -> tf.Tensor:
        seen.append(gc.isenabled())  # runs while TF traces it
        return x * 2.0 + 1.0

    assert gc.isenabled()
    tl.function(probe, jit_compile=True, options=NO_VERIFY)(tf.ones((3,)))
    assert seen == [False] and gc.isenabled()

    def broken(x: tf.Tensor) -> tf.Tensor:
        raise ValueError("fails while tracing")

    with pytest.raises(ValueError, match="fails while tracing"):
        tl.function(broken, jit_compile=True, options=NO_VERIFY)(tf.ones((3,)))
    assert gc.isenabled()
    gc.disable()  # the caller's own choice is left alone
    try:
        tl.function(lambda x: x - 1.0, jit_compile=True, options=NO_VERIFY)(tf.ones((3,)))
        assert not gc.isenabled()
    finally:
        gc.enable()
