"""One task of a ParameterServerStrategy cluster: chief, worker or ps (TF_CONFIG says).

Run by tests/distribute/test_parameter_server.py: `python ps_task.py OUT_DIR`.
Workers and the parameter server start a TF server (tfxla-lite's op library loaded
first, so that a launch op sent to them could run) and serve until killed; the chief
builds the strategy and a `ClusterCoordinator`, schedules STEPS training steps of a
small model whose variables live on the PS, with a `tf.function` step, then with
`tl.function` (jit_compile=True, auto-clustering, strict_jit_compile), and writes
OUT_DIR/chief.json: each one's losses and final weights, or its error.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.runtime import loader

STEPS = 3


def serve(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> None:
    loader.load_library()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    server.join()


def train(strategy: Any, coordinator: Any, function_of: Any) -> dict:
    """STEPS steps scheduled one at a time (their order is then the reference's) of a
    model whose variables live on the PS: losses and weights, or the error."""
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(8, 4)).astype(np.float32))
    y = tf.constant(rng.normal(size=(8, 1)).astype(np.float32))
    with strategy.scope():
        w = tf.Variable(tf.fill([4, 1], 0.1), name="w")
        b = tf.Variable(tf.zeros([1]), name="b")

    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.tanh(x @ w + b) - y))
        dw, db = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * dw)
        b.assign_sub(0.1 * db)
        return loss

    function = function_of(step)
    try:
        losses = []
        for _ in range(STEPS):
            remote = coordinator.schedule(function)
            coordinator.join()
            losses.append(float(remote.fetch()))
    except Exception as error:  # noqa: BLE001 - the test reads it
        return {"error": f"{type(error).__name__}: {error}"}
    note = function.explain().note if hasattr(function, "explain") else None
    return {"losses": losses, "weights": [w.numpy().tolist(), b.numpy().tolist()],
            "note": note}


def chief(resolver: Any, out: Path) -> None:
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    result = {
        "tf": train(strategy, coordinator, tf.function),
        "tfxla_lite": train(strategy, coordinator, tl.function(jit_compile=True)),
        "tfxla_lite_auto": train(strategy, coordinator, tl.function),
        "strict": train(strategy, coordinator, tl.function(
            jit_compile=True, options=tl.Options(strict_jit_compile=True))),
    }
    out.joinpath("chief.json").write_text(json.dumps(result))


def main(out_dir: str) -> None:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        serve(resolver)
    else:
        chief(resolver, Path(out_dir))
    # The coordinator's threads may keep the process alive: the result is written.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
