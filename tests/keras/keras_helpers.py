"""Models, data and a training loop shared by the Keras acceptance tests: each test
trains the same model from the same seed with and without tfxla-lite and compares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

import tfxla_lite as tl
from tfxla_lite import api, coverage
from tfxla_lite.runtime import loader


class BatchLosses(keras.callbacks.Callback):
    """The loss after every training step, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.losses.append(float(logs["loss"]))


class StepLaunches(keras.callbacks.Callback):
    """Each training step's loss and the launch ops it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.launches: list[int] = []
        self._before = 0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._before = loader.launch_timing().launches

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.launches.append(loader.launch_timing().launches - self._before)
        self.losses.append(float(logs["loss"]))


def fit_recording(model: keras.Model, x: Any, y: Any, compiled: bool, batch_size: int
                  ) -> tuple[StepLaunches, list[np.ndarray], list[Any]]:
    """Two epochs of the compiled `model` (under `tl.enable()` when `compiled`), unshuffled:
    each step's loss and launches, the final weights and the programs tfxla-lite built."""
    steps, programs = StepLaunches(), []
    build = api.build_program

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        programs.append(build(*args, **kwargs))
        return programs[-1]

    api.build_program = recording_build
    if compiled:
        tl.enable()
    try:
        model.fit(x, y, epochs=2, batch_size=batch_size, shuffle=False, verbose=0,
                  callbacks=[steps])
    finally:
        tl.disable()
        api.build_program = build
    return steps, [w.numpy() for w in model.weights], programs


def train(build: Callable[[], keras.Model], x: Any, y: Any, compiled: bool, epochs: int,
          batch_size: int) -> tuple[list[float], list[np.ndarray], coverage.FunctionCoverage]:
    """Fit `build()` from seed 0 (under `tl.enable()` when `compiled`): the per-step
    losses, the final weights and the share of ops that ran compiled."""
    keras.utils.set_random_seed(0)
    model = build()
    losses = BatchLosses()
    if compiled:
        tl.enable()
    try:
        with coverage.record() as recorded:
            model.fit(x, y, epochs=epochs, batch_size=batch_size, shuffle=False, verbose=0,
                      callbacks=[losses])
    finally:
        tl.disable()
    return losses.losses, [w.numpy() for w in model.weights], coverage.total(recorded)


def transformer(dropout: float, jit_compile: bool = True) -> Callable[[], keras.Model]:
    """A builder of one transformer block over 16 tokens of a 50-word vocabulary, with 5
    classes, its attention and feed-forward outputs dropped out at rate `dropout`."""

    def build() -> keras.Model:
        tokens = keras.Input((16,), dtype="int32")
        x = keras.layers.Embedding(50, 32)(tokens)
        attention = keras.layers.MultiHeadAttention(2, 16, dropout=dropout)(x, x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dropout(dropout)(attention))
        hidden = keras.layers.Dense(64, activation=keras.activations.gelu)(x)
        hidden = keras.layers.Dropout(dropout)(keras.layers.Dense(32)(hidden))
        x = keras.layers.LayerNormalization()(x + hidden)
        logits = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling1D()(x))
        model = keras.Model(tokens, logits)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=jit_compile,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    return build


def tokens() -> tuple[np.ndarray, np.ndarray]:
    """96 sequences of `transformer`'s tokens and their labels."""
    rng = np.random.default_rng(1)
    return rng.integers(0, 50, (96, 16)).astype(np.int32), rng.integers(0, 5, 96)
