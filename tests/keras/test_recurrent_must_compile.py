"""Keras recurrent training steps under `model.compile(jit_compile=True)` with an unknown
batch dimension (`fit` with a last partial batch): the forward and gradient While loops,
their TensorLists and the optimizer compile as one launch per step, once per batch
size (clustering/rules_control_flow.py defers the loops' list shapes to each concrete
batch; tfxla_lite/dynamic.py compiles them then). Losses and weights must be plain TF's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
from keras_helpers import StepLaunches, fit_recording

import tfxla_lite as tl

BATCH = 8
SAMPLES = 2 * BATCH + 3  # each epoch ends with a batch of 3
STEPS, VOCABULARY, CLASSES = 5, 20, 4


def _model(layers: Callable[[], list[Any]]) -> Callable[[], keras.Model]:
    def build() -> keras.Model:
        return keras.Sequential([keras.Input((STEPS,), dtype="int32"),
                                 keras.layers.Embedding(VOCABULARY, 8), *layers(),
                                 keras.layers.Dense(CLASSES)])

    return build


MODELS: dict[str, Callable[[], keras.Model]] = {
    "lstm": _model(lambda: [keras.layers.LSTM(16)]),
    "gru": _model(lambda: [keras.layers.GRU(16)]),
    "stacked_lstm": _model(lambda: [keras.layers.LSTM(12, return_sequences=True),
                                    keras.layers.LSTM(8)]),
    "bidirectional_lstm": _model(lambda: [keras.layers.Bidirectional(keras.layers.LSTM(8))]),
}


def _fit(name: str, compiled: bool) -> tuple[StepLaunches, list[np.ndarray], list[Any]]:
    """Two epochs of `name` from seed 0 (plain TF when not `compiled`): the steps, the
    final weights and the programs tfxla-lite built."""
    keras.utils.set_random_seed(0)
    model = MODELS[name]()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=compiled,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(1)
    x = rng.integers(0, VOCABULARY, (SAMPLES, STEPS)).astype(np.int32)
    y = rng.integers(0, CLASSES, SAMPLES)
    return fit_recording(model, x, y, compiled, BATCH)


@pytest.mark.parametrize("name", ["lstm", "gru",
                                  pytest.param("stacked_lstm", marks=pytest.mark.slow),
                                  pytest.param("bidirectional_lstm", marks=pytest.mark.slow)])
def test_recurrent_step_is_one_launch_with_plain_tf_losses(name: str) -> None:
    ours, weights, programs = _fit(name, True)
    plain, plain_weights, _ = _fit(name, False)
    assert len(ours.losses) == len(plain.losses) == 6  # 3 steps an epoch, the last of 3
    np.testing.assert_allclose(ours.losses, plain.losses, rtol=0, atol=1e-5)
    for got, want in zip(weights, plain_weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert programs and all(p.report.jit_compile_fallback is None for p in programs)
    assert ours.launches == [1] * len(ours.launches)
    # One executable per batch size: the full batches and the partial one.
    shapes = [s.name for p in programs for d in p.all_dynamic_clusters()
              for s in d.specializations]
    assert len(shapes) == 2, shapes


def test_each_loop_function_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Finding a loop's list shapes asks what the loops feeding it push; asking the loop
    # being built again rebuilt it once per list argument, recursively (an LSTM step's
    # forward cond and body were built 302 and 192 times, its first call 3.5x slower).
    import tensorflow as tf

    from tfxla_lite.clustering import body_graphs

    built: dict[str, int] = {}
    function_graph = body_graphs.function_graph

    def counting(library: Any, call: Any) -> Any:
        built[call.function] = built.get(call.function, 0) + 1
        return function_graph(library, call)

    monkeypatch.setattr(body_graphs, "function_graph", counting)
    model = keras.Sequential([keras.Input((STEPS, 3)), keras.layers.LSTM(8),
                              keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)

    # The caches off: a rewrite-cache hit would skip marking.
    @tl.function(jit_compile=True, options=tl.Options(cache="off"))
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    step(tf.ones((4, STEPS, 3)), tf.ones((4, 2)))
    assert built and max(built.values()) == 1, built
