"""Helpers shared by the tests in tests/api: a small Keras model and its Adam step."""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf


def keras_adam_step(inputs: int, hidden: int, activation: str, outputs: int
                    ) -> tuple[keras.Model, Callable[[tf.Tensor, tf.Tensor], tf.Tensor]]:
    """A two-layer regression model from seed 0 and its training step (mean squared
    error, Adam at 1e-2, the optimizer's slots built): step(x, y) updates the
    variables and returns the loss."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((inputs,)),
                              keras.layers.Dense(hidden, activation),
                              keras.layers.Dense(outputs)])
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)

    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return model, step
