"""Keras `fit` with `model.compile(jit_compile=True)` and an unknown batch dimension (a
last partial batch): Keras's iterator function calls the step with the batch dimension
unknown, so tfxla-lite compiles that trace with dynamic clusters. Per-step losses and
the weights must be plain TF's for every model of the zoo's kinds (MLP with BatchNorm and
Dropout, Transformer, LSTM, GRU, the small CNN); the launches per step and the
must-compile fallback are what issue 22 wants to reach: one launch and none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
from keras_helpers import StepLaunches, fit_recording, transformer

BATCH = 8
SAMPLES = 3 * BATCH + 5  # the last batch of each epoch has 5


def _mlp() -> keras.Model:
    return keras.Sequential([keras.Input((20,)), keras.layers.Dense(32),
                             keras.layers.BatchNormalization(), keras.layers.ReLU(),
                             keras.layers.Dropout(0.2), keras.layers.Dense(4)])


def _recurrent(kind: str) -> Callable[[], keras.Model]:
    def build() -> keras.Model:
        return keras.Sequential([keras.Input((6,), dtype="int32"),
                                 keras.layers.Embedding(20, 8), getattr(keras.layers, kind)(8),
                                 keras.layers.Dense(4)])

    return build


def _small_cnn() -> keras.Model:
    layers: list[Any] = [keras.Input((12, 12, 1))]
    for n in (4, 8):
        layers += [keras.layers.Conv2D(n, 3, padding="same"),
                   keras.layers.BatchNormalization(), keras.layers.ReLU(),
                   keras.layers.MaxPooling2D()]
    return keras.Sequential(layers + [keras.layers.Flatten(), keras.layers.Dense(4)])


def _data(name: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if name == "transformer":
        return (rng.integers(0, 50, (SAMPLES, 16)).astype(np.int32),
                rng.integers(0, 5, SAMPLES))
    if name in ("lstm", "gru"):
        return rng.integers(0, 20, (SAMPLES, 6)).astype(np.int32), rng.integers(0, 4, SAMPLES)
    shape = (SAMPLES, 12, 12, 1) if name == "small_cnn" else (SAMPLES, 20)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, 4, SAMPLES)


MODELS: dict[str, Callable[[], keras.Model]] = {
    "mlp": _mlp, "transformer": lambda: transformer(0.0)(), "lstm": _recurrent("LSTM"),
    "gru": _recurrent("GRU"), "small_cnn": _small_cnn}


def _fit(name: str, compiled: bool) -> tuple[StepLaunches, list[np.ndarray], list[Any]]:
    """Two epochs of `name` from seed 0; plain TF (TF's kernels) when not `compiled`.
    Returns the steps, the final weights and the programs tfxla-lite built."""
    keras.utils.set_random_seed(0)
    model = MODELS[name]()
    # Adam's epsilon of 1e-3: an element whose gradient is a rounding error (a bias before
    # BatchNorm) would otherwise move by up to the learning rate on its sign.
    model.compile(optimizer=keras.optimizers.Adam(1e-2, epsilon=1e-3), jit_compile=compiled,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data(name)
    return fit_recording(model, x, y, compiled, BATCH)


_RESULTS: dict[str, Any] = {}


def _compiled_and_plain(name: str) -> tuple[Any, Any]:
    if name not in _RESULTS:
        _RESULTS[name] = (_fit(name, True), _fit(name, False))
    return _RESULTS[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_partial_last_batch_trains_as_plain_tf(name: str) -> None:
    (ours, weights, programs), (plain, plain_weights, _) = _compiled_and_plain(name)
    assert len(ours.losses) == len(plain.losses) == 8
    assert programs, "tfxla-lite compiled the step"
    np.testing.assert_allclose(ours.losses, plain.losses, rtol=0, atol=1e-5)
    for got, want in zip(weights, plain_weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    fallbacks = [p.report.jit_compile_fallback for p in programs]
    print(f"\n{name}: launches per step {ours.launches}; must-compile fallback: "
          f"{[f.target if f else None for f in fallbacks]}")


# What each model still needs for one launch per step with an unknown batch dimension
# (the MLP and the Transformer have it: their variables compile inside the cluster
# compiled per batch size, with the batched MatMul gradient's Sum of unknown rank; the
# small CNN since must-compile compiles every convolution; the LSTM and GRU with their
# loops lowered whole for each batch size: tests/keras/test_recurrent_must_compile.py).
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "transformer", "small_cnn", "lstm", "gru"])
def test_partial_last_batch_is_one_launch_per_step(name: str) -> None:
    (ours, _, programs), _ = _compiled_and_plain(name)
    assert all(p.report.jit_compile_fallback is None for p in programs)
    assert ours.launches == [1] * len(ours.launches)
