"""Dots computed by the packed GEMM (`codegen/cpu/gemm_packed.py`) through TF: the launch
op's results against TF's own (oneDNN), with the MatMul tolerance: a dense layer of odd
sizes (bias and relu as the kOutput epilogue), transposed operands, a batched product."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.codegen.cpu import gemm_packed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_blocked_dots import _uniform  # noqa: E402 - this folder's
from tolerances import assert_close  # noqa: E402 - tests/tolerances.py, by path

pytestmark = pytest.mark.skipif(not gemm_packed.available(), reason="no AVX-512")


@pytest.fixture
def packed_tiles(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each tile compiled by the packed GEMM has A transposed (caches off, so
    that every kernel is emitted here)."""
    monkeypatch.setenv("TFXLA_LITE_CACHE", "0")
    # These shapes (1-2 GFLOP) are below MIN_FLOPS: lowered so that they take it.
    monkeypatch.setattr(gemm_packed, "MIN_FLOPS", 1 << 30)
    emitted: list[bool] = []
    emit_tile = gemm_packed.emit_tile

    def recorded(ctx, tile, *rest) -> None:  # type: ignore[no-untyped-def]
        emitted.append(tile.plan.transpose_a)
        emit_tile(ctx, tile, *rest)

    monkeypatch.setattr(gemm_packed, "emit_tile", recorded)
    return emitted


@pytest.mark.parametrize(("transpose_a", "transpose_b"),
                         [(False, False), (True, False), (False, True)])
def test_dense_layer_of_odd_sizes_matches_tf(packed_tiles: list[bool], transpose_a: bool,
                                             transpose_b: bool) -> None:
    m, k, n = 1000, 1100, 1030
    rng = np.random.default_rng(m + k)
    x = _uniform(rng, (k, m) if transpose_a else (m, k))
    # Weights scaled by 1/√K, as a layer's initializer does: sums of order one.
    w = _uniform(rng, (n, k) if transpose_b else (k, n), k ** -0.5)
    b = _uniform(rng, (n,))

    def layer(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        product = tf.matmul(x, w, transpose_a=transpose_a, transpose_b=transpose_b)
        return tf.nn.relu(product + b)

    compiled = tl.function(layer, jit_compile=True)
    expected = tf.function(layer)(x, w, b).numpy()
    for _ in range(2):  # the second call runs the registered kernel again
        assert_close(compiled(x, w, b).numpy(), expected, "MatMul", f"{m}x{k}x{n}")
    assert (expected == 0).any() and (expected > 0).any()
    assert packed_tiles == [transpose_a]


def test_batched_product_matches_tf(packed_tiles: list[bool]) -> None:
    rng = np.random.default_rng(2)
    q, v = _uniform(rng, (2, 1030, 520)), _uniform(rng, (2, 520, 1050), 520 ** -0.5)

    def product(q: tf.Tensor, v: tf.Tensor) -> tf.Tensor:
        return tf.tanh(tf.matmul(q, v))

    compiled = tl.function(product, jit_compile=True)
    expected = tf.function(product)(q, v).numpy()
    assert_close(compiled(q, v).numpy(), expected, "MatMul", "2x1030x520x1050, tanh")
    assert packed_tiles == [False]
