"""Dots computed by register blocks (`codegen/cpu/dot_blocks.py`) through TF: the launch
op's results against TF's own, with the MatMul tolerance: mlp_infer_b64's layers (M = 64,
bias and relu as the kOutput epilogue), a weight gradient (A transposed, K = 128) and a
batched product with a single and a masked last vector of columns."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.codegen.cpu import dot_blocks

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerances import assert_close  # noqa: E402 - tests/tolerances.py, by path


@pytest.fixture
def blocked_tiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The element types of the tiles compiled by register blocks (caches off, so that
    every kernel is emitted here)."""
    monkeypatch.setenv("TFXLA_LITE_CACHE", "0")
    emitted: list[str] = []
    emit_tile = dot_blocks.emit_tile

    def recorded(ctx, tile, *sizes) -> None:  # type: ignore[no-untyped-def]
        emitted.append(tile.element_type)
        emit_tile(ctx, tile, *sizes)

    monkeypatch.setattr(dot_blocks, "emit_tile", recorded)
    return emitted


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0
             ) -> tf.Tensor:
    return tf.constant((rng.uniform(-1, 1, shape) * scale).astype(np.float32))


def test_inference_layers_at_batch_64_match_tf(blocked_tiles: list[str]) -> None:
    rng = np.random.default_rng(64)
    x = _uniform(rng, (64, 784))
    # Weights scaled by 1/√K, as a layer's initializer does: sums of order one.
    weights = [(_uniform(rng, (k, n), k ** -0.5), _uniform(rng, (n,)))
               for k, n in ((784, 512), (512, 512), (512, 10))]

    def mlp(x: tf.Tensor) -> tf.Tensor:
        for n, (w, b) in enumerate(weights):
            x = tf.matmul(x, w) + b
            x = tf.nn.relu(x) if n < 2 else x
        return x

    compiled = tl.function(mlp, jit_compile=True)
    expected = tf.function(mlp)(x).numpy()
    for _ in range(2):  # the second call runs the registered kernels again
        assert_close(compiled(x).numpy(), expected, "MatMul", "64x784x512x512x10")
    assert blocked_tiles == ["f32"] * 2  # the 10-column output layer calls the library


def test_weight_gradient_and_batched_product_match_tf(blocked_tiles: list[str]) -> None:
    rng = np.random.default_rng(128)
    x, dy = _uniform(rng, (128, 64)), _uniform(rng, (128, 512), 128 ** -0.5)
    q, v = _uniform(rng, (4, 48, 200)), _uniform(rng, (4, 200, 45), 200 ** -0.5)

    def products(x: tf.Tensor, dy: tf.Tensor, q: tf.Tensor, v: tf.Tensor
                 ) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.matmul(x, dy, transpose_a=True), tf.tanh(tf.matmul(q, v))

    compiled = tl.function(products, jit_compile=True)
    expected = tf.function(products)(x, dy, q, v)
    actual = compiled(x, dy, q, v)
    assert_close(actual[0].numpy(), expected[0].numpy(), "MatMul", "64x128x512, A^T")
    assert_close(actual[1].numpy(), expected[1].numpy(), "MatMul", "4x48x200x45, tanh")
    assert len(blocked_tiles) == 2


def test_attention_and_input_gradient_match_tf(blocked_tiles: list[str]) -> None:
    """B transposed at a short K through a transposed copy (attention's scores q·kᵀ over
    16 features per head, batched; an input gradient dy·Wᵀ), and the probabilities times
    the values, 16 columns wide, batched: all three by register blocks."""
    rng = np.random.default_rng(16)
    q, k, v = (_uniform(rng, (2, 4, 64, 16)) for _ in range(3))
    dy, w = _uniform(rng, (256, 64)), _uniform(rng, (64, 64), 64 ** -0.5)

    def attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, dy: tf.Tensor, w: tf.Tensor
                  ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        scores = tf.matmul(q, k, transpose_b=True) * 0.25
        return scores, tf.matmul(tf.nn.softmax(scores), v), tf.matmul(dy, w, transpose_b=True)

    compiled = tl.function(attention, jit_compile=True)
    expected = tf.function(attention)(q, k, v, dy, w)
    actual = compiled(q, k, v, dy, w)
    for got, want, case in zip(actual, expected, ("2x4x64x16x64, B^T", "2x4x64x64x16",
                                                  "256x64x64, B^T"), strict=True):
        assert_close(got.numpy(), want.numpy(), "MatMul", case)
    assert len(blocked_tiles) == 3
