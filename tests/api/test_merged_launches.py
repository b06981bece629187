"""Independent clusters run as one launch: a Keras Adam step's per-variable updates."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
from api_helpers import keras_adam_step

import tfxla_lite as tl
from tfxla_lite.options import Options
from tfxla_lite.rewrite import LAUNCH_OP_TYPES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerances import assert_close  # noqa: E402 - tests/tolerances.py, by path


def _launches(f: tl.Function, *args: tf.Tensor) -> int:
    graph = f.get_concrete_function(*args).graph
    return sum(op.type in LAUNCH_OP_TYPES for op in graph.get_operations())


def _train(options: Options | None) -> tuple[int, list[np.ndarray], list[np.ndarray]]:
    model, step = keras_adam_step(12, 16, "relu", 3)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((8, 12)), tf.float32)
    y = tf.constant(rng.standard_normal((8, 3)), tf.float32)
    f = tf.function(step) if options is None else tl.function(step, options=options)
    launches = 0 if options is None else _launches(f, x, y)
    losses = [f(x, y).numpy() for _ in range(3)]
    return launches, losses, [v.numpy() for v in model.trainable_variables]


def test_adam_updates_of_all_variables_share_one_launch() -> None:
    merged, losses, weights = _train(Options(min_cluster_size=1))
    separate, separate_losses, _ = _train(Options(min_cluster_size=1,
                                                  merge_independent_clusters=False))
    _, tf_losses, tf_weights = _train(None)
    # The forward and backward pass, every slot's and every variable's update, the reads
    # and writes of the variables included (clustering/rules_variables.py): one launch,
    # whose ops the variables' reads and writes connect even without merging.
    assert merged == 1
    assert separate == 1
    assert_close(np.array(losses), np.array(tf_losses), "model gradient")
    assert_close(np.array(separate_losses), np.array(tf_losses), "model gradient")
    for ours, theirs in zip(weights, tf_weights):
        assert_close(ours, theirs, "model gradient")
