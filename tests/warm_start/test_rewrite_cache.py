"""The rewrite cache (tfxla_lite/rewrite_cache.py): a warm trace skips marking, lowering
and the passes; bad, stale or foreign entries are never trusted; the source lines shown
are always the current function's."""

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
from tfxla_lite import rewrite_cache
from tfxla_lite.codegen import cache


def first(x):
    return tf.nn.relu(x * 2.0 + 1.0) * x, tf.strings.length(tf.strings.as_string(x))


def second(x):  # the same trace as `first`, made on other lines
    return tf.nn.relu(x * 2.0 + 1.0) * x, tf.strings.length(tf.strings.as_string(x))


def _line(fn) -> int:
    return fn.__code__.co_firstlineno + 1


X = np.linspace(-2.0, 2.0, 24, dtype=np.float32).reshape(4, 6)


def _compile(fn=first) -> tuple[tl.Function, list[np.ndarray]]:
    function = tl.function(fn, autograph=False, min_cluster_size=1)
    values = [np.asarray(v) for v in function(tf.constant(X))]
    tl.wait_for_compiles()  # the entry is written once the O3 code is stored (tiers.py)
    return function, values


def _entries(root: Path) -> list[Path]:
    return sorted((root / "rewrites").glob("*" + rewrite_cache.STAGE.suffix))


def _delta(before: cache.CacheStats) -> dict[str, int]:
    after = cache.stats()
    return {name: getattr(after, name) - getattr(before, name)
            for name in ("rewrite_hits", "rewrite_misses", "rewrite_writes", "rewrite_rejected",
                         "pipeline_runs", "llvm_compilations")}


def _expected() -> list[np.ndarray]:
    return [np.asarray(v) for v in tf.function(first, autograph=False)(tf.constant(X))]


def test_a_second_trace_reuses_the_whole_rewrite(cache_root: Path) -> None:
    before = cache.stats()
    cold, cold_values = _compile()
    assert _delta(before) == {"rewrite_hits": 0, "rewrite_misses": 1, "rewrite_writes": 1,
                              "rewrite_rejected": 0, "pipeline_runs": 1,
                              "llvm_compilations": 1}
    assert len(_entries(cache_root)) == 1
    cache.clear_memory()  # the executables come from disk
    before = cache.stats()
    warm, warm_values = _compile()
    assert _delta(before) == {"rewrite_hits": 1, "rewrite_misses": 0, "rewrite_writes": 0,
                              "rewrite_rejected": 0, "pipeline_runs": 0,
                              "llvm_compilations": 0}
    for got, cold_value, expected in zip(warm_values, cold_values, _expected()):
        np.testing.assert_array_equal(got, cold_value)
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    cold_report, warm_report = cold.explain(tf.constant(X)), warm.explain(tf.constant(X))
    assert warm_report.clusters == cold_report.clusters
    assert warm_report.fallbacks == cold_report.fallbacks
    assert {f.op_type for f in warm_report.fallbacks} >= {"AsString", "StringLength"}
    ops = [op.type for op in warm.get_concrete_function(tf.constant(X)).graph.get_operations()]
    assert "TfxlaLiteLaunch" in ops and "Relu" not in ops
    for stage in ("hlo", "optimized_hlo", "buffer_assignment", "llvm"):
        assert warm.experimental_get_compiler_ir(tf.constant(X))(stage) == (
            cold.experimental_get_compiler_ir(tf.constant(X))(stage)), stage


def test_source_lines_are_the_current_functions(cache_root: Path) -> None:
    _compile(first)
    cache.clear_memory()
    before = cache.stats()
    function, values = _compile(second)
    assert _delta(before)["rewrite_hits"] == 1
    ir = function.experimental_get_compiler_ir(tf.constant(X))
    for stage in ("hlo", "optimized_hlo"):
        text = ir(stage)
        assert f"source_line={_line(second)}" in text, stage
        assert f"source_line={_line(first)}" not in text, stage
    sources = {f.source for f in function.explain(tf.constant(X)).fallbacks if f.source}
    assert any(s.endswith(f":{_line(second)}") for s in sources), sources
    assert not any(s.endswith(f":{_line(first)}") for s in sources), sources
    np.testing.assert_array_equal(values[0], _expected()[0])


def test_a_hit_looks_the_fallbacks_source_lines_up_only_when_read(
        cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    # The module: the package's own `mark` is the function.
    mark = importlib.import_module("tfxla_lite.clustering.mark")
    _compile(first)
    cache.clear_memory()
    looked_up: list[str] = []
    format_source = mark.format_source
    monkeypatch.setattr(mark, "format_source",
                        lambda op: looked_up.append(op.name) or format_source(op))
    before = cache.stats()
    function, _ = _compile(second)
    assert _delta(before)["rewrite_hits"] == 1
    report = function.explain(tf.constant(X))
    assert report.fallbacks and looked_up == []  # a warm start reads none of them
    graph = function._programs[next(iter(function._programs))].graph
    sources = [f.source for f in report.fallbacks]
    assert sorted(looked_up) == sorted(f.op_name for f in report.fallbacks)
    assert sources == [format_source(graph.get_operation_by_name(f.op_name))
                       for f in report.fallbacks]
    assert any(s and s.endswith(f":{_line(second)}") for s in sources), sources
    assert [f.source for f in report.fallbacks] == sources  # read again: looked up once
    assert len(looked_up) == len(report.fallbacks)


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:-7])
    elif how == "flipped":
        path.write_bytes(data[:-3] + bytes([data[-3] ^ 0x40]) + data[-2:])
    elif how == "foreign":  # another TF version wrote it
        newline = data.index(b"\n")
        manifest = json.loads(data[:newline])
        manifest["tensorflow"] = "0.0.1"
        path.write_bytes(json.dumps(manifest, sort_keys=True).encode() + data[newline:])
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["truncated", "flipped", "foreign", "empty"])
def test_a_damaged_or_foreign_entry_is_compiled_again_and_rewritten(cache_root: Path,
                                                                    how: str) -> None:
    _compile()
    (entry,) = _entries(cache_root)
    _damage(entry, how)
    before = cache.stats()
    _, values = _compile()
    delta = _delta(before)
    assert delta["rewrite_rejected"] == 1 and delta["rewrite_hits"] == 0
    assert delta["rewrite_writes"] == 1
    np.testing.assert_allclose(values[0], _expected()[0], rtol=1e-6)
    before = cache.stats()
    _compile()
    assert _delta(before)["rewrite_hits"] == 1  # the rewritten entry is whole again


def test_an_entry_that_does_not_fit_the_trace_is_not_used(cache_root: Path) -> None:
    """A checksummed entry under the right key that names an op the trace lacks (as a
    hash collision or a bug would): checked against the graph, rejected."""
    _compile()
    (path,) = _entries(cache_root)
    payload = path.read_bytes().split(b"\n", 1)[1]
    import zlib
    entry = rewrite_cache.RewriteEntry.from_json(json.loads(zlib.decompress(payload)))
    (cluster,) = entry.clusters
    bad = rewrite_cache.RewriteEntry(
        (rewrite_cache.CachedCluster(**{**cluster.__dict__,
                                        "op_names": (*cluster.op_names, "no_such_op")}),),
        entry.report_clusters, entry.fallbacks)
    key = json.loads(path.read_bytes().split(b"\n", 1)[0])["key"]
    rewrite_cache.store(key, bad)
    before = cache.stats()
    _, values = _compile()
    assert _delta(before)["rewrite_rejected"] == 1
    np.testing.assert_allclose(values[0], _expected()[0], rtol=1e-6)


def test_executables_gone_from_the_caches_are_compiled_again(cache_root: Path) -> None:
    _compile()
    cache.clear_memory()
    for path in (cache_root / "optimized").iterdir():
        path.unlink()
    before = cache.stats()
    _, values = _compile()
    delta = _delta(before)
    assert delta["rewrite_hits"] == 0 and delta["rewrite_misses"] == 1
    assert delta["pipeline_runs"] == 1
    np.testing.assert_allclose(values[0], _expected()[0], rtol=1e-6)


def test_other_options_are_another_entry(cache_root: Path) -> None:
    _compile()
    before = cache.stats()
    tl.function(first, autograph=False, min_cluster_size=2)(tf.constant(X))
    tl.wait_for_compiles()
    assert _delta(before)["rewrite_hits"] == 0
    assert len(_entries(cache_root)) == 2


def test_options_that_only_act_at_run_time_share_the_entry(cache_root: Path) -> None:
    """`parallel_runtime`, `pause_collector` and `log_level` never change a build."""
    _compile()
    cache.clear_memory()
    before = cache.stats()
    options = tl.Options(min_cluster_size=1, parallel_runtime="serial",
                         pause_collector=False, log_level="error")
    tl.function(first, autograph=False, options=options)(tf.constant(X))
    assert _delta(before)["rewrite_hits"] == 1
    assert len(_entries(cache_root)) == 1


def test_a_must_compile_refusal_is_raised_again_without_marking(cache_root: Path) -> None:
    def refuse():
        # Strict: the refusal itself, not TF's XLA's (whose text names its own trace).
        function = tl.function(first, autograph=False, jit_compile=True,
                               options=tl.Options(strict_jit_compile=True))
        with pytest.raises(tl.CompilationError) as raised:
            function(tf.constant(X))
        return raised.value

    cold = refuse()
    before = cache.stats()
    warm = refuse()
    assert _delta(before)["rewrite_hits"] == 1
    # The same message but for the function's name, which is the current trace's.
    assert str(warm).splitlines()[1:] == str(cold).splitlines()[1:]
    assert "AsString" in str(warm)
    assert [(f.op_name, f.op_type, f.reason, f.source) for f in warm.offending] == [
        (f.op_name, f.op_type, f.reason, f.source) for f in cold.offending]
    assert any(f.source and f.source.endswith(f":{_line(first)}") for f in warm.offending)


@pytest.mark.parametrize("setting", ["0", "memory"])
def test_the_rewrite_cache_lives_on_disk_only(cache_root: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              setting: str) -> None:
    monkeypatch.setenv("TFXLA_LITE_CACHE", setting)
    _compile()
    _compile()
    assert not _entries(cache_root)


FRESH_PROCESS = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import tfxla_lite as tl
    from tfxla_lite.codegen import cache

    def step(x, w):
        h = tf.nn.relu(tf.matmul(x, w) + 1.0)
        return tf.reduce_sum(h * h, axis=1), tf.strings.length(tf.strings.as_string(x))

    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 4)])
    values = tl.function(step)(tf.constant(x), tf.constant(w))
    tl.wait_for_compiles()  # the rewrite entry is written once the O3 code is stored
    s = cache.stats()
    print(s.rewrite_hits, s.rewrite_writes, s.pipeline_runs, s.llvm_compilations)
    np.save(sys.argv[1], values[0].numpy())
""")


@pytest.mark.slow  # two processes that import TensorFlow
def test_a_fresh_process_starts_from_the_rewrite_cache(tmp_path: Path) -> None:
    env = {**os.environ, "TFXLA_LITE_CACHE_DIR": str(tmp_path / "cache"),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TFXLA_LITE_CACHE", None)
    ops = Path(os.environ.get("TFXLA_LITE_CACHE_DIR", "")) / "ops"
    if not os.environ.get("TFXLA_LITE_CACHE_DIR"):
        from tfxla_lite.cache_dir import cache_root
        ops = cache_root() / "ops"
    if ops.exists():  # the built launch op is not what this test is about
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / "ops").symlink_to(ops, target_is_directory=True)
    runs = []
    for n in range(2):
        result = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(tmp_path / f"{n}.npy")],
                                capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append(result.stdout.split()[-4:])
    cold_hits, cold_writes, cold_pipelines, _ = runs[0]
    assert (cold_hits, cold_writes) == ("0", "1") and int(cold_pipelines) >= 1
    assert runs[1] == ["1", "0", "0", "0"]
    np.testing.assert_array_equal(np.load(tmp_path / "0.npy"), np.load(tmp_path / "1.npy"))
