"""A trace's clusters compile LLVM in the background (`tfxla_lite.driver`,
`cpu.compile(..., background=True)`), while TF traces the rewritten graph: the launch
op gets a cluster's code only once LLVM is done, results are TF's, and LLVM's failure
is a must-compile error or, in auto mode, TF running the function."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite import driver
from tfxla_lite.codegen.cpu import compiler as cpu_compiler
from tfxla_lite.codegen.cpu import tiers
from tfxla_lite.program import Program
from tfxla_lite.runtime import registry_size


def softmax_and_sum(x):
    y = x * 2.0 + 1.0
    return tf.nn.softmax(y, axis=-1), tf.reduce_sum(x * x, axis=0)


@pytest.fixture(autouse=True)
def _no_compile_caches(cache_root, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test compiles: a cache hit would run no LLVM, in the background or not."""
    monkeypatch.setenv("TFXLA_LITE_CACHE", "0")
    monkeypatch.setenv("TFXLA_LITE_OVERLAP_LLVM", "1")
    monkeypatch.setenv("TFXLA_LITE_TIERED", "0")  # tiered compiles take precedence


def _input() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((64, 128)).astype(np.float32)


def _assert_like_tf(actual: Any, x: np.ndarray) -> None:
    expected = tf.function(softmax_and_sum)(x)
    assert_close(actual[0].numpy(), expected[0].numpy(), "Softmax")
    assert_close(actual[1].numpy(), expected[1].numpy(), "Sum")


def test_the_launch_op_gets_the_code_only_once_llvm_is_done(monkeypatch) -> None:
    release = threading.Event()
    machine_code = cpu_compiler._machine_code
    seen: list[tuple[int, int, bool]] = []

    def gated(emitted: cpu_compiler.EmittedModule, *rest: Any) -> Any:
        assert release.wait(60)
        return machine_code(emitted, *rest)

    finish_pending = driver.finish_pending

    def finishing(program: Program) -> None:
        # Called in the rewritten graph's trace: LLVM still holds every cluster's code,
        # and none is registered yet.
        before = registry_size()
        seen.append((len(program.pending), before,
                     any(e.ready for _, e, _, _ in program.pending)))
        release.set()
        finish_pending(program)
        assert registry_size() == before + seen[-1][0] and not program.pending

    monkeypatch.setattr(cpu_compiler, "_machine_code", gated)
    monkeypatch.setattr(driver, "finish_pending", finishing)
    x = _input()
    f = tl.function(softmax_and_sum, jit_compile=True)
    _assert_like_tf(f(x), x)
    assert seen and seen[0][0] >= 1 and not seen[0][2]
    _assert_like_tf(f(x * 2.0), x * 2.0)  # same signature: no compile, no wait


def test_without_overlap_clusters_are_registered_at_once(monkeypatch) -> None:
    monkeypatch.setenv("TFXLA_LITE_OVERLAP_LLVM", "0")
    x = _input()
    f = tl.function(softmax_and_sum, jit_compile=True)
    _assert_like_tf(f(x), x)
    (program,) = f._programs.values()
    assert not program.pending
    assert not any(isinstance(c.executable, tiers.BackgroundExecutable)
                   for c in program.clusters)


def _failing_llvm(monkeypatch) -> None:
    def failing(emitted: cpu_compiler.EmittedModule, *rest: Any) -> Any:
        raise RuntimeError("injected LLVM failure")

    monkeypatch.setattr(cpu_compiler, "_machine_code", failing)


def test_llvms_failure_is_a_must_compile_error(monkeypatch) -> None:
    _failing_llvm(monkeypatch)
    strict = tl.Options(strict_jit_compile=True)
    with pytest.raises(tl.CompilationError, match="LLVM could not compile cluster_0.*"
                                                  "injected LLVM failure"):
        tl.function(softmax_and_sum, jit_compile=True, options=strict)(_input())
    # Not strict, the trace runs on TF's XLA (tfxla_lite/xla_fallback.py) with TF's numbers.
    x = _input()
    f = tl.function(softmax_and_sum, jit_compile=True)
    _assert_like_tf(f(x), x)
    assert tl.explain(f, x).runs_on_xla


def test_llvms_failure_leaves_the_function_to_tf_in_auto_mode(monkeypatch) -> None:
    _failing_llvm(monkeypatch)
    x = _input()
    f = tl.function(softmax_and_sum, min_cluster_size=1)
    _assert_like_tf(f(x), x)
    assert "injected LLVM failure" in str(tl.explain(f, x))
