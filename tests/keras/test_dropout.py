"""Dropout under tfxla-lite draws the same masks as plain TF, step for step.

Keras 3 draws a Dropout mask with `tf.random.stateless_uniform` from a seed that a
`SeedGenerator` variable holds (read, then incremented, in the step). tfxla-lite
compiles those random ops to TF's own Philox and conversion to floats
(`clustering/rules_random.py`), so they give exactly the masks of TF's CPU kernel, as
plain TF without XLA draws them. TF's own XLA
(`jit_compile=True` under plain TF) lowers them with XLA's generator instead, whose
bits differ for the same seed (checked below): compared with *that* run, the masks, and
so the losses, differ from the first step. The reference here is therefore plain TF
with `jit_compile=False`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from keras_helpers import tokens, train, transformer


def test_xla_draws_other_stateless_random_bits_than_tf() -> None:
    """The cause of the difference against TF's XLA: same seed, other numbers."""
    seed = tf.constant([1, 2], tf.int32)

    def draw(s: tf.Tensor) -> tf.Tensor:
        return tf.random.stateless_uniform([64], seed=s)

    plain = tf.function(draw)(seed).numpy()
    xla = tf.function(draw, jit_compile=True)(seed).numpy()
    np.testing.assert_array_equal(plain, draw(seed).numpy())
    assert not np.array_equal(plain, xla)


def test_transformer_with_dropout_matches_tf_step_for_step() -> None:
    x, y = tokens()
    plain_losses, plain_weights, _ = train(transformer(0.1, jit_compile=False), x, y,
                                           compiled=False, epochs=2, batch_size=32)
    losses, weights, share = train(transformer(0.1, jit_compile=True), x, y, compiled=True,
                                   epochs=2, batch_size=32)
    # Everything but the random ops and some shape plumbing runs compiled, the
    # embedding lookup and its gradient (GatherV2, UnsortedSegmentSum) included.
    assert share.op_share > 0.95 and share.flop_share > 0.99, share
    assert not {key for key in share.left_out if key.startswith(("GatherV2", "Unsorted"))}
    assert len(losses) == len(plain_losses) == 6
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-4)
    for got, want in zip(weights, plain_weights):
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4)
