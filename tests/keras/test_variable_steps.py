"""Keras training steps as ONE launch op per step (issue 22): the variables' reads, the
optimizer's updates and the metrics' writes compile with the math
(clustering/rules_variables.py), and the per-step losses stay within 1e-5 of plain TF."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_helpers import BatchLosses, tokens, transformer

import tfxla_lite as tl
from tfxla_lite.rewrite import LAUNCH_OP_TYPES
from tfxla_lite.runtime import loader

OPTIMIZERS = {"adam": lambda: keras.optimizers.Adam(1e-2),
              "sgd": lambda: keras.optimizers.SGD(1e-2, momentum=0.9)}


def _launch_nodes(function: Any, *args: Any) -> int:
    graph_def = function.get_concrete_function(*args).graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return sum(node.op in LAUNCH_OP_TYPES for node in nodes)


def _mlp() -> keras.Model:
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.LayerNormalization(), keras.layers.Dense(3)])


def _mse(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.square(outputs - labels))


def _cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                                       from_logits=True))


MODELS = {"mlp": (_mlp, _mse), "transformer": (lambda: transformer(0.0)(), _cross_entropy)}


def _data(name: str) -> tuple[tf.Tensor, tf.Tensor]:
    if name == "transformer":
        x, y = tokens()
        return tf.constant(x[:16]), tf.constant(y[:16])
    rng = np.random.default_rng(2)
    return (tf.constant(rng.standard_normal((16, 12)), tf.float32),
            tf.constant(rng.standard_normal((16, 3)), tf.float32))


def _custom_step(name: str, optimizer: str) -> tuple[Callable[..., Any], keras.Model]:
    keras.utils.set_random_seed(0)
    build, loss_of = MODELS[name]
    model = build()
    opt = OPTIMIZERS[optimizer]()
    opt.build(model.trainable_variables)

    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_of(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return step, model


@pytest.mark.parametrize("jit_compile", [True, None], ids=["jit_compile", "auto"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("name", list(MODELS))
def test_custom_step_is_one_launch_with_tf_losses(name: str, optimizer: str,
                                                  jit_compile) -> None:
    x, y = _data(name)
    plain, plain_model = _custom_step(name, optimizer)
    step, model = _custom_step(name, optimizer)
    plain = tf.function(plain)
    compiled = tl.function(step, jit_compile=jit_compile)
    assert _launch_nodes(compiled, x, y) == 1
    for n in range(4):
        expected = plain(x, y).numpy()
        before = loader.launch_timing().launches
        loss = compiled(x, y).numpy()
        assert loader.launch_timing().launches - before == 1, f"step {n}"
        assert abs(loss - expected) <= 1e-5, (n, loss, expected)
    for ours, theirs in zip(model.weights, plain_model.weights):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-5)


def _fit(build: Callable[[], keras.Model], compiled: bool) -> tuple[list[float], int]:
    keras.utils.set_random_seed(0)
    model = build()
    losses = BatchLosses()
    x, y = tokens()
    if compiled:
        tl.enable()
    try:
        before = loader.launch_timing().launches
        model.fit(x, y, epochs=1, batch_size=16, shuffle=False, verbose=0, callbacks=[losses])
        launches = loader.launch_timing().launches - before
    finally:
        tl.disable()
    return losses.losses, launches


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_keras_transformer_fit_runs_one_launch_per_step(optimizer: str) -> None:
    def build() -> keras.Model:
        model = transformer(0.0)()
        model.compile(optimizer=OPTIMIZERS[optimizer](), jit_compile=True,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    plain, _ = _fit(build, compiled=False)
    ours, launches = _fit(build, compiled=True)
    assert len(ours) == len(plain) == 6
    assert launches == len(ours), "one launch op per step"
    np.testing.assert_allclose(ours, plain, rtol=0, atol=1e-5)
