"""The workloads of the benchmark suite: each a Python function of tensors plus its inputs.

A workload is built fresh by `make()` (models and variables included), so that a
subprocess measuring first-call time builds exactly what the main run measured.
Every variant (tf.function, TF's XLA, tfxla-lite) wraps the same Python function;
training steps update their variables with plain SGD inside the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from tfxla_lite.examples import EXAMPLES
from tfxla_lite.flags import get_options
from tfxla_lite.options import Options


def measured_options(**changes: object) -> Options:
    """The process's options with `strict_jit_compile`: a `jit_compile=True` trace that
    tfxla-lite cannot compile whole raises, where it would otherwise run on TF's XLA and
    be timed as tfxla-lite's."""
    return get_options().with_changes(strict_jit_compile=True, **changes)


# Bytes moved from which a bandwidth-bound workload is judged against DRAM bandwidth.
MEMORY_BOUND_BYTES = 32 << 20

Built = tuple[Callable[..., object], list[tf.Tensor]]


@dataclass(frozen=True)
class Workload:
    name: str
    # "memory" (bandwidth-bound: at least MEMORY_BOUND_BYTES, beyond the caches), "cached"
    # (elementwise or row work that fits in the caches), "compute", "train" or "latency"
    kind: str
    description: str
    make: Callable[[], Built]
    bytes: float = 0.0  # minimum bytes read and written per call (memory-bound)
    flops: float = 0.0  # per call (compute-bound, training)


def _tensors(shapes: list[tuple[int, ...]], seed: int = 0) -> list[tf.Tensor]:
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]


def layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor) -> tf.Tensor:
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    variance = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + 1e-5) * gamma + beta


def softmax(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.softmax(x, axis=-1)


def _seed(name: str, quick: bool) -> Workload:
    example = EXAMPLES[name]
    if quick:
        example = example.small()
    shapes = [tuple(s) for s in example.shapes]
    kind = "compute" if not example.bytes else _memory_kind(example.bytes)
    return Workload(name, kind, example.description if not quick else f"{name} (test sizes)",
                    lambda: (example.fn, _tensors(shapes)),
                    bytes=example.bytes if not quick else 0.0,
                    flops=example.flops if not quick else 0.0)


def _memory_kind(moved: float) -> str:
    return "memory" if moved >= MEMORY_BOUND_BYTES else "cached"


def _row_op(name: str, fn: Callable, rows: int, cols: int, with_affine: bool) -> Workload:
    shapes = [(rows, cols)] + ([(cols,), (cols,)] if with_affine else [])
    moved = 4 * (2 * rows * cols + (2 * cols if with_affine else 0))
    return Workload(f"{name}_{rows}x{cols}", _memory_kind(moved),
                    f"{name} over {rows}x{cols}, last axis", lambda: (fn, _tensors(shapes)),
                    bytes=moved)


def _dense_model(sizes: list[int]) -> tf.keras.Model:
    import keras

    layers = [keras.layers.Dense(n, activation="relu") for n in sizes[1:-1]]
    model = keras.Sequential([keras.Input((sizes[0],)), *layers, keras.layers.Dense(sizes[-1])])
    return model


def _sgd_step(model: tf.keras.Model, loss_fn: Callable, learning_rate: float = 1e-3
              ) -> Callable[..., tf.Tensor]:
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        for variable, grad in zip(model.trainable_variables, grads):
            variable.assign_sub(learning_rate * grad)
        return loss
    return step


def adam_step(model: tf.keras.Model, loss_fn: Callable) -> Callable[..., tf.Tensor]:
    """A Keras user's training step: the loss under a tape, Adam's `apply_gradients`."""
    import keras

    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)  # its slots exist before any trace

    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step


def _mse(y: tf.Tensor, prediction: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.square(prediction - y))


def _mlp_train(batch: int, sizes: list[int]) -> Workload:
    def make() -> Built:
        tf.keras.utils.set_random_seed(0)
        model = _dense_model(sizes)
        x, y = _tensors([(batch, sizes[0]), (batch, sizes[-1])], seed=1)
        return _sgd_step(model, _mse), [x, y]

    dense = sum(a * b for a, b in zip(sizes, sizes[1:]))
    return Workload(f"mlp_train_b{batch}", "train",
                    f"Keras MLP {'-'.join(map(str, sizes))} train step (GradientTape, SGD), "
                    f"batch {batch}", make, flops=6.0 * batch * dense)


def _mlp_inference(batch: int, sizes: list[int]) -> Workload:
    def make() -> Built:
        tf.keras.utils.set_random_seed(0)
        model = _dense_model(sizes)
        (x,) = _tensors([(batch, sizes[0])], seed=2)
        return (lambda x: model(x, training=False)), [x]

    dense = sum(a * b for a, b in zip(sizes, sizes[1:]))
    kind = "latency" if batch == 1 else "compute"
    return Workload(f"mlp_infer_b{batch}", kind,
                    f"Keras MLP {'-'.join(map(str, sizes))} inference, batch {batch}", make,
                    flops=2.0 * batch * dense)


def _transformer_train(batch: int, sequence: int, features: int, heads: int) -> Workload:
    def make() -> Built:
        import keras

        tf.keras.utils.set_random_seed(0)
        inputs = keras.Input((sequence, features))
        attention = keras.layers.MultiHeadAttention(heads, features // heads)(inputs, inputs)
        h = keras.layers.LayerNormalization()(inputs + attention)
        ffn = keras.layers.Dense(4 * features, activation="relu")(h)
        out = keras.layers.LayerNormalization()(h + keras.layers.Dense(features)(ffn))
        model = keras.Model(inputs, out)
        x, y = _tensors([(batch, sequence, features)] * 2, seed=3)
        return _sgd_step(model, _mse), [x, y]

    tokens = batch * sequence
    dense = 4 * features * features + 8 * features * features
    attention = 2 * 2 * batch * sequence * sequence * features
    return Workload(f"transformer_train_b{batch}", "train",
                    f"Transformer encoder layer ({heads} heads, d={features}, seq {sequence}) "
                    f"train step, batch {batch}", make,
                    flops=3.0 * (2.0 * tokens * dense + attention))


def transformer_encoder_adam(batch: int, sequence: int, vocabulary: int, features: int,
                              heads: int, blocks: int) -> Workload:
    """A model-zoo step (issue 19): token embedding, `blocks` encoder blocks (attention,
    residual, LayerNorm, gelu feed-forward), a pooled regression head, Adam."""
    def make() -> Built:
        import keras

        tf.keras.utils.set_random_seed(0)
        inputs = keras.Input((sequence,), dtype="int32")
        h = keras.layers.Embedding(vocabulary, features)(inputs)
        for _ in range(blocks):
            attention = keras.layers.MultiHeadAttention(heads, features // heads)(h, h)
            h = keras.layers.LayerNormalization()(h + attention)
            ffn = keras.layers.Dense(4 * features, activation="gelu")(h)
            h = keras.layers.LayerNormalization()(h + keras.layers.Dense(features)(ffn))
        pooled = keras.layers.GlobalAveragePooling1D()(h)
        model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
        rng = np.random.default_rng(4)
        x = tf.constant(rng.integers(0, vocabulary, (batch, sequence)), tf.int32)
        (y,) = _tensors([(batch, 1)], seed=5)
        return adam_step(model, _mse), [x, y]

    tokens = batch * sequence
    dense = 4 * features * features + 8 * features * features
    attention = 2 * 2 * batch * sequence * sequence * features
    return Workload(f"transformer{blocks}_adam_b{batch}", "train",
                    f"Transformer encoder, {blocks} blocks (embedding {vocabulary}x{features}, "
                    f"{heads} heads, gelu, seq {sequence}), Adam train step, batch {batch}",
                    make, flops=3.0 * blocks * (2.0 * tokens * dense + attention))


def workloads(quick: bool = False) -> list[Workload]:
    """The suite: seed examples, layer norm and softmax at several sizes, training
    steps, and inference at batch 1 and 64. `quick`: test sizes, a few workloads."""
    if quick:
        return [
            _seed("reduce_sum_fma", quick=True),
            _row_op("layer_norm", layer_norm, 64, 128, True),
            _row_op("softmax", softmax, 64, 128, False),
            _mlp_train(8, [32, 64, 8]),
            _transformer_train(2, 8, 16, 2),
            _mlp_inference(1, [32, 64, 8]),
        ]
    suite = [_seed(name, quick=False) for name in EXAMPLES]
    for rows, cols in [(256, 256), (1024, 1024), (4096, 1024)]:
        suite.append(_row_op("layer_norm", layer_norm, rows, cols, True))
        suite.append(_row_op("softmax", softmax, rows, cols, False))
    suite += [
        _mlp_train(128, [784, 512, 512, 10]),
        _transformer_train(8, 64, 128, 4),
        transformer_encoder_adam(16, 64, 1000, 64, 4, 2),
        _mlp_inference(1, [784, 512, 512, 10]),
        _mlp_inference(64, [784, 512, 512, 10]),
    ]
    return suite


def by_name(names: list[str], quick: bool) -> list[Workload]:
    table = {w.name: w for w in workloads(quick)}
    return [table[n] for n in names]


__all__ = ["Workload", "adam_step", "by_name", "layer_norm", "measured_options", "softmax",
           "transformer_encoder_adam", "workloads"]
