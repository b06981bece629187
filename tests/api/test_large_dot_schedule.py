"""Dots above `BALANCE_FLOPS` (codegen/cpu/dot.py), whose split budget shrinks with their
flops, through TF: the launch op's result against TF's own, plain and with the rhs
transposed, a dense layer's bias and relu as the kOutput epilogue."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.codegen.cpu import dot as dot_codegen
from tfxla_lite.codegen.cpu import engine, gemm_packed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerances import assert_close  # noqa: E402 - tests/tolerances.py, by path

pytestmark = pytest.mark.skipif(engine.gemm("f32") is None, reason="no OpenBLAS")


@pytest.fixture(autouse=True)
def library_dots(monkeypatch: pytest.MonkeyPatch) -> None:
    """These dots take the packed GEMM where it is available (tests/codegen/
    test_gemm_packed.py, tests/api/test_packed_gemm_tf.py); here the library's schedule
    is tested, so the packed GEMM is off (caches off: a cached kernel could be packed)."""
    monkeypatch.setattr(gemm_packed, "fits", lambda plan: False)
    monkeypatch.setenv("TFXLA_LITE_CACHE", "0")


@pytest.mark.parametrize(("m", "k", "n", "transpose_b", "tiles"),
                         [(1100, 1000, 1030, False, (2, 2)), (600, 1200, 1500, True, (1, 4))])
def test_large_dense_layer_matches_tf(m: int, k: int, n: int, transpose_b: bool,
                                      tiles: tuple[int, int]) -> None:
    plan = dot_codegen.GemmPlan(m, n, k, False, k, transpose_b, k if transpose_b else n,
                                (), (), ())
    sched = dot_codegen.schedule(plan)
    assert sched.flops > dot_codegen.BALANCE_FLOPS
    assert (sched.strategy, (sched.tiles_m, sched.tiles_n)) == ("library", tiles)
    rng = np.random.default_rng(m + n)
    x = tf.constant(rng.uniform(-1, 1, (m, k)).astype(np.float32))
    # Weights scaled by 1/√K, as a layer's initializer does: sums of order one, whose
    # rounding differences (oneDNN and OpenBLAS add the K products in other orders) stay
    # within the MatMul tolerance near zero too.
    w = tf.constant((rng.uniform(-1, 1, (n, k) if transpose_b else (k, n)) / np.sqrt(k)
                     ).astype(np.float32))
    b = tf.constant(rng.uniform(-1, 1, (n,)).astype(np.float32))

    def layer(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(tf.matmul(x, w, transpose_b=transpose_b) + b)

    compiled = tl.function(layer, jit_compile=True)
    expected = tf.function(layer)(x, w, b).numpy()
    for _ in range(2):  # the second call runs the registered kernel again
        actual = compiled(x, w, b).numpy()
        assert_close(actual, expected, "MatMul", f"{m}x{k}x{n}")
    assert (expected == 0).any() and (expected > 0).any()
