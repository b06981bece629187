"""Tiered LLVM compiles (`TFXLA_LITE_TIERED`, codegen/cpu/tiers.py): a compile-cache miss
runs first on quick-tier code, then on the O3 code compiled in the background and
swapped in under the same launch key; only O3 code is cached, the rewrite cache is
written once it is stored, and an O3 failure keeps the quick code running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite import rewrite_cache
from tfxla_lite.codegen import cache
from tfxla_lite.codegen.cpu import engine, kernel_cache, tiers
from tfxla_lite.options import Options

# The compile caches are skipped under `verify=True` (the directory's default).
NO_VERIFY = Options(verify=False)


def softmax_and_sum(x):
    y = x * 2.0 + 1.0
    return tf.nn.softmax(y, axis=-1), tf.reduce_sum(tf.tanh(x) * x, axis=0)


def _input(seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((64, 128)).astype(np.float32)


def _assert_like_tf(actual: Any, x: np.ndarray) -> None:
    expected = tf.function(softmax_and_sum)(x)
    assert_close(actual[0].numpy(), expected[0].numpy(), "Softmax")
    assert_close(actual[1].numpy(), expected[1].numpy(), "Sum")


@pytest.fixture(autouse=True)
def _tiered(cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tl.wait_for_compiles()  # no earlier test's compile finishes inside this one
    monkeypatch.setenv("TFXLA_LITE_TIERED", "1")
    monkeypatch.delenv("TFXLA_LITE_OVERLAP_LLVM", raising=False)
    yield cache_root
    for release in _GATES:  # a failed test must not leave O3 compiles held
        release.set()
    _GATES.clear()
    tl.wait_for_compiles()  # nothing of this test compiles into the next one's folder


_GATES: list[Any] = []


def _gate_o3(monkeypatch: pytest.MonkeyPatch, calls: list[Any] | None = None) -> Any:
    """Hold every background O3 compile until the returned event is set (the quick tier,
    O3 parts of its own included, is not held); `calls` gets (speed level, code
    generation level, texts, thread name) of every compile."""
    import threading

    release = threading.Event()
    _GATES.append(release)
    compile_parts = engine.compile_parts

    def gated(texts: list[str], speed_level: int = 3, codegen_level: int = 3,
              *args: Any, **kwargs: Any) -> Any:
        thread = threading.current_thread().name
        if calls is not None:
            calls.append((speed_level, codegen_level, list(texts), thread))
        if speed_level == 3 and thread.startswith("tfxla-lite-llvm"):
            assert release.wait(60)
        return compile_parts(texts, speed_level, codegen_level, *args, **kwargs)

    monkeypatch.setattr(engine, "compile_parts", gated)
    return release


def _executables(f: tl.Function) -> list[Any]:
    (program,) = f._programs.values()
    return [c.executable for c in program.clusters]


def test_quick_tier_runs_like_tf_then_the_o3_code_is_swapped_in(monkeypatch) -> None:
    release = _gate_o3(monkeypatch)
    before = cache.stats()
    x = _input()
    f = tl.function(softmax_and_sum, jit_compile=True, options=NO_VERIFY)
    quick_values = f(x)
    executables = _executables(f)
    assert executables and all(e.tier == "quick" for e in executables)
    _assert_like_tf(quick_values, x)
    _assert_like_tf(f(x * 3.0), x * 3.0)  # the same signature, still the quick code
    # Nothing is cached while only quick code exists: no kernel entry, no rewrite entry.
    assert not list((tiers_root := Path(os.environ["TFXLA_LITE_CACHE_DIR"])).glob(
        "kernels/*" + kernel_cache.STAGE.suffix))
    assert not list(tiers_root.glob("rewrites/*" + rewrite_cache.STAGE.suffix))
    release.set()
    assert tl.wait_for_compiles(60)
    assert all(e.tier == "o3" and e.tier_error is None for e in executables)
    after = cache.stats()
    assert after.quick_compilations - before.quick_compilations == len(executables)
    assert after.tier_swaps - before.tier_swaps == len(executables)
    o3_values = f(x)
    _assert_like_tf(o3_values, x)
    # The same IR, IEEE float semantics at both levels: the same bits.
    for quick, o3 in zip(quick_values, o3_values):
        np.testing.assert_array_equal(quick.numpy(), o3.numpy())
    # The inspected LLVM IR is the O3 module's.
    text = f.experimental_get_compiler_ir(x)(stage="llvm")
    assert "define void @entry(" in text and tiers.TIER_ENTRY not in text


def test_only_o3_objects_are_cached_and_the_rewrite_entry_comes_after_them(
        cache_root: Path) -> None:
    f = tl.function(softmax_and_sum, jit_compile=True, options=NO_VERIFY)
    x = _input(5)
    _assert_like_tf(f(x), x)
    executables = _executables(f)
    assert tl.wait_for_compiles(60) and all(e.tier == "o3" for e in executables)
    entries = list(cache_root.glob("kernels/*" + kernel_cache.STAGE.suffix))
    assert len(entries) == len(executables)
    # The stored objects are the O3 compile's: the same bytes as a compile at O3 now.
    stored = set()
    for entry in entries:
        header, sections = cache.read_entry(entry.read_bytes(), {})
        stored.add(tuple(body for section, body in zip(header["sections"], sections)
                         if section["name"] == "object"))
    for executable in executables:
        o3 = engine.compile_parts([executable.llvm_ir]).objects
        quick = engine.compile_parts([executable.llvm_ir], tiers.QUICK_SPEED_LEVEL,
                                     tiers.QUICK_CODEGEN_LEVEL).objects
        assert quick != o3  # the test can tell the tiers apart
        assert o3 in stored and quick not in stored
    assert len(list(cache_root.glob("rewrites/*" + rewrite_cache.STAGE.suffix))) == 1
    # A second function in the process takes the O3 code from the caches: no quick tier.
    before = cache.stats()
    g = tl.function(softmax_and_sum, jit_compile=True, options=NO_VERIFY)
    _assert_like_tf(g(x), x)
    assert all(e.tier == "o3" for e in _executables(g))
    assert cache.stats().quick_compilations == before.quick_compilations


def test_an_o3_failure_is_reported_and_the_quick_code_keeps_running(
        monkeypatch, cache_root: Path, caplog) -> None:
    compile_parts = engine.compile_parts

    def failing(texts: list[str], speed_level: int = 3, *args: Any, **kwargs: Any) -> Any:
        if speed_level == 3:
            raise RuntimeError("injected O3 failure")
        return compile_parts(texts, speed_level, *args, **kwargs)

    monkeypatch.setattr(engine, "compile_parts", failing)
    before = cache.stats()
    x = _input(7)
    f = tl.function(softmax_and_sum, jit_compile=True, options=NO_VERIFY)
    _assert_like_tf(f(x), x)
    with caplog.at_level("WARNING", logger="tfxla_lite"):
        assert tl.wait_for_compiles(60)
    executables = _executables(f)
    assert all(e.tier == "quick" for e in executables)
    assert all("injected O3 failure" in str(e.tier_error) for e in executables)
    assert cache.stats().tier_failures - before.tier_failures == len(executables)
    assert "injected O3 failure" in caplog.text
    _assert_like_tf(f(x + 1.0), x + 1.0)  # still running, still right
    # Nothing cached that a warm process would trust.
    assert not list(cache_root.glob("kernels/*" + kernel_cache.STAGE.suffix))
    assert not list(cache_root.glob("rewrites/*" + rewrite_cache.STAGE.suffix))
    text = f.experimental_get_compiler_ir(x)(stage="llvm")
    assert "O3 compile failed" in text


def test_dynamic_specializations_swap_too(monkeypatch) -> None:
    from tfxla_lite.driver import build_program
    from tfxla_lite.runtime import loader

    release = _gate_o3(monkeypatch)

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def scale(x):
        return tf.nn.relu(x * 2.0 + 1.0) - tf.tanh(x)

    program = build_program(scale.get_concrete_function(), True, NO_VERIFY, dynamic=True)
    try:
        (dynamic,) = program.dynamic_clusters
        x = _input(9)[:, :16]
        expected = scale(x).numpy()
        quick = program.run(x).numpy()
        assert_close(quick, expected, "Tanh")
        (specialization,) = dynamic.specializations
        assert specialization.executable.tier == "quick"
        release.set()
        assert tl.wait_for_compiles(60)
        assert specialization.executable.tier == "o3"
        # The launch op's per-shape cache kept the trampoline's address: now it runs O3.
        o3 = program.run(x).numpy()
        np.testing.assert_array_equal(o3, quick)
        assert_close(program.run(x[:5]).numpy(), expected[:5], "Tanh")
    finally:
        loader.unregister(dynamic.key)


def test_switched_off_it_compiles_as_before(monkeypatch) -> None:
    monkeypatch.setenv("TFXLA_LITE_TIERED", "0")
    before = cache.stats()
    x = _input(11)
    f = tl.function(softmax_and_sum, jit_compile=True, options=NO_VERIFY)
    _assert_like_tf(f(x), x)
    executables = _executables(f)
    assert all(e.tier == "o3" and not isinstance(e, tiers.BackgroundExecutable)
               for e in executables)
    assert cache.stats().quick_compilations == before.quick_compilations


def test_dumps_show_the_o3_code_without_a_quick_tier(tmp_path: Path) -> None:
    before = cache.stats()
    x = _input(13)
    f = tl.function(softmax_and_sum, jit_compile=True,
                    options=Options(verify=False, dump_to=str(tmp_path / "dump")))
    _assert_like_tf(f(x), x)
    assert cache.stats().quick_compilations == before.quick_compilations
    dumped = list((tmp_path / "dump").glob("*.ir-with-opt.ll"))
    assert dumped and all(tiers.TIER_ENTRY not in d.read_text() for d in dumped)


PROCESS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tfxla_lite as tl
    from tfxla_lite.codegen import cache
    from tfxla_lite.options import Options

    def softmax_and_sum(x):
        y = x * 2.0 + 1.0
        return tf.nn.softmax(y, axis=-1), tf.reduce_sum(tf.tanh(x) * x, axis=0)

    x = np.random.default_rng(3).standard_normal((64, 128)).astype(np.float32)
    f = tl.function(softmax_and_sum, jit_compile=True, options=Options(verify=False))
    values = f(x)
    (program,) = f._programs.values()
    np.savez(sys.argv[1], *[v.numpy() for v in values])
    stats = cache.stats()
    print(json.dumps({"tiers": [c.executable.tier for c in program.clusters],
                      "quick": stats.quick_compilations, "llvm": stats.llvm_compilations,
                      "pipelines": stats.pipeline_runs, "rewrite_hits": stats.rewrite_hits}))
""")


def _process(tmp_path: Path, n: int) -> dict[str, Any]:
    env = {**os.environ, "TFXLA_LITE_CACHE_DIR": str(tmp_path / "cache"),
           "TF_CPP_MIN_LOG_LEVEL": "2", "TFXLA_LITE_TIERED": "1"}
    env.pop("TFXLA_LITE_CACHE", None)
    result = subprocess.run([sys.executable, "-c", PROCESS, str(tmp_path / f"{n}.npz")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_fresh_process_loads_the_o3_code_the_cold_one_left(tmp_path: Path) -> None:
    cold = _process(tmp_path, 0)
    assert cold["quick"] >= 1 and cold["pipelines"] >= 1
    # The cold process exited right after its first call: exit waited for the O3 compile.
    warm = _process(tmp_path, 1)
    assert warm == {"tiers": ["o3"] * len(warm["tiers"]), "quick": 0, "llvm": 0,
                    "pipelines": 0, "rewrite_hits": 1}
    assert not list((tmp_path / "cache" / "kernels").glob("*.tmp"))
    with np.load(tmp_path / "0.npz") as first, np.load(tmp_path / "1.npz") as second:
        for name in first:
            np.testing.assert_array_equal(second[name], first[name])
    x = np.random.default_rng(3).standard_normal((64, 128)).astype(np.float32)
    with np.load(tmp_path / "1.npz") as second:
        _assert_like_tf([tf.constant(second["arr_0"]), tf.constant(second["arr_1"])], x)


def _dense(x: Any, w: Any) -> Any:
    return tf.nn.relu(tf.matmul(x, w) + 1.0)


def test_register_blocks_compile_at_o3_inside_the_quick_tier(monkeypatch) -> None:
    """Blocks ran 3-7x slower at the quick tier's levels: their functions are set apart
    in a part compiled at O3 (tiers.O3_EVEN_WHEN_QUICK), the rest of the module at the
    quick levels; the result is TF's, and the O3 code swapped in gives the same bits."""
    calls: list[Any] = []
    release = _gate_o3(monkeypatch, calls)
    x = _input(15)  # 64 rows: register blocks (dot_blocks.MAX_ROWS)
    w = np.ascontiguousarray(np.resize(_input(16), (128, 64)))
    before = cache.stats()
    f = tl.function(_dense, jit_compile=True, options=NO_VERIFY)
    quick = f(x, w).numpy()
    executables = _executables(f)
    assert executables and all(e.tier == "quick" for e in executables)
    assert cache.stats().quick_compilations - before.quick_compilations == len(executables)
    assert_close(quick, tf.function(_dense)(x, w).numpy(), "MatMul")
    foreground = [c for c in calls if not c[3].startswith("tfxla-lite-llvm")]
    at_o3 = [c for c in foreground if c[:2] == (3, 3)]
    at_quick = [c for c in foreground if c[:2] == (tiers.QUICK_SPEED_LEVEL,
                                                   tiers.QUICK_CODEGEN_LEVEL)]
    assert len(at_o3) == len(at_quick) == len(executables)
    for _, _, texts, _ in at_o3:  # the blocks alone, defined and external
        (text,) = texts
        defined = re.findall(r'^define (?:internal )?void @"([^"]+)"', text, re.M)
        assert defined and all(name.startswith("dot_block.") for name in defined)
        assert "define internal" not in text
    for _, _, texts, _ in at_quick:  # the rest: the tile loops call the blocks declared
        assert not any('define void @"dot_block.' in t or 'define internal void @"dot_block.'
                       in t for t in texts)
        assert any('declare void @"dot_block.' in t for t in texts)
    release.set()
    assert tl.wait_for_compiles(60)
    assert all(e.tier == "o3" and e.tier_error is None for e in executables)
    np.testing.assert_array_equal(f(x, w).numpy(), quick)


def test_a_library_dot_runs_on_the_quick_tier_like_tf(monkeypatch) -> None:
    """A dot of 256 rows calls the library GEMM, as fast at either tier: it is tiered,
    and the swap keeps its bits."""
    release = _gate_o3(monkeypatch)
    x = np.resize(_input(17), (256, 128))
    w = np.ascontiguousarray(np.resize(_input(18), (128, 64)))
    f = tl.function(_dense, jit_compile=True, options=NO_VERIFY)
    quick = f(x, w).numpy()
    executables = _executables(f)
    assert executables and all(e.tier == "quick" for e in executables)
    assert_close(quick, tf.function(_dense)(x, w).numpy(), "MatMul")
    release.set()
    assert tl.wait_for_compiles(60)
    assert all(e.tier == "o3" for e in executables)
    np.testing.assert_array_equal(f(x, w).numpy(), quick)
