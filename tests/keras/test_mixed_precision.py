"""Keras mixed precision trains compiled: float16 (with its loss-scale optimizer) and
bfloat16 compute under `tl.enable()` against the same model, seeds and data under plain
TF (`jit_compile=False`: TF's own kernels, the oracle)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tfxla_lite as tl
from tfxla_lite import coverage


def _train(compiled: bool, policy: str) -> tuple[list[float], coverage.FunctionCoverage]:
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10),
                                  keras.layers.Activation("softmax", dtype="float32")])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=compiled,
                      loss="sparse_categorical_crossentropy")
        rng = np.random.default_rng(0)
        x = rng.normal(size=(128, 32)).astype(np.float32)
        y = rng.integers(0, 10, 128)
        if compiled:
            tl.enable()
        with coverage.record() as recorded:
            history = model.fit(x, y, epochs=3, batch_size=32, verbose=0, shuffle=False)
    finally:
        tl.disable()
        keras.mixed_precision.set_global_policy("float32")
    return history.history["loss"], coverage.total(recorded)


# bf16 keeps 8 bits: an op rounded once more or less moves a loss by about 1e-4.
@pytest.mark.parametrize("policy, rtol", [("mixed_float16", 1e-5), ("mixed_bfloat16", 1e-3)])
def test_mixed_precision_training_matches_tf(policy: str, rtol: float) -> None:
    plain, _ = _train(False, policy)
    losses, share = _train(True, policy)
    assert share.op_share > 0.9 and share.flop_share > 0.99, share
    np.testing.assert_allclose(losses, plain, rtol=rtol)
    assert losses[-1] < losses[0]
